"""The flat forest type: depths and branches computed from parents alone (no reconstruction)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from clawgym_env.trajectory.forest import ForestStats, TrajectoryForest


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-1, 10**6), min_size=1, max_size=200))
def test_depths_and_branches_from_any_topological_parents(raw: list[int]) -> None:
    parents = np.asarray([-1 if r < 0 or i == 0 else r % i for i, r in enumerate(raw)], np.int64)
    child_count = np.bincount(parents[parents >= 0], minlength=len(parents))
    forest = TrajectoryForest(
        rollout_id="r", tokens=np.arange(len(parents)), parents=parents, leaves=np.flatnonzero(child_count == 0)
    )
    expected = np.zeros(len(parents), np.int64)
    for i, p in enumerate(parents.tolist()):
        expected[i] = expected[p] + 1 if p >= 0 else 0
    assert np.array_equal(forest.depths(), expected)
    for leaf, path in zip(forest.leaves.tolist(), forest.branches(), strict=True):
        walk, node = [], leaf
        while node >= 0:
            walk.append(node)
            node = int(parents[node])
        assert path.tolist() == walk[::-1] == forest.branch(leaf).tolist()


def test_stats_add_up() -> None:
    total = ForestStats(calls=2, dead_leaves_removed=1) + ForestStats(calls=3, empty_rollouts=1)
    assert total.calls == 5 and total.dead_leaves_removed == 1 and total.empty_rollouts == 1
