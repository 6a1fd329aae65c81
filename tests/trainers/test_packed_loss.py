"""The packed-tree loss equals the branch-wise loss with shared tokens counted once (values and gradients)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clawgym_env.trajectory.packing import tree_logprobs
from trainers.correction import CorrectionConfig, rollout_correction
from trainers.grpo import GRPOConfig, grpo_loss, grpo_micro_batches
from trainers.rollout_batch import RolloutBatch
from trainers.synthetic_batches import synthetic_forest
from trainers.tree_forward import branch_logprobs

from .conftest import VOCAB, assert_same_loss_and_gradients, small_qwen3

CONFIG = GRPOConfig(entropy_coef=0.01, correction=CorrectionConfig(mode="truncate", cap=1.5))


def rollouts() -> RolloutBatch:
    forests = [
        synthetic_forest(s, vocab=VOCAB, rollout_id=f"r{s}", task_id="t", reward=r)
        for s, r in zip(range(4), [1.0, 0.0, 0.5, 0.2])
    ]
    assert all(f.num_branches >= 2 for f in forests[:2])
    return RolloutBatch.from_forests(forests)


def branchwise_loss(model, batch: RolloutBatch, config: GRPOConfig) -> torch.Tensor:
    """Reference: every branch on its own, each unique token weighted 1/(branches through it)."""
    (mb,), _ = grpo_micro_batches(batch, config, token_budget=1 << 30)
    per_branch = branch_logprobs(model, mb)
    total_tokens = mb.num_loss_tokens
    multiplicity = torch.zeros(mb.num_tokens)
    for nodes in mb.branches():
        multiplicity[torch.as_tensor(nodes)] += 1
    loss = torch.zeros(())
    for nodes, logp_b in zip(mb.branches(), per_branch):
        nodes_t = torch.as_tensor(nodes[1:])
        mask = mb.loss_mask[nodes_t]
        ids = mb.input_ids[torch.as_tensor(nodes)]
        logits = model(input_ids=ids[None]).logits[0, :-1].float()
        lp_all = torch.log_softmax(logits, -1)
        entropy = -(lp_all.exp() * lp_all).sum(-1)
        corr = rollout_correction(logp_b.detach(), mb.rollout_logprobs[nodes_t], mask, config.correction)
        # the clipped objective written out again, independently of trainers.losses
        adv = mb.advantages[nodes_t]
        ratio = (logp_b - logp_b.detach()).exp()
        surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - config.eps_low, 1 + config.eps_high) * adv)
        per_token = -surrogate * corr.weights - config.entropy_coef * entropy
        loss = loss + (per_token * mask.float() / multiplicity[nodes_t]).sum() / total_tokens
    return loss


def grads(model) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_loss_and_gradients_equal_branchwise(impl: str) -> None:
    batch = rollouts()
    model = small_qwen3(0, impl)
    packed, metrics = grpo_loss(model, batch.forests, batch.rewards, config=CONFIG)
    packed.backward()
    g_packed = grads(model)
    model.zero_grad()
    reference = branchwise_loss(model, batch, CONFIG)
    reference.backward()
    g_ref = grads(model)
    assert metrics["tokens"] > 0 and abs(packed.item()) > 1e-4
    assert_same_loss_and_gradients(packed, reference, g_packed, g_ref)


def test_micro_batches_accumulate_to_the_whole_batch_gradient() -> None:
    batch = rollouts()
    model = small_qwen3(0)
    whole, _ = grpo_loss(model, batch.forests, batch.rewards, config=CONFIG)
    whole.backward()
    g_whole = grads(model)
    model.zero_grad()
    sizes = sorted(f.num_tokens for f in batch.forests)
    split, metrics = grpo_loss(model, batch.forests, batch.rewards, config=CONFIG, token_budget=sizes[-1])
    split.backward()
    assert_same_loss_and_gradients(whole, split, g_whole, grads(model))


def test_tree_logprobs_equal_the_full_logits_at_the_parent_rows() -> None:
    """Only the rows that predict a trained token go through the head; they equal the full logits' rows."""
    batch = rollouts()
    model = small_qwen3(0)
    (mb,), _ = grpo_micro_batches(batch, GRPOConfig(), token_budget=1 << 30)
    ours = tree_logprobs(model, mb.packed, temperature=0.7)
    full = torch.log_softmax(model(**mb.model_inputs(model)).logits[0].float() / 0.7, -1)
    m = mb.loss_mask
    parents, ids = mb.parents[m], mb.input_ids[m]
    # the same float32 matmul and log-softmax over 512 logits on the same rows: values of magnitude ~6 agree
    # to a few float32 ulps (~1e-6); 1e-5 allows a different reduction order in the head on fewer rows
    assert torch.allclose(ours.logprobs[m], full[parents, ids], atol=1e-5)
    assert torch.allclose(ours.entropy[m], -(full[parents].exp() * full[parents]).sum(-1), atol=1e-5)
    assert torch.all(ours.logprobs[~m] == 0) and torch.all(ours.entropy[~m] == 0)


def test_shared_tokens_are_fewer_than_branch_tokens() -> None:
    batch = rollouts()
    (mb,), _ = grpo_micro_batches(batch, GRPOConfig(), token_budget=1 << 30)
    assert mb.num_tokens < mb.branch_tokens
    assert np.unique(np.concatenate(mb.branches())).size == mb.num_tokens


def test_library_branchwise_baseline_trains_the_same_objective() -> None:
    from trainers.branchwise import branchwise_policy_loss
    from trainers.losses import policy_loss

    batch = rollouts()
    model = small_qwen3(0)
    (mb,), _ = grpo_micro_batches(batch, CONFIG, token_budget=1 << 30)
    n = float(mb.num_loss_tokens)
    packed = policy_loss(model, mb, n, CONFIG).loss
    packed.backward()
    g_packed = grads(model)
    model.zero_grad()
    baseline = branchwise_policy_loss(model, mb, n, CONFIG).loss
    baseline.backward()
    assert_same_loss_and_gradients(packed, baseline, g_packed, grads(model))


def test_gradient_checkpointing_keeps_loss_and_gradients() -> None:
    from trainers.model import enable_gradient_checkpointing

    batch = rollouts()
    model = small_qwen3(0)
    plain, _ = grpo_loss(model, batch.forests, batch.rewards, config=CONFIG)
    plain.backward()
    g_plain = grads(model)
    model.zero_grad()
    enable_gradient_checkpointing(model)
    model.train()
    assert model.is_gradient_checkpointing
    ckpt, _ = grpo_loss(model, batch.forests, batch.rewards, config=CONFIG)
    ckpt.backward()
    assert_same_loss_and_gradients(plain, ckpt, g_plain, grads(model))
