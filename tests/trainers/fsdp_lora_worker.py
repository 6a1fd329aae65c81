"""Worker for test_fsdp.py: a LoRA policy's checkpoint, alone or under torchrun with FSDP2.

    python tests/trainers/fsdp_lora_worker.py OUT.json                          # one process
    torchrun --nproc_per_node 2 tests/trainers/fsdp_lora_worker.py OUT.json     # FSDP2 on gloo
Writes (rank 0) the checkpoint's format and its model tensors' names and checksums.
"""

from __future__ import annotations

import faulthandler
import json
import sys
from pathlib import Path

import torch

from tests.trainers.conftest import small_qwen3
from trainers import distributed as D
from trainers.core import OptimConfig, Trainer
from trainers.grpo import GRPO
from trainers.model import LoraSettings, apply_lora


def main(out: str) -> None:
    faulthandler.enable()  # a rank that aborts prints where each of its threads was
    torch.set_num_threads(1)
    D.init_from_env("gloo")
    model = apply_lora(small_qwen3(seed=0), LoraSettings(enabled=True, r=4))  # its head is tied, as Qwen2.5's
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
    D.shutdown()  # every rank done with gloo before any tears it down


if __name__ == "__main__":
    main(sys.argv[1])
