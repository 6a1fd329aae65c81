"""A LoRA policy's checkpoint holds its adapter and the base model's identity, not the base weights."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.trainers.conftest import small_qwen3
from trainers.core import OptimConfig, Trainer
from trainers.grpo import GRPO, GRPOConfig
from trainers.model import LoraSettings, apply_lora

BASE = {"name": "small-qwen3", "dtype": "float32", "seed": 0}


def _trainer(lora: LoraSettings | None = None, base: dict | None = BASE) -> Trainer:
    model = small_qwen3(seed=0)
    if lora is not None:
        model = apply_lora(model, lora)
    return Trainer(model, GRPO(GRPOConfig()), OptimConfig(), base_model=base)


def test_an_adapter_checkpoint_is_small_and_resumes_exactly(tmp_path) -> None:
    lora = LoraSettings(enabled=True, r=4, target_modules=["q_proj", "v_proj"])
    trained = _trainer(lora)
    with torch.no_grad():
        for name, p in trained.model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.3)
    trained.step = 5
    saved = trained.save_checkpoint(tmp_path / "lora.pt")
    full = _trainer().save_checkpoint(tmp_path / "full.pt")
    state = torch.load(saved, weights_only=False)
    assert state["model_format"] == "adapter" and state["base_model"] == BASE
    assert state["model"] and all("lora_" in k for k in state["model"])
    assert saved.stat().st_size * 5 < full.stat().st_size  # optimizer state included in both

    fresh = _trainer(lora)
    fresh.load_checkpoint(saved)
    assert fresh.step == 5
    for (name, a), b in zip(trained.model.state_dict().items(), fresh.model.state_dict().values()):
        assert torch.equal(a, b), name  # the adapters loaded, the base weights are the ones the run loaded


def test_an_adapter_checkpoint_refuses_another_base_or_other_lora_settings(tmp_path) -> None:
    lora = LoraSettings(enabled=True, r=4, target_modules=["q_proj", "v_proj"])
    saved = _trainer(lora).save_checkpoint(tmp_path / "lora.pt")
    with pytest.raises(ValueError, match="trained on"):
        _trainer(lora, base={**BASE, "name": "another-model"}).load_checkpoint(saved)
    with pytest.raises(KeyError, match="same model.lora settings"):
        _trainer(LoraSettings(enabled=True, r=4, target_modules=["q_proj"])).load_checkpoint(saved)


def test_adapter_sync_needs_an_engine_that_loads_adapters() -> None:
    from trainers.main import compose

    with pytest.raises(ValueError, match="vllm or vllm_server"):
        compose(["model.lora.enabled=true", "model.lora.sync=adapter", "run_dir=/tmp/x"])
    for engine in ("vllm", "vllm_server"):
        assert compose(["model.lora.enabled=true", "model.lora.sync=adapter", f"engine={engine}", "run_dir=/tmp/x"])
    with pytest.raises(ValueError, match="LoRA policy"):
        Trainer(copy.deepcopy(small_qwen3()), GRPO(GRPOConfig()), adapter_sync=True)


# A LoRA model in miniature: 256 MiB of frozen base weights and a small trainable adapter; prints how much the
# process's resident high-water mark rose while its checkpoint state was copied, in MiB. The mark is reset to the
# current size first (clear_refs 5): a fresh machine's first imports can peak higher than the copy itself.
STATE_COPY = """
import sys, torch
from trainers.core import _module_state

def high_water_kb():
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1])

model = torch.nn.Sequential(torch.nn.Linear(8192, 8192, bias=False), torch.nn.Linear(8192, 8, bias=False))
model[0].weight.requires_grad_(False)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = high_water_kb()
state = _module_state(model, trainable_only=sys.argv[1] == "1")
assert list(state) == (["1.weight"] if sys.argv[1] == "1" else ["0.weight", "1.weight"]), list(state)
print((high_water_kb() - before) // 1024)
"""


def test_an_adapter_checkpoint_never_copies_the_frozen_base_weights() -> None:
    """Copying the whole state and then keeping the adapters held a second copy of the base model while a
    checkpoint was written: 2.4 GB above the main job's resident memory for the 0.5B model."""
    import subprocess
    import sys

    def rise_mb(trainable_only: bool) -> int:
        out = subprocess.run(
            [sys.executable, "-c", STATE_COPY, "1" if trainable_only else "0"], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return int(out.stdout.split()[-1])

    assert rise_mb(trainable_only=False) > 200  # the whole state: the 256 MiB base weights copied
    assert rise_mb(trainable_only=True) < 50
