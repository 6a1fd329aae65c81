"""GRPO on trajectory forests, top to bottom.

1. Group: the rollouts of one task under one harness (a Task–Harness pair). A mixed-harness batch holds
   several groups per task; rewards are only compared inside a group.
2. Advantage: A_i = (r_i - mean_group) / (std_group + eps) (or without the std), one number per
   rollout, broadcast to every generated token of the rollout's forest (all its surviving branches).
   Failed rollouts, NaN rewards and degenerate groups are counted and left out (trainers.advantages).
3. Pack: the kept forests become packed micro-batches, each unique token once (trainers.tree_batch).
4. Loss per micro-batch: the clipped-ratio objective with separate low/high clip, each token's term
   weighted by the rollout-correction weight (trainers.correction), optional KL to a reference and
   entropy bonus, summed over unique trained tokens and divided by their number in the whole batch
   (trainers.losses).

`grpo_loss` does 1-4 in one call for a user's own training loop; `GRPO` plugs into `trainers.core.Trainer`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from pydantic import BaseModel, Field
from torch import nn

from clawgym_env.trajectory import TrajectoryForest
from trainers.advantages import broadcast_advantage, grpo_advantages
from trainers.correction import CorrectionConfig, rollout_correction
from trainers.losses import LossParts, MetricSums, policy_loss
from trainers.rollouts import RolloutBatch
from trainers.tree_batch import TreeBatch, build_micro_batches
from trainers.tree_forward import tree_logprobs


class GRPOConfig(BaseModel):
    eps_low: float = Field(default=0.2, ge=0, description="ratio clipped below at 1 - eps_low")
    eps_high: float = Field(default=0.28, ge=0, description="ratio clipped above at 1 + eps_high (clip-higher)")
    normalize_std: bool = Field(default=True, description="divide by the group's reward std (Dr. GRPO: false)")
    drop_degenerate: bool = Field(default=True, description="leave zero-advantage groups out of the update")
    kl_coef: float = Field(default=0.0, ge=0, description="k3 KL penalty to the reference policy (0 = off)")
    entropy_coef: float = Field(default=0.0, ge=0, description="entropy bonus (0 = logged only)")
    temperature: float = Field(default=1.0, gt=0, description="the sampling temperature, applied to the trainer's logits")
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)


# ------------------------------------------------------------------------------ 1-3: advantages and packing
def rollout_metrics(rollouts: RolloutBatch) -> dict[str, float]:
    """Reward per harness (failed rollouts count 0) and overall."""
    out = {f"reward/{h}": v for h, v in rollouts.reward_by_harness().items()}
    ok = np.array([s == "ok" for s in rollouts.statuses])
    finite = np.where(ok & np.isfinite(rollouts.rewards), rollouts.rewards, 0.0)
    out["reward_mean"] = float(finite.mean()) if len(rollouts) else 0.0
    return out


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
    metrics.update(rollout_metrics(rollouts))
    forests = [rollouts.forests[i] for i in kept]
    token_adv = [broadcast_advantage(rollouts.forests[i], float(adv[i])) for i in kept]
    return build_micro_batches(forests, kept, token_adv, token_budget, share_context=share_prompts), metrics


# ------------------------------------------------------------------------------ 4: the loss of a micro-batch
def policy_micro_batch_loss(
    model: nn.Module,
    mb: TreeBatch,
    normalizer: float,
    config: GRPOConfig,
    ref_model: nn.Module | None = None,
) -> LossParts:
    """Clipped-ratio loss of one packed micro-batch with rollout correction (shared by GRPO and PPO)."""
    out = tree_logprobs(model, mb, temperature=config.temperature)
    device = out.logprobs.device
    mask = mb.loss_mask.to(device)
    # one update per batch: the weights have not moved yet, so the pre-update log-probs are these
    old = mb.old_logprobs.to(device) if mb.old_logprobs is not None else out.logprobs.detach()
    correction = rollout_correction(old, mb.rollout_logprobs, mask, config.correction, mb.rollout_index.to(device))
    ref = None
    if config.kl_coef and ref_model is not None:
        with torch.no_grad():
            ref = tree_logprobs(ref_model, mb, temperature=config.temperature, with_entropy=False).logprobs
    parts = policy_loss(
        out.logprobs,
        old,
        mb.advantages.to(device),
        mask,
        correction.weights,
        normalizer,
        eps_low=config.eps_low,
        eps_high=config.eps_high,
        entropy=out.entropy,
        entropy_coef=config.entropy_coef,
        ref_logp=ref,
        kl_coef=config.kl_coef,
    )
    parts.sums.update(correction.sums)
    return parts


# ------------------------------------------------------------------------------ the algorithm for Trainer
class GRPO:
    name = "grpo"

    def __init__(self, config: GRPOConfig | None = None) -> None:
        self.config = config or GRPOConfig()

    def prepare(self, trainer, rollouts: RolloutBatch) -> tuple[list[TreeBatch], dict[str, float]]:  # noqa: ANN001
        optim = trainer.optim_config
        return grpo_micro_batches(rollouts, self.config, optim.token_budget, optim.share_prompts)

    def micro_batch_loss(self, trainer, mb: TreeBatch, normalizer: float) -> LossParts:  # noqa: ANN001
        return policy_micro_batch_loss(trainer.model, mb, normalizer, self.config, trainer.ref_model)


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
    batch = RolloutBatch.from_forests(forests, rewards)
    if task_ids is not None:
        batch.task_ids = list(task_ids)
    if harnesses is not None:
        batch.harnesses = list(harnesses)
    batch.__post_init__()
    micro_batches, metrics = grpo_micro_batches(batch, config, token_budget)
    normalizer = float(sum(mb.num_loss_tokens for mb in micro_batches))
    param = next(model.parameters())
    total = param.new_zeros(()) * param.sum() if normalizer == 0 else None  # keeps backward() valid
    sums = MetricSums()
    for mb in micro_batches:
        parts = policy_micro_batch_loss(model, mb, normalizer, config, ref_model)
        total = parts.loss if total is None else total + parts.loss
        sums.add(parts.sums)
    metrics.update(sums.means())
    assert total is not None
    metrics["loss"] = float(total.detach())
    return total, metrics
