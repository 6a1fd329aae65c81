"""Worker for test_fsdp.py: one GRPO update on a fixed batch, alone or under torchrun with FSDP2.

    python tests/trainers/fsdp_worker.py OUT.json                          # one process
    torchrun --nproc_per_node 2 tests/trainers/fsdp_worker.py OUT.json     # FSDP2 on gloo
Writes (rank 0) the step's loss, token count, grad norm and the full weights' checksums after the update, and
whether rank 0's inference engine received them (version 1, the same tensors).
"""

from __future__ import annotations

import copy
import faulthandler
import json
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from clawgym_env.engines.transformers_engine import TransformersEngine
from trainers import distributed as D
from trainers.core import OptimConfig, Trainer
from trainers.grpo import GRPO
from trainers.model import export_weights
from trainers.synthetic_batches import SyntheticRollouts
from trainers.tree_forward import decoder_and_head, unwrap


def main(out: str) -> None:
    faulthandler.enable()  # a rank that aborts prints where each of its threads was
    torch.set_num_threads(1)
    D.init_from_env("gloo")
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    model = Qwen3ForCausalLM(config).float()
    # as in trainers.loop: only rank 0 holds an inference engine (a real one, on its own copy of the model);
    # every rank must still join the weight export that feeds it after the update
    engine = TransformersEngine(copy.deepcopy(model)) if D.rank() == 0 else None
    if D.is_distributed():
        D.shard_model(model)
    small = dict(turns=2, gen_tokens=(4, 8), tool_tokens=(3, 8), system_tokens=10)
    batch = SyntheticRollouts(
        vocab=512, group_size=3, tasks_per_step=1, harnesses=("A", "B"), seed=5, **small
    ).next_batch()
    from torch.distributed.fsdp import FSDPModule

    # FSDP2 shards in place: nothing to unwrap, the decoder and head are found on the sharded model itself
    decoder, head = decoder_and_head(model)
    unwrap_ok = unwrap(model) is model and decoder is model.model and head is model.lm_head
    # Adam's eps at 1e-3: its first step moves a weight by lr * g / (|g| + eps), which with the default 1e-8
    # turns rounding noise in a near-zero gradient entry into a full +-lr step; with 1e-3 the step is
    # Lipschitz in g (|d step| <= lr / eps * |d g| = 10 |d g|), so rounding stays rounding
    trainer = Trainer(model, GRPO(), OptimConfig(lr=1e-2, eps=1e-3, token_budget=120), engine=engine)
    metrics = trainer.update(batch)
    weights = export_weights(model)
    # the step's (clipped) gradient, still on the parameters after the optimizer step; gathered under FSDP
    g = torch.Generator().manual_seed(0)
    grad_dot = grad_scale = 0.0
    for p in model.parameters():
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        v = torch.randn(grad.shape, generator=g, dtype=torch.float64)
        grad_dot += float((grad.double() * v).sum())
        grad_scale += float((grad.double().abs() * v.abs()).sum())
    if D.rank() == 0:
        result = {
            "world": D.world_size(),
            "sharded": isinstance(model, FSDPModule),
            "unwrap_ok": unwrap_ok,
            "loss": metrics["loss"],
            "tokens": metrics["tokens"],
            "micro_batches": metrics["micro_batches"],
            "grad_norm": metrics["grad_norm"],
            "grad_dot": grad_dot,
            "grad_scale": grad_scale,
            "weights": {k: float(v.double().sum()) for k, v in weights.items()},
            "engine_version": engine.policy_version,
            "engine_has_weights": all(torch.equal(p, weights[k]) for k, p in engine.model.named_parameters()),
        }
        with open(out, "w") as f:
            json.dump(result, f)
    D.shutdown()  # every rank done with gloo before any tears it down


if __name__ == "__main__":
    main(sys.argv[1])
