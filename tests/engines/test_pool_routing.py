"""`VLLMServerPool`'s sticky routing without servers: the server that served the longest recorded sequence a
prompt extends, found by checking each recorded sequence's last ids first (benchmarks/pool_routing.py)."""

from __future__ import annotations

import pytest

from clawgym_env.engines.vllm_server import VLLMServerPool

SYSTEM = list(range(1000, 1300))  # every rollout of a run starts with the same system prompt


@pytest.fixture
def pool():
    pool = VLLMServerPool(["http://127.0.0.1:9", "http://127.0.0.1:10"])  # nothing listens: never called
    yield pool
    pool.close()


def test_a_prompt_goes_to_the_server_holding_the_longest_sequence_it_extends(pool):
    first, second = pool.slots
    turn1 = (*SYSTEM, 1, 2, 3, 4)
    turn2 = (*turn1, 5, 6, 7, 8, 9, 10, 11, 12, 13)
    first.recent.append(turn1)
    second.recent.append(turn2)
    second.recent.append((*SYSTEM, 9, 9, 9))  # another rollout: shares only the system prompt
    assert pool._sticky([*turn1, 77]) is first
    assert pool._sticky([*turn2, 77]) is second  # extends both: the longer one wins
    assert pool._sticky(list(turn2)) is second  # the prompt may be exactly the sequence
    assert pool._sticky([*SYSTEM, 5, 5]) is None  # a new rollout: the shared system prompt is not a match
    assert pool._sticky(list(turn1[:-1])) is None  # shorter than every sequence


def test_a_sequence_whose_last_ids_match_but_whose_start_differs_is_not_taken(pool):
    """The last ids are only the first check: a prompt holding them at that place but differing before (the
    same completion in another conversation) is compared whole and refused."""
    first, _ = pool.slots
    first.recent.append((*SYSTEM, 1, 2, 3, *range(50, 60)))
    assert pool._sticky([*SYSTEM, 1, 2, 4, *range(50, 60), 99]) is None
    assert pool._sticky([*SYSTEM, 1, 2, 3, *range(50, 60), 99]) is first


def test_sequences_shorter_than_the_checked_tail(pool):
    first, second = pool.slots
    first.recent.append((5,))
    second.recent.append((5, 6, 7))
    assert pool._sticky([5, 6, 7, 8]) is second
    assert pool._sticky([5, 9]) is first
    assert pool._sticky([6]) is None


def test_the_routing_benchmark_prints_both_lookups(capsys):
    from benchmarks.pool_routing import main

    main(["--tokens", "400", "--system", "100", "--calls", "2"])
    rows = [line for line in capsys.readouterr().out.splitlines() if "whole comparison" in line]
    assert len(rows) == 2 and "next turn" in rows[0] and "new rollout" in rows[1], rows
