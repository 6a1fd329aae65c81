"""Forward passes over a packed tree: per-token log-probs, entropy and (for PPO) values.

The decoder runs once over all unique tokens with the ancestor-only mask and depth position ids;
the language-model head then runs only on the rows that predict a trained token (the parent of each
generated token, via transformers' `logits_to_keep`), which keeps the [tokens x vocabulary] logits small: with Qwen's 151k vocabulary the
full logits of a 4k-token tree would be 2.4 GB in float32.

`branch_logprobs` is the reference: each root-to-leaf branch run on its own as an ordinary causal
sequence. Tests check that both give the same values and gradients once shared tokens are counted once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainers.tree_batch import TreeBatch


@dataclass
class TreeOutput:
    """Per-token results, shape [T]; zero where a token is not a target (context, roots)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    target_mask: torch.Tensor  # which tokens were computed


def unwrap(model: nn.Module) -> nn.Module:
    """The transformers causal LM inside a PEFT or FSDP wrapper (LoRA layers stay injected in it)."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    inner = unwrap(model)
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else getattr(inner, "model")
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else inner.lm_head
    if decoder is None or head is None:
        raise TypeError(f"{type(inner).__name__} is not a causal LM with a decoder and an output head")
    return decoder, head


def hidden_states(decoder: nn.Module, batch: TreeBatch) -> torch.Tensor:
    """Last hidden state of every packed token, [T, H]."""
    out = decoder(**batch.model_inputs(decoder), use_cache=False)
    return out.last_hidden_state[0]


def token_logprobs_from_logits(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) and the entropy of each row of logits (float32 for a stable log-softmax)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def tree_logprobs(
    model: nn.Module,
    batch: TreeBatch,
    target_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> TreeOutput:
    """Log-probs (and entropy) of the target tokens of a packed tree; targets default to `loss_mask`.

    Runs the model's own forward (so PEFT and FSDP wrappers see the call) with `logits_to_keep` set to
    the rows that predict a target: the output head never sees the other rows.
    """
    target_mask = batch.loss_mask if target_mask is None else target_mask
    target_mask = target_mask & (batch.parents >= 0)
    inputs = batch.model_inputs(unwrap(model))
    device = inputs["input_ids"].device  # type: ignore[union-attr]
    target_mask = target_mask.to(device)
    idx = target_mask.nonzero().squeeze(-1)
    out = model(**inputs, logits_to_keep=batch.parents.to(device)[idx], use_cache=False)
    logp_t, ent_t = token_logprobs_from_logits(out.logits[0], batch.input_ids.to(device)[idx], temperature)
    logprobs = torch.zeros(batch.num_tokens, dtype=torch.float32, device=logp_t.device).index_put((idx,), logp_t)
    entropy = torch.zeros_like(logprobs)
    if with_entropy:
        entropy = entropy.index_put((idx,), ent_t)
    return TreeOutput(logprobs=logprobs, entropy=entropy, target_mask=target_mask)


def branch_logprobs(model: nn.Module, batch: TreeBatch, *, temperature: float = 1.0) -> list[torch.Tensor]:
    """Reference: each branch as its own causal sequence; log-prob of every token after the first, [len-1]."""
    device = next(model.parameters()).device
    out = []
    for nodes in batch.branches():
        ids = batch.input_ids[torch.as_tensor(nodes)].to(device)
        logits = model(input_ids=ids[None], use_cache=False).logits[0, :-1]
        logp, _ = token_logprobs_from_logits(logits, ids[1:], temperature)
        out.append(logp)
    return out


class Critic(nn.Module):
    """PPO's value model: its own transformer trunk plus a scalar head.

    `value[t]` estimates the return from the state in which token t is chosen, so it is read at the
    hidden state of `parents[t]`, the same row whose logits predict t.
    """

    def __init__(self, backbone: nn.Module, *, train_trunk: bool = True) -> None:
        super().__init__()
        decoder, head = decoder_and_head(backbone)
        self.decoder = decoder
        self.train_trunk = train_trunk
        if not train_trunk:  # a value head on the frozen base model's features: no backward through a 2nd trunk
            self.decoder.requires_grad_(False)
        hidden = head.weight.shape[1]
        self.value_head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, batch: TreeBatch) -> torch.Tensor:
        if self.train_trunk:
            hidden = hidden_states(self.decoder, batch)
        else:
            with torch.no_grad():
                hidden = hidden_states(self.decoder, batch)
        parents = batch.parents.to(hidden.device)
        values = self.value_head(hidden[parents.clamp(min=0)]).squeeze(-1).float()
        return torch.where(parents >= 0, values, torch.zeros_like(values))
