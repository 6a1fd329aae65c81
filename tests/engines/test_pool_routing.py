"""`VLLMServerPool`'s sticky routing without servers: the server that served the longest recorded sequence a
prompt extends (`StickyRoutes`, a hash chain per block of ids), at any number of rollouts in flight
(benchmarks/pool_routing.py)."""

from __future__ import annotations

import random

import pytest

from clawgym_env.engines.sticky_routes import StickyRoutes
from clawgym_env.engines.vllm_server import VLLMServerPool

SYSTEM = list(range(1000, 1300))  # every rollout of a run starts with the same system prompt


@pytest.fixture(params=[1, 8, 64])
def routes(request) -> StickyRoutes[str]:
    """Block sizes: 1 (every id a block), 8, and the pool's 64 (sequences shorter than a block: all tail)."""
    return StickyRoutes(block=request.param)


def test_a_prompt_goes_to_the_server_holding_the_longest_sequence_it_extends(routes):
    turn1 = [*SYSTEM, 1, 2, 3, 4]
    turn2 = [*turn1, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    routes.record(turn1, "first")
    routes.record(turn2, "second")  # no lookup given: recorded beside turn1, not in its place
    routes.record([*SYSTEM, 9, 9, 9], "second")  # another rollout: shares only the system prompt
    assert routes.find([*turn1, 77]).found.server == "first"
    assert routes.find([*turn2, 77]).found.server == "second"  # extends both: the longer one wins
    assert routes.find(turn2).found.server == "second"  # the prompt may be exactly the sequence
    assert routes.find([*SYSTEM, 5, 5]).found is None  # a new rollout: the shared system prompt is not a match
    assert routes.find(turn1[:-1]).found is None  # shorter than every sequence
    assert routes.find([]).found is None


def test_a_sequence_whose_end_matches_but_whose_start_differs_is_not_taken(routes):
    """The same completion in another conversation (same last ids, same length) is not this prompt's context."""
    routes.record([*SYSTEM, 1, 2, 3, *range(50, 60)], "first")
    assert routes.find([*SYSTEM, 1, 2, 4, *range(50, 60), 99]).found is None
    assert routes.find([*SYSTEM, 1, 2, 3, *range(50, 60), 99]).found.server == "first"


def test_a_turn_replaces_the_sequence_it_extends(routes):
    """One entry per rollout: a next turn's sequence takes the place of the one its prompt extended."""
    turn1 = [*SYSTEM, 1, 2]
    routes.record(turn1, "a")
    prompt2 = [*turn1, 3, 4]
    match = routes.find(prompt2)
    routes.record([*prompt2, 5, 6], "a", match)
    assert len(routes) == 1
    assert routes.find([*prompt2, 5, 6, 7]).found.length == len(prompt2) + 2
    assert routes.find([*turn1, 9]).found is None  # the old turn is gone with its entry
    routes.record([*prompt2, 5, 6, 1], "a", match)  # a second call that extended the same one: nothing to drop
    assert len(routes) == 2


def test_the_least_recently_used_go_first_and_a_lost_server_is_forgotten():
    routes: StickyRoutes[str] = StickyRoutes(capacity=3, block=4)
    for i in range(3):
        routes.record([*SYSTEM, i], "a" if i < 2 else "b")
    assert routes.find([*SYSTEM, 0, 7]).found is not None  # used: now the newest
    routes.record([*SYSTEM, 3], "b")  # over capacity: the least recently used ([..., 1]) goes
    assert routes.find([*SYSTEM, 1, 7]).found is None and routes.find([*SYSTEM, 0, 7]).found is not None
    routes.forget_server("b")
    assert len(routes) == 1 and routes.find([*SYSTEM, 2, 7]).found is None


def test_random_sequences_agree_with_comparing_every_one_whole():
    rng = random.Random(3)
    routes: StickyRoutes[int] = StickyRoutes(block=16)
    recorded: list[tuple[list[int], int]] = []
    base = [rng.randrange(50) for _ in range(40)]
    for i in range(300):
        seq = base[: rng.randrange(41)] + [rng.randrange(3) for _ in range(rng.randrange(30))]
        routes.record(seq, i)
        recorded.append((seq, i))
    for _ in range(300):
        prompt = base[: rng.randrange(41)] + [rng.randrange(3) for _ in range(rng.randrange(40))]
        extended = [(len(s), i) for s, i in recorded if len(s) <= len(prompt) and prompt[: len(s)] == s]
        found = routes.find(prompt).found
        if not extended:
            assert found is None
        else:
            assert found is not None and found.length == max(extended)[0]


@pytest.mark.parametrize("rollouts", [64, 1000])
async def test_every_next_turn_finds_its_server_with_a_thousand_rollouts_in_flight(rollouts):
    """The pool's own routing (`_route`, then the record a finished call makes), rollouts taking turns on 2
    servers. The 256 latest sequences per server it kept before held no rollout's previous turn at 1,000
    rollouts: 0 of 3,000 next turns found their server."""
    rng = random.Random(0)
    pool = VLLMServerPool(["http://127.0.0.1:9", "http://127.0.0.1:10"])  # nothing listens: never called
    try:
        prompts = [SYSTEM + [rng.randrange(150_000) for _ in range(20)] for _ in range(rollouts)]
        owner: list[object] = [None] * rollouts
        kept = 0
        for turn in range(4):
            for r in range(rollouts):
                slot, match = await pool._route(prompts[r])
                kept += turn > 0 and match.found is not None and slot is owner[r]
                slot.served += 1  # as `_one_call` counts a call that went through
                owner[r] = slot
                completion = [rng.randrange(150_000) for _ in range(30)]
                pool.routes.record([*prompts[r], *completion], slot, match)
                prompts[r] = [*prompts[r], *completion, *(rng.randrange(150_000) for _ in range(15))]
        assert kept == pool.stats.routed_by_context == 3 * rollouts
        assert len(pool.routes) == rollouts  # one entry per rollout
        assert {s.served for s in pool.slots} == {2 * rollouts}  # new rollouts spread evenly
    finally:
        pool.close()


def test_the_routing_benchmark_prints_both_lookups(capsys):
    from benchmarks.pool_routing import main

    main(["--tokens", "400", "--system", "100", "--calls", "2", "--rollouts", "40"])
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if "µs per call" in line]
    assert len(rows) == 2 and "next turn" in rows[0] and "new rollout" in rows[1], out
    kept = [line for line in out if "next turns found their server" in line]
    assert len(kept) == 2 and "StickyRoutes" in kept[0] and "120/120" in kept[0], out
