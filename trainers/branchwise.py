"""The per-branch baseline: every root-to-leaf branch run as its own causal sequence.

This is how trainers without tree packing consume multi-branch rollouts (the shared history is
recomputed once per branch). To train the same objective, a unique token's log-prob (and entropy) is
the mean of its values over the branches through it: equal values, and a gradient that is the mean of
the branches' gradients, so the loss and its gradient equal the packed tree's; only the cost differs.
Used as the reference in tests and as the baseline in benchmarks/trainer_bench.py.
"""

from __future__ import annotations

import torch
from torch import nn

from clawgym_env.trajectory.packing import TokenLogprobs, token_logprobs_from_logits
from trainers.grpo import GRPO, GRPOConfig
from trainers.losses import LossParts, policy_loss
from trainers.tree_batch import TreeBatch


def branchwise_logprobs(model: nn.Module, mb: TreeBatch, temperature: float = 1.0) -> TokenLogprobs:
    """Per-token log-probs and entropies [T] of the trained tokens, each the mean over its branches."""
    device = next(model.parameters()).device
    branches = mb.branches()
    multiplicity = torch.zeros(mb.num_tokens, device=device)
    for nodes in branches:
        multiplicity[torch.as_tensor(nodes, device=device)] += 1
    logprobs = torch.zeros(mb.num_tokens, device=device)
    entropy = torch.zeros(mb.num_tokens, device=device)
    for nodes in branches:
        nodes_t = torch.as_tensor(nodes, device=device)
        targets = nodes_t[1:]
        mask = mb.loss_mask.to(device)[targets]
        if not bool(mask.any()):
            continue
        ids = mb.input_ids.to(device)[nodes_t]
        # like the packed forward, only the rows that predict a trained token go through the LM head
        rows = mask.nonzero().squeeze(-1)
        logits = model(input_ids=ids[None], logits_to_keep=rows, use_cache=False).logits[0]
        logp_rows, ent_rows = token_logprobs_from_logits(logits, ids[1:][rows], temperature)
        at = targets[rows]
        logprobs = logprobs.index_add(0, at, logp_rows / multiplicity[at])
        entropy = entropy.index_add(0, at, ent_rows / multiplicity[at])
    return TokenLogprobs(logprobs=logprobs, entropy=entropy)


def branchwise_policy_loss(model: nn.Module, mb: TreeBatch, normalizer: float, config: GRPOConfig) -> LossParts:
    current = branchwise_logprobs(model, mb, config.temperature)
    return policy_loss(model, mb, normalizer, config, current=current)


class BranchwiseGRPO(GRPO):
    """GRPO trained branch by branch (the baseline); same objective, no shared-prefix reuse."""

    name = "grpo-branchwise"

    def micro_batch_loss(self, trainer, mb: TreeBatch, normalizer: float) -> LossParts:  # noqa: ANN001
        return branchwise_policy_loss(trainer.model, mb, normalizer, self.config)
