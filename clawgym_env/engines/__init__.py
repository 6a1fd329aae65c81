"""Inference engines (token ids in, token ids + logprobs out) and the offline model zoo.

Light to import: torch, transformers and vLLM load only when an engine or model is actually built.

    from clawgym_env.engines import make_engine, load_policy_model, load_qwen_tokenizer
    engine = make_engine("transformers", model="tiny-qwen3")
"""

from __future__ import annotations

from typing import Any

from clawgym_env.engines.factory import ENGINE_KINDS, make_engine
from clawgym_env.engines.scripted import ScriptedTestEngine, ScriptExhausted
from clawgym_env.engines.tokenizer import QWEN_SPECIAL_IDS, load_qwen_tokenizer

_LAZY = {
    "TransformersEngine": "clawgym_env.engines.transformers_engine",
    "EngineTimeout": "clawgym_env.engines.transformers_engine",
    "RemoteEngine": "clawgym_env.engines.remote_engine",
    "VLLMEngine": "clawgym_env.engines.vllm_engine",
    "load_policy_model": "clawgym_env.engines.models",
    "ensure_model": "clawgym_env.engines.models",
    "make_tiny_qwen3": "clawgym_env.engines.models",
    "make_token_server": "clawgym_env.engines.token_server",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'clawgym_env.engines' has no attribute {name!r}")


__all__ = [
    "ENGINE_KINDS",
    "QWEN_SPECIAL_IDS",
    "ScriptExhausted",
    "ScriptedTestEngine",
    "load_qwen_tokenizer",
    "make_engine",
    *_LAZY,
]
