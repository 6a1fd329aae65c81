"""Worker for test_fsdp.py: one GRPO update on a fixed batch, alone or under torchrun with FSDP2.

    python tests/trainers/fsdp_worker.py OUT.json                          # one process
    torchrun --nproc_per_node 2 tests/trainers/fsdp_worker.py OUT.json     # FSDP2 on gloo
Writes (rank 0) the step's loss, token count, grad norm and the full weights' checksums after the update.
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from trainers import distributed as D
from trainers.core import OptimConfig, Trainer
from trainers.grpo import GRPO
from trainers.model import export_weights
from trainers.synthetic import SyntheticRollouts


def main(out: str) -> None:
    torch.set_num_threads(1)
    D.init_from_env("gloo")
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, tie_word_embeddings=True, initializer_range=0.2,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config).float()
    if D.is_distributed():
        D.shard_model(model)
    small = dict(turns=2, gen_tokens=(4, 8), tool_tokens=(3, 8), system_tokens=10)
    batch = SyntheticRollouts(vocab=512, group_size=3, tasks_per_step=1, harnesses=("A", "B"), seed=5, **small).next_batch()
    trainer = Trainer(model, GRPO(), OptimConfig(lr=1e-2, token_budget=120))
    metrics = trainer.update(batch)
    weights = export_weights(model)
    if D.rank() == 0:
        result = {
            "world": D.world_size(),
            "loss": metrics["loss"],
            "tokens": metrics["tokens"],
            "micro_batches": metrics["micro_batches"],
            "grad_norm": metrics["grad_norm"],
            "weights": {k: float(v.double().sum()) for k, v in weights.items()},
        }
        with open(out, "w") as f:
            json.dump(result, f)
    if D.is_distributed():
        # every rank finishes before any tears gloo down: a rank destroying the group while the other still
        # has a connection open aborted with "terminate called without an active exception" (seen in CI)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
