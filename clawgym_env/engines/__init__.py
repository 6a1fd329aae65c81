"""Inference engines (token ids in, token ids + logprobs out) and the offline model zoo.

Light to import: torch and transformers load only when an engine or model is actually built.
"""

from clawgym_env.engines.scripted import ScriptedTestEngine, ScriptExhausted
from clawgym_env.engines.tokenizer import QWEN_SPECIAL_IDS, load_qwen_tokenizer

__all__ = ["QWEN_SPECIAL_IDS", "ScriptExhausted", "ScriptedTestEngine", "load_qwen_tokenizer"]
