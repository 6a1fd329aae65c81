"""A LoRA adapter as the trainer sends it to an engine: the low-rank tensors and the settings that read them.

A LoRA policy changes only its adapters, about a hundredth of the adapted layers' weights. An engine that
serves adapters (vLLM with `enable_lora`) receives this instead of the merged layers: the trainer writes it
as a PEFT folder (`adapter_config.json` + `adapter_model.safetensors`, the format vLLM's LoRA loader and
`peft.PeftModel.from_pretrained` read) and the engine loads it under a versioned name.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class LoraAdapter:
    """PEFT-named tensors (`base_model.model.<module>.lora_A.weight`, ...) and their LoRA settings."""

    tensors: dict[str, Any]
    rank: int
    alpha: int
    target_modules: list[str]
    extra_config: dict[str, Any] = field(default_factory=dict)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def config(self) -> dict[str, Any]:
        """adapter_config.json: what PEFT and vLLM need to apply the tensors."""
        return {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": 0.0,
            "target_modules": sorted(self.target_modules),
            "bias": "none",
            "fan_in_fan_out": False,
            "modules_to_save": None,
            "use_rslora": False,
            **self.extra_config,
        }

    def save(self, folder: str | os.PathLike[str], dtype: Any = None) -> Path:
        """Write the PEFT folder atomically (a reader never sees half of it); `dtype` casts the tensors."""
        from safetensors.torch import save_file

        folder = Path(folder)
        tmp = folder.with_name(folder.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tensors = {}
        for name, t in self.tensors.items():
            t = t.detach().to("cpu")
            tensors[name] = (t.to(dtype) if dtype is not None and t.is_floating_point() else t).contiguous()
        save_file(tensors, str(tmp / "adapter_model.safetensors"))
        (tmp / "adapter_config.json").write_text(json.dumps(self.config(), indent=2))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        return folder
