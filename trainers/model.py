"""The policy model the trainer updates: a transformers causal LM, optionally with LoRA adapters (peft).

`export_weights` gives the inference engine plain, merged weights under the model's own parameter
names, whatever wraps the trainer's copy (LoRA adapters are folded in, FSDP shards are gathered).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field
from torch import nn

from clawgym_env.engines.lora_adapter import LoraAdapter


class LoraSettings(BaseModel):
    """LoRA adapters (peft); `enabled: false` trains every weight."""

    enabled: bool = False
    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    sync: Literal["merged", "adapter"] = Field(
        default="merged",
        description="what the engine receives each step: the adapted layers with the adapters merged in, or "
        "the adapter alone (engines that load adapters: vllm); checkpoints always store the adapter alone",
    )


def load_model(name: str, *, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[nn.Module, Any]:
    """(model, tokenizer) for a zoo name ("tiny-qwen3", "smollm2-135m", "qwen2.5-coder-0.5b") or a local path."""
    from clawgym_env.engines.models import load_policy_model

    model, tokenizer = load_policy_model(name, dtype=dtype, seed=seed)
    model.train()
    return model, tokenizer


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer in backward instead of storing its activations.

    On CPU the packed tree's attention runs SDPA's math path, which keeps a [heads, T, T] matrix per
    layer for backward: for a 0.5B model and T = 8k that alone is ~90 GB; with checkpointing only one
    layer's worth is alive at a time.
    """
    unwrap = model.get_base_model() if hasattr(model, "get_base_model") else model
    unwrap.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    unwrap.config.use_cache = False


def apply_lora(model: nn.Module, settings: LoraSettings) -> nn.Module:
    if not settings.enabled:
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def frozen_copy(model: nn.Module) -> nn.Module:
    """A reference policy for the KL penalty: the current weights, no gradients."""
    ref = plain_copy(model, share_frozen=True)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def plain_copy(model: nn.Module, share_frozen: bool = False) -> nn.Module:
    """A separate copy of the model without LoRA wrappers (adapters merged): the engine's weights, a reference.

    `share_frozen`: a LoRA model's frozen base weights outside the adapted layers (embedding, MLPs, norms: ~90%
    of Qwen2.5-Coder-0.5B) are shared with the copy instead of copied, since nothing ever writes them (the
    weight sync sends only the adapted layers, see `export_weights`). Only for a copy that is never trained
    (the engine, the KL reference), not for a critic that trains its trunk. The old way, copying a merged
    copy again, held three float32 0.5B models at once and set the main job's peak memory.
    """
    if not hasattr(model, "get_base_model"):
        return copy.deepcopy(model)
    memo: dict[int, Any] = {}
    if share_frozen:
        for name, param in model.get_base_model().named_parameters():
            if not param.requires_grad and ".base_layer." not in name and "lora_" not in name:
                memo[id(param)] = param
    return copy.deepcopy(model, memo).merge_and_unload()


def export_weights(model: nn.Module, full: bool = False) -> dict[str, torch.Tensor]:
    """Weights under the plain model's parameter names (what `engine.update_weights` takes).

    A LoRA model exports only what training can change: the adapted layers with their adapters merged, and
    any other trainable parameter; its frozen base weights are those the engine started from (for
    Qwen2.5-Coder-0.5B with adapters on q, k, v, o: 44 M of its 630 M parameters, so the weight sync
    shrinks 14x). `full=True` exports every weight. Collective under FSDP: every rank must call it; rank 0 gets the full tensors on CPU, the
    others an empty dict.
    """
    if _is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        names = {name for name, _ in model.named_parameters()}
        return {k: v for k, v in full.items() if k in names}
    if hasattr(model, "get_base_model"):
        return _merged_lora_weights(model, full)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def load_trainable_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load an adapter checkpoint (a LoRA model's trainable tensors) onto a model whose base weights are loaded.

    Refuses a checkpoint that names a tensor the model lacks or leaves a trainable one out."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    left_out = sorted(trainable & set(missing))
    if unexpected or left_out:
        raise KeyError(
            f"the adapter checkpoint does not fit this model: {len(unexpected)} unknown tensors "
            f"(e.g. {unexpected[:2]}), {len(left_out)} trainable ones missing (e.g. {left_out[:2]}); "
            "was it saved with the same model.lora settings?"
        )


def export_adapter(model: nn.Module) -> LoraAdapter:
    """A LoRA policy's adapter alone (what `engine.update_adapter` takes): PEFT's names, rank, alpha, targets."""
    from peft import get_peft_model_state_dict

    from clawgym_env.engines.lora_adapter import LoraAdapter

    if not hasattr(model, "peft_config"):
        raise ValueError("export_adapter needs a LoRA (peft) model: set model.lora.enabled=true")
    config = model.peft_config["default"]
    tensors = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    return LoraAdapter(tensors, rank=config.r, alpha=config.lora_alpha, target_modules=sorted(config.target_modules))


def _merged_lora_weights(peft_model: nn.Module, full: bool) -> dict[str, torch.Tensor]:
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    adapted = {name for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    out: dict[str, torch.Tensor] = {}
    for name, p in base.named_parameters():
        if "lora_" in name:
            continue
        owner = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
        if full or p.requires_grad or owner in adapted:
            out[name.replace(".base_layer.", ".")] = p.detach().clone()
    with torch.no_grad():
        for name in adapted:
            module = base.get_submodule(name)
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    out[f"{name}.weight"] = out[f"{name}.weight"] + module.get_delta_weight(adapter)
    return out


def _is_fsdp(model: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - old torch
        return False
    return isinstance(model, FSDPModule)
