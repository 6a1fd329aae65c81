"""`make_engine(kind, **options)`: one entry point for every InferenceEngine this package provides."""

from __future__ import annotations

from typing import Any, Literal

from clawgym_env.interfaces import InferenceEngine

EngineKind = Literal["transformers", "vllm", "vllm_server", "remote", "scripted"]
ENGINE_KINDS = ("transformers", "vllm", "vllm_server", "remote", "scripted")


def make_engine(kind: str, **options: Any) -> InferenceEngine:
    """Build an engine.

    - "transformers": `model=` a zoo name ("tiny-qwen3", "smollm2-135m", "qwen2.5-coder-0.5b"), a local
      HF folder or .gguf path, or a loaded model object (then pass `tokenizer=` too); other options go to
      TransformersEngine (max_batch_size, prefix_cache_entries, request_timeout_s, dtype, seed, ...).
    - "vllm": `model=` a zoo name or local path; options go to VLLMEngine / vLLM's AsyncEngineArgs.
    - "vllm_server": N vLLM OpenAI servers as one engine (VLLMServerPool): `urls=[...]` to connect to
      running servers (started with ClawGym's worker extension and VLLM_SERVER_DEV_MODE=1), or `model=` and
      `servers=N` to start them on loopback (other options go to VLLMServer: dtype, max_model_len, ...).
    - "remote": `base_url=` of a vLLM or SGLang server, `api="vllm"|"sglang"`, optional model, api_key.
    - "scripted": ScriptedTestEngine (a test double): `completions=` list of texts or a function;
      `tokenizer=` defaults to the Qwen tokenizer.
    """
    if kind == "transformers":
        from clawgym_env.engines.transformers_engine import TransformersEngine

        model = options.pop("model", "tiny-qwen3")
        if isinstance(model, str) or hasattr(model, "__fspath__"):
            return TransformersEngine.from_pretrained(str(model), **options)
        return TransformersEngine(model, options.pop("tokenizer", None), **options)
    if kind == "vllm":
        from clawgym_env.engines.vllm_engine import VLLMEngine

        return VLLMEngine(options.pop("model", "tiny-qwen3"), **options)
    if kind == "vllm_server":
        from clawgym_env.engines.vllm_server import POOL_OPTIONS, VLLMServerPool

        urls = options.pop("urls", None)
        if urls:  # running servers (any host): only the pool's own options apply
            if options.pop("enable_lora", False):  # the trainer's adapter sync: the servers must have LoRA on
                options["supports_adapters"] = True
            return VLLMServerPool(urls, **{k: options[k] for k in POOL_OPTIONS if options.get(k) is not None})
        options = {k: v for k, v in options.items() if v is not None}
        return VLLMServerPool.launch(options.pop("model", "tiny-qwen3-h64"), options.pop("servers", 1), **options)
    if kind == "remote":
        from clawgym_env.engines.remote_engine import RemoteEngine

        if "base_url" not in options:
            raise ValueError("make_engine('remote') needs base_url=, e.g. http://127.0.0.1:8000")
        return RemoteEngine(options.pop("base_url"), **options)
    if kind == "scripted":
        from clawgym_env.engines.scripted import ScriptedTestEngine
        from clawgym_env.engines.tokenizer import load_qwen_tokenizer

        tokenizer = options.pop("tokenizer", None) or load_qwen_tokenizer()
        if "completions" not in options:
            raise ValueError(
                "make_engine('scripted') needs completions= (a list of texts or a function prompt -> text)"
            )
        return ScriptedTestEngine(tokenizer, options.pop("completions"), **options)
    raise ValueError(f"unknown engine kind {kind!r}; use one of {', '.join(ENGINE_KINDS)}")
