"""GRPO advantages per Task–Harness pair, their broadcast, and the handling of unusable rollouts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainers.grpo import GRPOConfig, broadcast_advantage, grpo_advantages, grpo_micro_batches
from trainers.rollout_batch import RolloutBatch
from trainers.synthetic_batches import forest_from_paths


def test_groups_are_task_harness_pairs() -> None:
    # same task, two harnesses: each harness is normalised on its own
    rewards = [1.0, 0.0, 0.5, 0.5, 1.0, 0.0]
    tasks = ["t"] * 6
    harnesses = ["A", "A", "B", "B", "B", "B"]
    adv, signal, m = grpo_advantages(rewards, ["ok"] * 6, tasks, harnesses, normalize_std=False)
    assert adv[:2].tolist() == [0.5, -0.5]  # exact: 1 - 0.5 and 0 - 0.5 are exact in binary floating point
    assert np.allclose(adv[2:], [0.0, 0.0, 0.5, -0.5])  # float64 mean of four numbers: error ~1e-16, rtol 1e-5 default
    assert m["groups"] == 2 and m["groups_degenerate"] == 0
    assert signal.all()
    # with std: each group has unit spread
    adv_std, _, _ = grpo_advantages(rewards, ["ok"] * 6, tasks, harnesses, normalize_std=True)
    # (r - mean) / (std + 1e-6) with std 0.5: off from +-1 by 1e-6 / 0.5 = 2e-6, well inside 1e-4
    assert np.allclose(adv_std[:2], [1.0, -1.0], atol=1e-4)
    assert np.isclose(adv_std[2:].std(), 1.0, atol=1e-4)  # same: the eps moves it by std/(std+eps) - 1 ~ -3e-6


def test_mixed_pairs_do_not_see_each_others_rewards() -> None:
    base, _, _ = grpo_advantages([1.0, 0.0], ["ok"] * 2, ["t", "t"], ["A", "A"])
    mixed, _, _ = grpo_advantages([1.0, 0.0, 9.0, 7.0], ["ok"] * 4, ["t"] * 4, ["A", "A", "B", "B"])
    assert np.allclose(mixed[:2], base)  # the same float64 operations on the same two rewards: equal, tolerance unused


def test_degenerate_nan_and_failed_are_counted_never_raised() -> None:
    rewards = [1.0, 1.0, 1.0, float("nan"), 0.0, 1.0, 0.3]
    statuses = ["ok", "ok", "ok", "ok", "failed", "ok", "ok"]
    tasks = ["d", "d", "d", "n", "n", "n", "single"]
    adv, signal, m = grpo_advantages(rewards, statuses, tasks, ["H"] * 7)
    assert m["groups_degenerate"] == 3  # "d" (all equal), "n" (one usable left), "single"
    assert m["rollouts_nan_reward"] == 1 and m["rollouts_failed"] == 1
    assert m["groups_singleton"] == 2
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert math.isnan(adv[3]) and math.isnan(adv[4])
    assert not signal.any()


def test_all_failed_group() -> None:
    adv, signal, m = grpo_advantages([0.0, 0.0], ["failed", "empty"], ["t", "t"], ["H", "H"])
    assert np.isnan(adv).all() and m["groups_without_usable_rollout"] == 1 and not signal.any()


def test_length_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="one of each per rollout"):
        grpo_advantages([1.0], ["ok", "ok"], ["t"], ["H"])


def test_broadcast_reaches_every_generated_token_of_every_branch() -> None:
    f = forest_from_paths([[(1, False), (2, True), (3, True)], [(1, False), (2, True), (4, False), (5, True)]])
    a = broadcast_advantage(f, 0.7)
    assert np.allclose(a[f.generated], 0.7) and np.all(a[~f.generated] == 0)  # 0.7 stored as float32: off by 1e-8
    for branch in f.branches():
        gen = branch[f.generated[branch]]
        assert np.allclose(a[gen], 0.7)


def test_micro_batches_carry_each_rollouts_advantage_and_skip_failed() -> None:
    forests = [
        forest_from_paths([[(1, False), (2 + i, True), (9, True)]], rollout_id=f"r{i}", reward=r, task_id="t")
        for i, r in enumerate([1.0, 0.0, 0.5])
    ]
    forests[2].status = "failed"
    batch = RolloutBatch.from_forests(forests)
    mbs, metrics = grpo_micro_batches(batch, GRPOConfig(normalize_std=False), token_budget=1000)
    assert metrics["rollouts_failed"] == 1 and metrics["rollouts_trained"] == 2
    (mb,) = mbs
    for r, expected in [(0, 0.5), (1, -0.5)]:
        tokens = (mb.rollout_index == r) & mb.loss_mask
        assert tokens.sum() == 2
        assert np.allclose(mb.advantages[tokens].numpy(), expected)  # +-0.5 exact in float32 (mean-only centring)
    assert (mb.advantages[~mb.loss_mask] == 0).all()
    assert 2 not in mb.rollout_index.tolist()
