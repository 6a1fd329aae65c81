"""Advantages on trees: GRPO's per Task–Harness group normalisation and PPO's per-branch GAE.

GRPO. The group is the Task–Harness pair: the rollouts of one task under one harness are compared
with each other and with nothing else (a mixed-harness batch never normalises OpenClaw rewards
against Claude Code ones). A rollout gets one advantage, broadcast to every generated token of its
forest (all of its surviving branches share its one reward). Rollouts that cannot be scored are left
out and counted, never crash the run:
- failed rollouts (status != "ok") and NaN/inf rewards: no advantage, no tokens trained;
- degenerate groups (every usable reward equal, including a group of one): advantage 0, counted, and
  dropped from the update by default since they carry no signal.

PPO. Along each root-to-leaf branch, the generated tokens are the actions in order (context tokens
such as tool output are part of the next state, not actions); the reward arrives at the branch's last
generated token; GAE runs along that branch only, so nothing passes between sibling branches. A token
shared by several branches (the common history before a fork) gets one advantage per branch it lies
on; its trained advantage and value target are the **mean over those branches** (each branch equally
weighted), so the token is still one term of the loss.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from clawgym_env.trajectory import TrajectoryForest


def grpo_advantages(
    rewards: Sequence[float] | np.ndarray,
    statuses: Sequence[str],
    task_ids: Sequence[str],
    harnesses: Sequence[str],
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Per-rollout advantages, which rollouts are usable, and counts.

    Returns (advantages [N] with NaN for unusable rollouts, usable [N] bool, metrics). Within a group,
    A_i = r_i - mean(r) (divided by std(r) + eps when `normalize_std`), over the group's usable rollouts.
    """
    n = len(rewards)
    if not (len(statuses) == len(task_ids) == len(harnesses) == n):
        raise ValueError(
            f"grpo_advantages: got {n} rewards, {len(statuses)} statuses, {len(task_ids)} task ids and "
            f"{len(harnesses)} harnesses; pass one of each per rollout"
        )
    r = np.asarray(rewards, dtype=np.float64)
    ok = np.array([s == "ok" for s in statuses], dtype=bool)
    finite = np.isfinite(r)
    scorable = ok & finite
    adv = np.full(n, np.nan)
    signal = np.zeros(n, dtype=bool)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i in range(n):
        groups[(str(task_ids[i]), str(harnesses[i]))].append(i)
    degenerate = singleton = empty = 0
    for members in groups.values():
        idx = np.array([i for i in members if scorable[i]], dtype=np.int64)
        if idx.size == 0:
            empty += 1
            continue
        values = r[idx]
        centred = values - values.mean()
        spread = values.std()
        if idx.size == 1:
            singleton += 1
        if spread < 1e-8:
            degenerate += 1
            adv[idx] = 0.0
            continue
        adv[idx] = centred / (spread + eps) if normalize_std else centred
        signal[idx] = True
    metrics = {
        "rollouts": float(n),
        "groups": float(len(groups)),
        "groups_degenerate": float(degenerate),
        "groups_singleton": float(singleton),
        "groups_without_usable_rollout": float(empty),
        "rollouts_failed": float((~ok).sum()),
        "rollouts_nan_reward": float((ok & ~finite).sum()),
        "rollouts_with_signal": float(signal.sum()),
    }
    return adv, signal, metrics


def broadcast_advantage(forest: TrajectoryForest, advantage: float) -> np.ndarray:
    """The rollout's one advantage on every generated token of its forest (0 on context), [num_tokens]."""
    return np.where(forest.generated, np.float32(advantage), np.float32(0.0)).astype(np.float32)


def discounted_reverse_cumsum(x: np.ndarray, discount: float) -> np.ndarray:
    """y[t] = x[t] + discount * y[t+1]."""
    out = np.zeros_like(x, dtype=np.float64)
    running = 0.0
    for t in range(x.shape[0] - 1, -1, -1):
        running = float(x[t]) + discount * running
        out[t] = running
    return out


def branch_gae(
    values: np.ndarray,
    action_nodes: np.ndarray,
    reward: float,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """GAE along one branch. `action_nodes`: the branch's generated tokens in order; returns (adv, returns).

    Rewards are 0 except `reward` at the last action; the value after the last action is 0 (terminal).
    """
    v = values[action_nodes].astype(np.float64)
    if v.size == 0:
        return np.zeros(0), np.zeros(0)
    next_v = np.append(v[1:], 0.0)
    rewards = np.zeros_like(v)
    rewards[-1] = reward
    delta = rewards + gamma * next_v - v
    adv = discounted_reverse_cumsum(delta, gamma * lam)
    return adv, adv + v


def tree_gae(
    values: np.ndarray,
    generated: np.ndarray,
    branches: Sequence[np.ndarray],
    branch_rewards: Sequence[float],
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-branch GAE on a packed tree, combined per token as the mean over the branches through it.

    values, generated: [T] (value of the state before each token; generated = is an action).
    Returns (advantages [T], returns [T], branch count [T]); context tokens get 0 and count 0.
    """
    if len(branches) != len(branch_rewards):
        raise ValueError(f"tree_gae: {len(branches)} branches but {len(branch_rewards)} rewards")
    adv_sum = np.zeros(values.shape[0])
    ret_sum = np.zeros(values.shape[0])
    count = np.zeros(values.shape[0], dtype=np.int64)
    for nodes, reward in zip(branches, branch_rewards):
        actions = nodes[generated[nodes]]
        adv, ret = branch_gae(values, actions, reward, gamma=gamma, lam=lam)
        np.add.at(adv_sum, actions, adv)
        np.add.at(ret_sum, actions, ret)
        np.add.at(count, actions, 1)
    safe = np.maximum(count, 1)
    return (adv_sum / safe).astype(np.float32), (ret_sum / safe).astype(np.float32), count
