"""Rollout correction: truncated and masked importance weights, and their metrics."""

from __future__ import annotations

import math

import pytest
import torch

from trainers.correction import CorrectionConfig, rollout_correction


def setup():
    old = torch.tensor([-1.0, -1.0, -1.0, -1.0, -1.0, 0.0])
    # rho = exp(old - rollout): 1, e^1 (2.72), e^-1 (0.37), e^0.5 (1.65), nan rollout -> 1, context
    rollout = torch.tensor([-1.0, -2.0, 0.0, -1.5, float("nan"), 0.0])
    mask = torch.tensor([True, True, True, True, True, False])
    return old, rollout, mask


def test_truncate_caps_at_C_and_counts() -> None:
    old, rollout, mask = setup()
    c = rollout_correction(old, rollout, mask, CorrectionConfig(mode="truncate", cap=2.0))
    # one float32 exp each: within 1 ulp (~6e-8 relative) of the float64 values, inside allclose's rtol 1e-5
    assert torch.allclose(c.weights, torch.tensor([1.0, 2.0, math.exp(-1), math.exp(0.5), 1.0, 0.0]))
    assert c.sums["is_clipped_frac"] == 1 and c.sums["is_missing_frac"] == 1 and c.sums["is_tokens"] == 5
    rhos = [1.0, math.e, math.exp(-1), math.exp(0.5), 1.0]
    assert math.isclose(
        c.sums["is_ratio_mean"], sum(rhos), rel_tol=1e-5
    )  # a float32 sum of 5 positive terms: ~3e-7 relative
    k3 = sum(r - 1 - math.log(r) for r in rhos)
    # k3 = rho - 1 - log rho in float32 over 5 tokens: each term ~0.1-1 loses ~1e-7 absolute to cancellation,
    # ~1e-6 relative to the sum (~1.1); 1e-5 covers it
    assert math.isclose(c.sums["is_kl_k3"], k3, rel_tol=1e-5) and c.sums["is_kl_k3"] > 0
    assert not c.weights.requires_grad


def test_no_gradient_flows_through_the_weight() -> None:
    old, rollout, mask = setup()
    old = old.clone().requires_grad_(True)
    c = rollout_correction(old, rollout, mask, CorrectionConfig())
    assert c.weights.grad_fn is None


def test_token_mask_drops_tokens_outside_the_band() -> None:
    old, rollout, mask = setup()
    c = rollout_correction(old, rollout, mask, CorrectionConfig(mode="mask", band_low=0.5, band_high=2.0))
    assert c.weights.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert c.sums["is_masked_frac"] == 2


def test_sequence_mask_drops_whole_rollouts() -> None:
    old = torch.zeros(6)
    rollout = torch.tensor([0.0, 0.0, -0.1, -1.0, -1.2, -0.9])  # rollout 1's geometric mean ratio ~ e^1.03
    mask = torch.ones(6, dtype=torch.bool)
    index = torch.tensor([0, 0, 0, 1, 1, 1])
    c = rollout_correction(old, rollout, mask, CorrectionConfig(mode="sequence_mask", band_high=2.0), index)
    assert c.weights.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert c.sums["is_masked_frac"] == 3


def test_none_mode_measures_only() -> None:
    old, rollout, mask = setup()
    c = rollout_correction(old, rollout, mask, CorrectionConfig(mode="none"))
    assert c.weights.tolist() == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    assert c.sums["is_kl_k3"] > 0


def test_bad_band_is_refused() -> None:
    with pytest.raises(ValueError, match="band_low"):
        CorrectionConfig(band_low=2.0, band_high=1.0)
