"""The trainer's model-side pieces beyond the packed log-probs: PPO's critic and the per-branch reference.

The per-token log-probs and entropies of a packed tree come from one forward pass,
`clawgym_env.trajectory.packing.tree_logprobs` (the decoder over all unique tokens with the ancestor-only
mask; the output head only on the rows that predict a trained token). `Critic` reads a value at the same
rows. `branch_logprobs` is the reference: each root-to-leaf branch run on its own as an ordinary causal
sequence; tests check that both give the same values and gradients once shared tokens are counted once.
"""

from __future__ import annotations

import torch
from torch import nn

from clawgym_env.trajectory.packing import token_logprobs_from_logits
from trainers.tree_batch import TreeBatch


def unwrap(model: nn.Module) -> nn.Module:
    """The transformers causal LM inside a PEFT wrapper (its LoRA layers stay injected in it).

    FSDP2 needs no unwrapping: `fully_shard` shards a module in place and keeps its class (it only mixes
    in `FSDPModule`), so a sharded model is returned as it is and still has its decoder and output head.
    """
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    inner = unwrap(model)
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else inner.model
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else inner.lm_head
    if decoder is None or head is None:
        raise TypeError(f"{type(inner).__name__} is not a causal LM with a decoder and an output head")
    return decoder, head


def hidden_states(decoder: nn.Module, batch: TreeBatch) -> torch.Tensor:
    """Last hidden state of every packed token, [T, H]."""
    out = decoder(**batch.model_inputs(decoder), use_cache=False)
    return out.last_hidden_state[0]


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
