"""The GRPO and PPO losses and gradients of a fixed synthetic batch, pinned to recorded values.

The expected numbers were computed by the trainer before its loss code was reorganised; a refactor that
changes what the loss computes (a sign, a clip bound, a normaliser, a KL or correction term) moves them
far outside the tolerance, while a different float32 summation order on another CPU does not.
"""

from __future__ import annotations

import torch

from trainers.core import OptimConfig, Trainer
from trainers.correction import CorrectionConfig
from trainers.grpo import GRPO, GRPOConfig, grpo_loss
from trainers.ppo import PPO, PPOConfig
from trainers.synthetic_batches import SyntheticRollouts
from trainers.tree_forward import Critic

from .conftest import VOCAB, small_qwen3

CORRECTION = CorrectionConfig(mode="truncate", cap=1.5)
GRPO_CONFIG = GRPOConfig(entropy_coef=0.01, kl_coef=0.05, eps_low=0.1, eps_high=0.15, correction=CORRECTION)
PPO_CONFIG = PPOConfig(
    entropy_coef=0.01,
    kl_coef=0.05,
    eps_low=0.1,
    eps_high=0.15,
    lam=0.9,
    gamma=0.99,
    value_clip=0.05,
    vf_coef=0.7,
    correction=CORRECTION,
)

# Tolerance: every number below is a float32 reduction (a 2-layer model's forward and backward, a
# log-softmax over 512 logits, sums over a few hundred tokens). Reordering such sums changes them by a few
# float32 ulps per term relative to the sum of the terms' magnitudes (~1e-6 relative for these sizes);
# 1e-4 relative to that magnitude leaves a 100x margin and still catches any change of formula, which
# moves these numbers by percent.
RTOL = 1e-4


def batch():
    small = dict(turns=2, gen_tokens=(4, 8), tool_tokens=(3, 8), system_tokens=10)
    return SyntheticRollouts(
        vocab=VOCAB, group_size=3, tasks_per_step=2, harnesses=("A", "B"), seed=11, **small
    ).next_batch()


def shift_old_logprobs(mb) -> None:  # noqa: ANN001
    """Pretend the batch was sampled by slightly different weights, so that clipping and correction act."""
    g = torch.Generator().manual_seed(mb.num_tokens)
    noise = 0.3 * torch.randn(mb.num_tokens, generator=g)
    mb.old_logprobs = torch.where(mb.loss_mask, mb.rollout_logprobs + noise, torch.zeros(mb.num_tokens))


def grad_summary(modules) -> tuple[float, float]:  # noqa: ANN001
    """(g . v, |g| . |v|) for a fixed random direction v: one number that moves with any gradient change, and its scale."""
    g = torch.Generator().manual_seed(0)
    dot = scale = 0.0
    for module in modules:
        for p in module.parameters():
            if p.grad is None:
                continue
            v = torch.randn(p.shape, generator=g, dtype=torch.float64)
            dot += float((p.grad.double() * v).sum())
            scale += float((p.grad.double().abs() * v.abs()).sum())
    return dot, scale


def grpo_values() -> dict[str, float]:
    model, ref = small_qwen3(0), small_qwen3(3)
    trainer = Trainer(model, GRPO(GRPO_CONFIG), OptimConfig(token_budget=150), ref_model=ref)
    micro_batches, _ = trainer.algorithm.prepare(trainer, batch())
    n = float(sum(mb.num_loss_tokens for mb in micro_batches))
    loss = torch.zeros(())
    for mb in micro_batches:
        shift_old_logprobs(mb)
        loss = loss + trainer.algorithm.micro_batch_loss(trainer, mb, n).loss
    loss.backward()
    dot, scale = grad_summary([model])
    whole, metrics = grpo_loss(small_qwen3(0), batch().forests, config=GRPO_CONFIG, token_budget=150, ref_model=ref)
    return {
        "loss": float(loss.detach()),
        "grad_dot": dot,
        "grad_scale": scale,
        "grpo_loss": float(whole.detach()),
        "kl_ref": metrics["kl_ref"],
    }


def ppo_values() -> dict[str, float]:
    model, ref = small_qwen3(0), small_qwen3(3)
    critic = Critic(small_qwen3(1))
    torch.nn.init.normal_(critic.value_head.weight, std=0.3, generator=torch.Generator().manual_seed(2))
    trainer = Trainer(model, PPO(PPO_CONFIG), OptimConfig(token_budget=150), critic=critic, ref_model=ref)
    micro_batches, _ = trainer.algorithm.prepare(trainer, batch())
    n = float(sum(mb.num_loss_tokens for mb in micro_batches))
    loss = torch.zeros(())
    value_loss = 0.0
    for mb in micro_batches:
        shift_old_logprobs(mb)
        mb.old_values = mb.old_values + 0.1  # so that value clipping acts
        parts = trainer.algorithm.micro_batch_loss(trainer, mb, n)
        loss = loss + parts.loss
        value_loss += parts.sums["value_loss"]
    loss.backward()
    dot, scale = grad_summary([model, critic])
    return {"loss": float(loss.detach()), "grad_dot": dot, "grad_scale": scale, "value_loss": value_loss}


EXPECTED_GRPO = {
    "loss": 0.44150054454803467,
    "grad_dot": -0.205832895264582,
    "grad_scale": 35.75493278899739,
    "grpo_loss": 0.037988342344760895,
    "kl_ref": 1.904184681708824,
}
EXPECTED_PPO = {
    "loss": 1.3411858081817627,
    "grad_dot": 3.6719187071958244,
    "grad_scale": 415.97311769881213,
    "value_loss": 280.2607650756836,
}


def close(actual: dict[str, float], expected: dict[str, float], scales: dict[str, float]) -> None:
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        # a loss is a mean over tokens of O(1) terms (advantage x ratio, KL, entropy) that can cancel: its
        # scale is at least 1, not its own (possibly small) value
        scale = scales.get(key, max(1.0, abs(value)))
        assert abs(actual[key] - value) <= RTOL * scale, (key, actual[key], value)


def test_grpo_loss_and_gradient_are_unchanged() -> None:
    actual = grpo_values()
    assert actual["loss"] != 0 and actual["grad_scale"] > 0
    close(actual, EXPECTED_GRPO, {"grad_dot": EXPECTED_GRPO["grad_scale"]})


def test_ppo_loss_and_gradient_are_unchanged() -> None:
    actual = ppo_values()
    assert actual["loss"] != 0 and actual["grad_scale"] > 0
    close(actual, EXPECTED_PPO, {"grad_dot": EXPECTED_PPO["grad_scale"]})
