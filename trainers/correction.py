"""Rollout correction: token-level importance weights between the trainer and the inference engine.

The engine that sampled a rollout (vLLM, a remote server, an older copy of the weights) does not
compute exactly the trainer's probabilities. With

    rho_t = exp(logp_trainer_old(t) - logp_rollout(t))

(the trainer's log-prob under the weights that generated the batch, minus the engine's), the modes are:

- ``truncate`` (default): each token's policy-gradient term is multiplied by ``min(rho_t, cap)``
  (cap 2.0); the weight is a constant (no gradient flows through it);
- ``mask``: tokens whose ratio leaves ``[band_low, band_high]`` get weight 0, the others weight 1;
- ``sequence_mask``: a rollout whose geometric-mean ratio leaves the band is dropped as a whole;
- ``none``: weight 1 everywhere (metrics are still measured).

Tokens without an engine log-prob (NaN) get weight 1 and are counted as `is_missing_frac`.
Metrics, over the trained tokens: mean ratio, the k3 estimate of KL(rollout || trainer)
(``rho - 1 - log rho``, unbiased and non-negative), and the fraction clipped or masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

CorrectionMode = Literal["none", "truncate", "mask", "sequence_mask"]


class CorrectionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: CorrectionMode = "truncate"
    cap: float = Field(default=2.0, gt=0, description="truncate: upper bound on the weight")
    band_low: float = Field(default=0.5, ge=0, description="mask modes: smallest ratio kept")
    band_high: float = Field(default=2.0, gt=0, description="mask modes: largest ratio kept")

    @model_validator(mode="after")
    def _band(self) -> CorrectionConfig:
        if self.band_low >= self.band_high:
            raise ValueError(f"correction band_low ({self.band_low}) must be below band_high ({self.band_high})")
        return self


@dataclass
class Correction:
    weights: torch.Tensor  # [T], detached, 0 outside the mask
    sums: dict[str, float]  # metric sums over trained tokens; divide by sums["is_tokens"]


def rollout_correction(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    config: CorrectionConfig,
    rollout_index: torch.Tensor | None = None,
) -> Correction:
    """Importance weights for the tokens in `mask` (all inputs [T]); see the module docstring."""
    with torch.no_grad():
        old = old_logprobs.detach().float()
        rollout = rollout_logprobs.detach().float().to(old.device)
        missing = mask & torch.isnan(rollout)
        log_rho = torch.where(missing | ~mask, torch.zeros_like(old), old - rollout)
        log_rho = log_rho.clamp(-20.0, 20.0)  # exp stays finite; such tokens are clipped or masked anyway
        rho = log_rho.exp()
        weights = torch.ones_like(rho)
        clipped = torch.zeros_like(mask)
        masked = torch.zeros_like(mask)
        if config.mode == "truncate":
            clipped = mask & (rho > config.cap)
            weights = rho.clamp(max=config.cap)
        elif config.mode == "mask":
            masked = mask & ((rho < config.band_low) | (rho > config.band_high))
            weights = (~masked).float()
        elif config.mode == "sequence_mask":
            if rollout_index is None:
                raise ValueError("sequence_mask needs rollout_index (the rollout of each token)")
            masked = _sequence_mask(log_rho, mask & ~missing, rollout_index, config) & mask
            weights = (~masked).float()
        weights = torch.where(missing, torch.ones_like(weights), weights)
        weights = weights * mask.float()
        k3 = rho - 1.0 - log_rho
        m = mask.float()
        sums = {
            "is_tokens": float(m.sum()),
            "is_ratio_mean": float((rho * m).sum()),
            "is_ratio_max": float(rho[mask].max()) if bool(mask.any()) else 0.0,
            "is_kl_k3": float((k3 * m).sum()),
            "is_clipped_frac": float(clipped.float().sum()),
            "is_masked_frac": float(masked.float().sum()),
            "is_missing_frac": float(missing.float().sum()),
        }
    return Correction(weights=weights, sums=sums)


def _sequence_mask(
    log_rho: torch.Tensor, mask: torch.Tensor, rollout_index: torch.Tensor, config: CorrectionConfig
) -> torch.Tensor:
    """True at every token of a rollout whose geometric-mean ratio leaves the band."""
    out = torch.zeros_like(mask)
    for r in torch.unique(rollout_index[mask]).tolist():
        tokens = mask & (rollout_index == r)
        geo = float(log_rho[tokens].mean().exp())
        if geo < config.band_low or geo > config.band_high:
            out |= rollout_index == r
    return out
