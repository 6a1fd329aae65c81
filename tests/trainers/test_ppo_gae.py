"""PPO's per-branch GAE: computed along each branch alone, shared tokens combined by the mean."""

from __future__ import annotations

import numpy as np
import torch

from trainers.ppo import PPOConfig, branch_gae, ppo_micro_batches, tree_gae
from trainers.rollout_batch import RolloutBatch
from trainers.synthetic_batches import forest_from_paths
from trainers.tree_forward import Critic

from .conftest import small_qwen3


def tree():
    # shared: c0 g1 g2 | branch A: c3 g4 g5 | branch B: c6 g7
    f = forest_from_paths(
        [
            [(10, False), (11, True), (12, True), (13, False), (14, True), (15, True)],
            [(10, False), (11, True), (12, True), (16, False), (17, True)],
        ]
    )
    return f


def two_forests_and_critic(reward_tree: float, reward_r1: float, *extra) -> tuple[RolloutBatch, Critic]:
    """tree() (two branches) and a one-branch forest r1 (+ extra forests), with a critic whose head is random."""
    forests = [
        tree(),
        forest_from_paths([[(10, False), (20, True), (21, True)]], rollout_id="r1", reward=reward_r1),
        *extra,
    ]
    forests[0].reward = reward_tree
    critic = Critic(small_qwen3(1))
    torch.nn.init.normal_(critic.value_head.weight, std=0.5)
    return RolloutBatch.from_forests(forests), critic


def test_branch_gae_matches_hand_computation() -> None:
    values = np.array([0.0, 0.1, 0.2, 0.0, 0.4, 0.5])
    actions = np.array([1, 2, 4, 5])
    adv, ret = branch_gae(values, actions, reward=1.0, gamma=0.9, lam=0.5)
    v = values[actions]
    delta = np.array([0.9 * v[1] - v[0], 0.9 * v[2] - v[1], 0.9 * v[3] - v[2], 1.0 - v[3]])
    expected = np.zeros(4)
    running = 0.0
    for t in range(3, -1, -1):
        running = delta[t] + 0.9 * 0.5 * running
        expected[t] = running
    assert np.allclose(adv, expected) and np.allclose(ret, expected + v)  # float64, 4 steps: ~1e-16, default rtol 1e-5


def test_no_sibling_leakage_and_shared_tokens_are_the_branch_mean() -> None:
    f = tree()
    branches = f.branches()
    gen = f.generated
    rng = np.random.default_rng(0)
    values = rng.normal(size=f.num_tokens)
    adv, ret, count = tree_gae(values, gen, branches, [1.0, 0.0], gamma=1.0, lam=0.9)
    a_only, _ = branch_gae(values, branches[0][gen[branches[0]]], 1.0, gamma=1.0, lam=0.9)
    b_only, _ = branch_gae(values, branches[1][gen[branches[1]]], 0.0, gamma=1.0, lam=0.9)
    a_nodes = branches[0][gen[branches[0]]]
    b_nodes = branches[1][gen[branches[1]]]
    shared = np.intersect1d(a_nodes, b_nodes)
    own_a = np.setdiff1d(a_nodes, shared)
    own_b = np.setdiff1d(b_nodes, shared)
    # exclusive tokens: exactly their own branch's GAE (float64 sums of a few terms, then float32 storage: ~1e-7
    # relative, inside allclose's default rtol 1e-5 / atol 1e-8 for these O(1) values)
    assert np.allclose(adv[own_a], a_only[np.isin(a_nodes, own_a)])
    assert np.allclose(adv[own_b], b_only[np.isin(b_nodes, own_b)])
    # shared tokens: the mean over the two branches, counted on 2 branches
    assert np.all(count[shared] == 2) and np.all(count[own_a] == 1)
    assert np.allclose(adv[shared], (a_only[np.isin(a_nodes, shared)] + b_only[np.isin(b_nodes, shared)]) / 2)
    # context tokens carry nothing
    assert np.all(adv[~gen] == 0) and np.all(count[~gen] == 0)

    # changing everything on branch B (its reward and its own values) leaves branch A's own tokens alone
    values2 = values.copy()
    values2[np.setdiff1d(branches[1], branches[0])] += 5.0
    adv2, _, _ = tree_gae(values2, gen, branches, [1.0, -3.0], gamma=1.0, lam=0.9)
    assert np.allclose(adv2[own_a], adv[own_a])
    assert not np.allclose(adv2[own_b], adv[own_b])


