"""The per-branch baseline: every root-to-leaf branch run as its own causal sequence.

This is how trainers without tree packing consume multi-branch rollouts (the shared history is
recomputed once per branch). To train the same objective, each unique token's loss is weighted by
1 / (number of branches through it), so the loss and its gradient equal the packed tree's; only the
cost differs. Used as the reference in tests and as the baseline in benchmarks/trainer_bench.py.
"""

from __future__ import annotations

import torch
from torch import nn

from trainers.correction import rollout_correction
from trainers.grpo import GRPO, GRPOConfig
from trainers.losses import LossParts, MetricSums, policy_loss
from trainers.tree_batch import TreeBatch
from trainers.tree_forward import token_logprobs_from_logits


def branchwise_policy_loss(model: nn.Module, mb: TreeBatch, normalizer: float, config: GRPOConfig) -> LossParts:
    multiplicity = torch.zeros(mb.num_tokens)
    branches = mb.branches()
    for nodes in branches:
        multiplicity[torch.as_tensor(nodes)] += 1
    device = next(model.parameters()).device
    total = None
    sums = MetricSums()
    for nodes in branches:
        nodes_t = torch.as_tensor(nodes)
        targets = nodes_t[1:]
        mask = mb.loss_mask[targets].to(device)
        if not bool(mask.any()):
            continue
        ids = mb.input_ids[nodes_t].to(device)
        # like the packed forward, only the rows that predict a trained token go through the LM head
        rows = mask.nonzero().squeeze(-1)
        logits = model(input_ids=ids[None], logits_to_keep=rows, use_cache=False).logits[0]
        logp_rows, ent_rows = token_logprobs_from_logits(logits, ids[1:][rows], config.temperature)
        logp = torch.zeros(len(targets), device=device).index_put((rows,), logp_rows)
        entropy = torch.zeros(len(targets), device=device).index_put((rows,), ent_rows)
        old = logp.detach()
        corr = rollout_correction(old, mb.rollout_logprobs[targets].to(device), mask, config.correction)
        parts = policy_loss(
            logp,
            old,
            mb.advantages[targets].to(device),
            mask,
            corr.weights / multiplicity[targets].to(device),
            normalizer,
            eps_low=config.eps_low,
            eps_high=config.eps_high,
            entropy=entropy,
        )
        weight = mask.float() / multiplicity[targets].to(device)
        loss = parts.loss - config.entropy_coef * (entropy * weight).sum() / normalizer
        total = loss if total is None else total + loss
        sums.add(parts.sums)
    if total is None:
        total = next(model.parameters()).sum() * 0.0
    return LossParts(loss=total, sums=dict(sums.sums))


class BranchwiseGRPO(GRPO):
    """GRPO trained branch by branch (the baseline); same objective, no shared-prefix reuse."""

    name = "grpo-branchwise"

    def micro_batch_loss(self, trainer, mb: TreeBatch, normalizer: float) -> LossParts:  # noqa: ANN001
        return branchwise_policy_loss(trainer.model, mb, normalizer, self.config)
