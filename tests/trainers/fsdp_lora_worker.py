"""Worker for test_fsdp.py: a LoRA policy's checkpoint, alone or under torchrun with FSDP2.

    python tests/trainers/fsdp_lora_worker.py OUT.json                          # one process
    torchrun --nproc_per_node 2 tests/trainers/fsdp_lora_worker.py OUT.json     # FSDP2 on gloo
Writes (rank 0) the checkpoint's format and its model tensors' names and checksums.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from trainers import distributed as D
from trainers.core import OptimConfig, Trainer
from trainers.grpo import GRPO
from trainers.model import LoraSettings, apply_lora


def main(out: str) -> None:
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
    )
    model = apply_lora(Qwen3ForCausalLM(config).float(), LoraSettings(enabled=True, r=4))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.linspace(0, 1, p.numel()).reshape(p.shape))  # the same on every rank
    if D.is_distributed():
        D.shard_model(model)
    trainer = Trainer(model, GRPO(), OptimConfig(), base_model={"name": "tiny", "dtype": "float32", "seed": 0})
    path = trainer.save_checkpoint(Path(out).with_suffix(".pt"))  # collective under FSDP
    if D.rank() == 0:
        state = torch.load(path, weights_only=False)
        result = {
            "format": state["model_format"],
            "model": {k: float(v.double().sum()) for k, v in state["model"].items()},
        }
        Path(out).write_text(json.dumps(result))
    if D.is_distributed():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