def test_ppo_micro_batches_on_a_real_critic() -> None:
    nan = forest_from_paths([[(10, False), (22, True)]], rollout_id="r2", reward=float("nan"))
    batch, critic = two_forests_and_critic(1.0, 0.0, nan)
    mbs, metrics = ppo_micro_batches(batch, critic, PPOConfig(normalize_advantages=False, lam=0.95), token_budget=1000)
    assert metrics["rollouts_nan_reward"] == 1 and metrics["rollouts_trained"] == 2
    (mb,) = mbs
    values = mb.old_values.numpy()
    adv, _, _ = tree_gae(values, mb.loss_mask.numpy(), mb.branches(), [1.0, 1.0, 0.0], gamma=1.0, lam=0.95)
    assert np.allclose(mb.advantages.numpy(), adv, atol=1e-6)  # the same float64 GAE, both stored as float32: equal
    # each branch's last action: A = R - V
    for nodes, reward in zip(mb.branches(), [1.0, 1.0, 0.0]):
        last = nodes[mb.loss_mask.numpy()[nodes]][-1]
        if (sum(last in b for b in mb.branches())) == 1:
            # R - V in float64 vs the float32-stored advantage: |V| < 1, so ~6e-8 apart
            assert np.isclose(mb.advantages[last].item(), reward - values[last], atol=1e-6)


def test_uniform_reward_batch_moves_only_the_critic() -> None:
    """All rollouts scored 0: policy advantages are 0 (counted), value targets still point at the reward."""
    batch, critic = two_forests_and_critic(0.0, 0.0)
    (mb,), metrics = ppo_micro_batches(batch, critic, PPOConfig(), token_budget=1000)
    assert metrics["policy_skipped_uniform_reward"] == 1.0
    assert torch.all(mb.advantages == 0)
    trained = mb.loss_mask
    (raw,), _ = ppo_micro_batches(
        batch, critic, PPOConfig(skip_uniform_batches=False, normalize_advantages=False), 1000
    )
    # the same computation twice (the skip only zeroes advantages afterwards): equal returns
    assert torch.allclose(mb.returns, raw.returns) and torch.any(
        raw.advantages[trained] != 0
    )  # the critic still learns
    # the same batch without the skip: whitened critic errors, unit scale
    (mb2,), metrics2 = ppo_micro_batches(batch, critic, PPOConfig(skip_uniform_batches=False), token_budget=1000)
    assert metrics2["policy_skipped_uniform_reward"] == 0.0
    assert mb2.advantages[trained].std().item() > 0.5
    # one differing reward: the policy trains again
    batch = RolloutBatch.from_forests(batch.forests, rewards=[1.0, 0.0])
    (mb3,), metrics3 = ppo_micro_batches(batch, critic, PPOConfig(), token_budget=1000)
    assert metrics3["policy_skipped_uniform_reward"] == 0.0 and torch.any(mb3.advantages[trained] != 0)


def test_default_lambda_gives_every_action_reward_minus_value() -> None:
    """lam = gamma = 1: a branch's first token gets R - V as fully as its last (no fading of a final reward)."""
    batch, critic = two_forests_and_critic(1.0, 0.0)
    (mb,), _ = ppo_micro_batches(batch, critic, PPOConfig(normalize_advantages=False), 1000)
    values, mask = mb.old_values.numpy(), mb.loss_mask.numpy()
    for nodes, reward in zip(mb.branches(), [1.0, 1.0, 0.0]):
        own = [n for n in nodes[mask[nodes]] if sum(n in b for b in mb.branches()) == 1]
        # with lam = gamma = 1 the deltas telescope to R - V; a float64 sum of <= 20 O(1) deltas then float32: ~1e-7
        assert own and np.allclose(mb.advantages.numpy()[own], reward - values[own], atol=1e-6)
