"""The policy-loss step GRPO and PPO share, and the bookkeeping of a step's loss and metrics.

Normalisation ("unique-token mean"): a step's loss is the sum over its unique trained tokens of each
token's loss, divided by N, the number of unique trained (generated, usable) tokens in the whole step's
batch, over all micro-batches and all data-parallel ranks. A token of the shared history before a fork
is one term, not one per branch through it. Each micro-batch returns its own sum divided by the global
N, so gradient accumulation over micro-batches (and across ranks) adds up to exactly the gradient of
the step's loss.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from clawgym_env.trajectory.packing import TokenLogprobs, tree_logprobs
from trainers.correction import CorrectionConfig, rollout_correction
from trainers.tree_batch import TreeBatch


class PolicyLossConfig(BaseModel):
    """The options of the clipped-ratio policy loss (both algorithms' configs extend it)."""

    model_config = ConfigDict(extra="forbid")

    eps_low: float = Field(default=0.2, ge=0, description="ratio clipped below at 1 - eps_low")
    eps_high: float = Field(default=0.28, ge=0, description="ratio clipped above at 1 + eps_high (clip-higher)")
    kl_coef: float = Field(default=0.0, ge=0, description="k3 KL penalty to the reference policy (0 = off)")
    entropy_coef: float = Field(default=0.0, ge=0, description="entropy bonus (0 = logged only)")
    temperature: float = Field(
        default=1.0,
        gt=0,
        description="the sampling temperature: the engine samples with it, the trainer divides its logits by it",
    )
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)


@dataclass
class LossParts:
    loss: torch.Tensor  # this micro-batch's contribution to the step's loss (already divided by the global N)
    sums: dict[str, float]  # metric sums over its trained tokens


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(policy || ref) per token, for samples from the policy: exp(d) - d - 1, d = ref - logp."""
    d = ref_logp - logp
    return d.exp() - d - 1.0


def policy_loss(
    model: nn.Module,
    mb: TreeBatch,
    normalizer: float,
    config: PolicyLossConfig,
    ref_model: nn.Module | None = None,
    *,
    current: TokenLogprobs | None = None,
) -> LossParts:
    """The clipped-ratio policy loss of one packed micro-batch, with rollout correction, KL and entropy terms.

    `mb.advantages` holds each token's advantage (the algorithm's job); `normalizer` is N, the step's
    trained tokens. `current` replaces the model's packed forward (the per-branch baseline passes its own).
    """
    if normalizer <= 0:
        raise ValueError("policy_loss: normalizer (number of trained tokens in the batch) must be positive")
    out = current if current is not None else tree_logprobs(model, mb.packed, temperature=config.temperature)
    logp, entropy = out.logprobs, out.entropy
    device = logp.device
    mask = mb.loss_mask.to(device)
    m = mask.float()
    adv = mb.advantages.to(device).to(logp.dtype)
    # one update per batch: the weights have not moved yet, so the pre-update log-probs are these
    old = (mb.old_logprobs.to(device) if mb.old_logprobs is not None else logp).detach()

    # rollout correction: w = min(exp(old - logp_engine), cap) by default, a constant per token
    correction = rollout_correction(old, mb.rollout_logprobs, mask, config.correction, mb.rollout_index.to(device))
    w = correction.weights.detach()

    # the clipped surrogate objective
    ratio = torch.where(mask, logp - old, torch.zeros_like(logp)).exp()
    surr1 = ratio * adv
    surr2 = ratio.clamp(1.0 - config.eps_low, 1.0 + config.eps_high) * adv
    pg = -torch.minimum(surr1, surr2) * w
    per_token = pg

    # KL to the reference policy (k3) and the entropy bonus
    kl = None
    if config.kl_coef and ref_model is not None:
        with torch.no_grad():
            ref = tree_logprobs(ref_model, mb.packed, temperature=config.temperature, with_entropy=False).logprobs
        kl = k3_kl(logp, ref.detach())
        per_token = per_token + config.kl_coef * kl
    if config.entropy_coef:
        per_token = per_token - config.entropy_coef * entropy

    # unique-token mean over the whole step's batch
    loss = (per_token * m).sum() / normalizer

    with torch.no_grad():
        clipped = ((ratio < 1.0 - config.eps_low) & (adv < 0)) | ((ratio > 1.0 + config.eps_high) & (adv > 0))
        sums = {
            "tokens": float(m.sum()),
            "pg_loss": float((pg * m).sum()),
            "clip_frac": float((clipped.float() * m).sum()),
            "ratio_mean": float((ratio * m).sum()),
            "advantage_mean": float((adv * m).sum()),
            "entropy": float((entropy.detach() * m).sum()),
            **correction.sums,
        }
        if kl is not None:
            sums["kl_ref"] = float((kl.detach() * m).sum())
    return LossParts(loss=loss, sums=sums)


class MetricSums:
    """Adds token-weighted sums over micro-batches; `means()` divides by the token counts.

    Keys ending in `_max` keep the maximum; keys starting with `is_` are divided by `is_tokens`,
    the others by `tokens`.
    """

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)

    def add(self, sums: dict[str, float]) -> None:
        for key, value in sums.items():
            if key.endswith("_max"):
                self.sums[key] = max(self.sums.get(key, value), value)
            else:
                self.sums[key] += value

    def means(self) -> dict[str, float]:
        out = {}
        for key, value in self.sums.items():
            if key in ("tokens", "is_tokens") or key.endswith("_max"):
                out[key] = value
                continue
            denom = self.sums.get("is_tokens" if key.startswith("is_") else "tokens", 0.0)
            out[key] = value / denom if denom else 0.0
        return out
