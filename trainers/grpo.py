"""GRPO on trajectory forests, top to bottom.

1. Group: the rollouts of one task under one harness (a Task–Harness pair). A mixed-harness batch holds
   several groups per task; rewards are only compared inside a group (a mixed-harness batch never
   normalises OpenClaw rewards against Claude Code ones).
2. Advantage: A_i = (r_i - mean_group) / (std_group + eps) (or without the std), one number per
   rollout, broadcast to every generated token of the rollout's forest (all its surviving branches
   share its one reward). Rollouts that cannot be scored are left out and counted, never crash the run:
   failed rollouts and NaN rewards get no advantage; a degenerate group (every usable reward equal,
   a group of one included) gets advantage 0 and is dropped from the update by default.
3. Pack: the kept forests become packed micro-batches, each unique token once (trainers.tree_batch).
4. Loss per micro-batch: the clipped-ratio policy loss with rollout correction, optional KL to a
   reference and entropy bonus (trainers.losses.policy_loss, the step GRPO and PPO share).

`grpo_loss` does 1-4 in one call for a user's own training loop; `GRPO` plugs into `trainers.core.Trainer`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from clawgym_env.trajectory import TrajectoryForest
from trainers.losses import LossParts, MetricSums, PolicyLossConfig, policy_loss
from trainers.rollout_batch import RolloutBatch
from trainers.tree_batch import TreeBatch, build_micro_batches


class GRPOConfig(PolicyLossConfig):
    name: Literal["grpo"] = "grpo"
    normalize_std: bool = Field(default=True, description="divide by the group's reward std (Dr. GRPO: false)")
    drop_degenerate: bool = Field(default=True, description="leave zero-advantage groups out of the update")


# ------------------------------------------------------------------------------ 1-2: group advantages
def grpo_advantages(
    rewards: Sequence[float] | np.ndarray,
    statuses: Sequence[str],
    task_ids: Sequence[str],
    harnesses: Sequence[str],
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Per-rollout advantages, which rollouts carry a signal, and counts.

    Returns (advantages [N] with NaN for unusable rollouts, signal [N] bool, metrics). Within a group,
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


# ------------------------------------------------------------------------------ 3: pack the kept rollouts
def grpo_micro_batches(
    rollouts: RolloutBatch, config: GRPOConfig, token_budget: int, share_prompts: bool = True
) -> tuple[list[TreeBatch], dict[str, float]]:
    adv, signal, metrics = grpo_advantages(
        rollouts.rewards, rollouts.statuses, rollouts.task_ids, rollouts.harnesses, normalize_std=config.normalize_std
    )
    keep = signal if config.drop_degenerate else np.isfinite(adv)
    keep &= np.array([f.ok and f.num_tokens > 0 for f in rollouts.forests], dtype=bool)
    kept = np.flatnonzero(keep).tolist()
    metrics["rollouts_trained"] = float(len(kept))
    metrics.update(rollouts.reward_metrics())
    forests = [rollouts.forests[i] for i in kept]
    token_adv = [broadcast_advantage(rollouts.forests[i], float(adv[i])) for i in kept]
    return build_micro_batches(forests, kept, token_adv, token_budget, share_context=share_prompts), metrics


# ------------------------------------------------------------------------------ 4: the algorithm for Trainer
class GRPO:
    name = "grpo"

    def __init__(self, config: GRPOConfig | None = None) -> None:
        self.config = config or GRPOConfig()

    def prepare(self, trainer, rollouts: RolloutBatch) -> tuple[list[TreeBatch], dict[str, float]]:  # noqa: ANN001
        optim = trainer.optim_config
        return grpo_micro_batches(rollouts, self.config, optim.token_budget, optim.share_prompts)

    def micro_batch_loss(self, trainer, mb: TreeBatch, normalizer: float) -> LossParts:  # noqa: ANN001
        return policy_loss(trainer.model, mb, normalizer, self.config, trainer.ref_model)


# ------------------------------------------------------------------------------ one call, for custom loops
def grpo_loss(
    model: nn.Module,
    forests: Sequence[TrajectoryForest],
    rewards: Sequence[float] | np.ndarray | None = None,
    *,
    task_ids: Sequence[str] | None = None,
    harnesses: Sequence[str] | None = None,
    config: GRPOConfig | None = None,
    token_budget: int = 1 << 30,
    ref_model: nn.Module | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss of a batch of rollouts, ready for `.backward()`; with its metrics.

    Rewards, task ids and harnesses default to what each forest carries. With a token budget, the
    micro-batches run one after another and their losses are summed (exactly the whole-batch loss).
    """
    config = config or GRPOConfig()
    batch = RolloutBatch.from_forests(forests, rewards, task_ids=task_ids, harnesses=harnesses)
    micro_batches, metrics = grpo_micro_batches(batch, config, token_budget)
    normalizer = float(sum(mb.num_loss_tokens for mb in micro_batches))
    param = next(model.parameters())
    total = param.new_zeros(()) * param.sum() if normalizer == 0 else None  # keeps backward() valid
    sums = MetricSums()
    for mb in micro_batches:
        parts = policy_loss(model, mb, normalizer, config, ref_model)
        total = parts.loss if total is None else total + parts.loss
        sums.add(parts.sums)
    metrics.update(sums.means())
    assert total is not None
    metrics["loss"] = float(total.detach())
    return total, metrics
