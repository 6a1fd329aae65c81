"""Token losses on packed trees, aggregated so that each unique tree token counts once.

Normalisation ("unique-token mean"): a step's loss is

    L = sum over unique trained tokens t of loss_t  /  N

where N is the number of unique trained (generated, usable) tokens in the whole step's batch, over
all micro-batches and all data-parallel ranks. A token of the shared history before a fork is one
term, not one per branch through it. Each micro-batch returns its own sum divided by the global N, so
gradient accumulation over micro-batches (and across ranks) adds up to exactly the gradient of L.

Policy term (GRPO and PPO), with ratio_t = exp(logp_t - logp_old_t), advantage A_t and the rollout
correction weight w_t (constant, see trainers.correction):

    loss_t = -w_t * min(ratio_t * A_t, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A_t)
             + kl_coef * k3(ref || policy)_t  -  entropy_coef * H_t
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch


@dataclass
class LossParts:
    loss: torch.Tensor  # this micro-batch's contribution to L (already divided by the global N)
    sums: dict[str, float]  # metric sums over its trained tokens


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(policy || ref) per token, for samples from the policy: exp(d) - d - 1, d = ref - logp."""
    d = ref_logp - logp
    return d.exp() - d - 1.0


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    is_weights: torch.Tensor,
    normalizer: float,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossParts:
    """Clipped-ratio policy loss over the tokens in `mask` (all inputs [T]); see the module docstring."""
    if normalizer <= 0:
        raise ValueError("policy_loss: normalizer (number of trained tokens in the batch) must be positive")
    m = mask.float()
    old = old_logp.detach()
    log_ratio = torch.where(mask, logp - old, torch.zeros_like(logp))
    ratio = log_ratio.exp()
    adv = advantages.to(logp.dtype)
    surr1 = ratio * adv
    surr2 = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    pg = -torch.minimum(surr1, surr2) * is_weights.detach()
    per_token = pg
    kl = None
    if ref_logp is not None and kl_coef:
        kl = k3_kl(logp, ref_logp.detach())
        per_token = per_token + kl_coef * kl
    if entropy is not None and entropy_coef:
        per_token = per_token - entropy_coef * entropy
    loss = (per_token * m).sum() / normalizer
    with torch.no_grad():
        clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
        sums = {
            "tokens": float(m.sum()),
            "pg_loss": float((pg * m).sum()),
            "clip_frac": float((clipped.float() * m).sum()),
            "ratio_mean": float((ratio * m).sum()),
            "advantage_mean": float((adv * m).sum()),
        }
        if entropy is not None:
            sums["entropy"] = float((entropy.detach() * m).sum())
        if kl is not None:
            sums["kl_ref"] = float((kl.detach() * m).sum())
    return LossParts(loss=loss, sums=sums)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    normalizer: float,
    *,
    clip: float | None = 0.2,
) -> LossParts:
    """0.5 * (V - R)^2 (PPO's clipped form when `clip`), unique-token mean like the policy loss."""
    m = mask.float()
    err = (values - returns) ** 2
    if clip is not None:
        clipped_v = old_values.detach() + (values - old_values.detach()).clamp(-clip, clip)
        err = torch.maximum(err, (clipped_v - returns) ** 2)
    loss = 0.5 * (err * m).sum() / normalizer
    with torch.no_grad():
        sums = {
            "value_loss": float((0.5 * err * m).sum()),
            "value_mean": float((values * m).sum()),
            "return_mean": float((returns * m).sum()),
        }
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
