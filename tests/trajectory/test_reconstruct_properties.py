"""Property-based tests: random call sets with shared prefixes, retries, failures, restarts and subagents."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawgym_env.records import ModelCall
from clawgym_env.specs import ForestOptions
from clawgym_env.trajectory.forest import TrajectoryForest
from clawgym_env.trajectory.reconstruct import build_forest
from clawgym_env.trajectory.synthetic_recordings import synthetic_rollout


def children_map(forest: TrajectoryForest) -> dict[tuple[int, int], int]:
    """(parent, token) -> node; asserts the trie property (no two siblings with the same token)."""
    keys = list(zip(forest.parents.tolist(), forest.tokens.tolist(), strict=True))
    assert len(set(keys)) == len(keys), "two siblings carry the same token: histories did not merge"
    return {k: i for i, k in enumerate(keys)}


def find_path(children: dict[tuple[int, int], int], seq: list[int]) -> list[int] | None:
    node, path = -1, []
    for tok in seq:
        node = children.get((node, tok), None)  # type: ignore[arg-type]
        if node is None:
            return None
        path.append(node)
    return path


rollouts = st.builds(
    lambda seed, mode, turns, retry, fail, compaction, subagent, gaps: synthetic_rollout(
        seed,
        mode=mode,
        turns=turns,
        retry_prob=retry,
        fail_prob=fail,
        compaction_at=compaction if compaction is not None and compaction < turns else None,
        subagent_at=subagent if subagent is not None and subagent < turns else None,
        gaps=gaps,
        system_tokens=10,
        tools_tokens=8,
        gen_tokens=(20, 40),
        tool_tokens=(10, 40),
    ),
    seed=st.integers(0, 2**31),
    mode=st.sampled_from(["append", "openclaw_chat"]),
    turns=st.integers(1, 7),
    retry=st.sampled_from([0.0, 0.3, 0.7]),
    fail=st.sampled_from([0.0, 0.3]),
    compaction=st.one_of(st.none(), st.integers(2, 6)),
    subagent=st.one_of(st.none(), st.integers(0, 6)),
    gaps=st.booleans(),
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def shuffled(calls: list[ModelCall], seed: int) -> list[ModelCall]:
    out = list(calls)
    random.Random(seed).shuffle(out)
    return out


@SETTINGS
@given(rollout=rollouts, order_seed=st.integers(0, 1000))
def test_surviving_generations_appear_once_with_their_logprobs(rollout, order_seed) -> None:
    forest = build_forest(shuffled(rollout.calls, order_seed), rollout_id=rollout.rollout_id)
    assert forest.ok
    children = children_map(forest)
    surviving = [c for c in rollout.calls if rollout.expected[c.call_index] == "main"]
    for call in surviving:
        path = find_path(children, call.full_ids)
        assert path is not None, f"call {call.call_index}'s history is not a path of the forest"
        gen_nodes = np.asarray(path[len(call.prompt_ids) :])
        assert forest.generated[gen_nodes].all()
        np.testing.assert_array_equal(forest.logprobs[gen_nodes], np.asarray(call.logprobs, np.float32))
        assert (forest.call_index[gen_nodes] == call.call_index).all()
        assert (forest.policy_versions[gen_nodes] == call.policy_version).all()
    # exactly once: no generated node beyond those of the surviving calls
    assert int(forest.generated.sum()) == sum(len(c.generated_ids) for c in surviving)
    assert np.isnan(forest.logprobs[~forest.generated]).all()
    assert (forest.policy_versions[~forest.generated] == -1).all()


@SETTINGS
@given(rollout=rollouts)
def test_every_branch_is_the_history_of_a_surviving_call(rollout) -> None:
    forest = build_forest(rollout.calls, rollout_id=rollout.rollout_id)
    surviving = {tuple(c.full_ids) for c in rollout.calls if rollout.expected[c.call_index] == "main"}
    branches = {tuple(b) for b in forest.branch_tokens()}
    assert branches <= surviving
    # every surviving history is a root-to-node path; those that end at a leaf are exactly the branches
    children = children_map(forest)
    for seq in surviving:
        assert find_path(children, list(seq)) is not None
    assert np.array_equal(forest.depths(), np.asarray([len(forest.branch(i)) - 1 for i in range(forest.num_tokens)]))
    assert (forest.parents < np.arange(forest.num_tokens)).all(), "nodes must be in topological order"


@SETTINGS
@given(rollout=rollouts)
def test_filters_remove_exactly_what_they_should(rollout) -> None:
    forest = build_forest(rollout.calls, rollout_id=rollout.rollout_id, options=ForestOptions(max_leaves=1000))
    decided = {}
    for rec in forest.metadata["calls"]:
        decided[rec["call_index"]] = "dead_leaf" if rec["dead_leaf"] and rec["role"] == "main" else rec["role"]
    assert decided == rollout.expected
    expected = list(rollout.expected.values())
    assert forest.stats.failed_calls == expected.count("failed")
    assert forest.stats.dead_leaves_removed == expected.count("dead_leaf")
    assert forest.stats.compaction_calls_set_aside == expected.count("compaction")
    assert forest.stats.subagent_calls_set_aside == expected.count("subagent")
    reasons = sorted(aux.metadata["auxiliary_reason"] for aux in forest.auxiliary)
    assert reasons == sorted(
        {"compaction": "compaction", "subagent": "subagent"}[r] for r in set(expected) & {"compaction", "subagent"}
    )
