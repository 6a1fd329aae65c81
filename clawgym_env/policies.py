"""`make_policy`: a Policy (engine + renderer) from a model name, in one call.

policy = make_policy("qwen2.5-coder-0.5b")              # in-process transformers engine on CPU
policy = make_policy("tiny-qwen3")                      # random 5M-parameter model, fast plumbing
policy = make_policy("/path/to/hf-folder", engine="vllm")
policy = make_policy("remote", engine="remote", base_url="http://gpu-box:8000", tokenizer=tok)
"""

from __future__ import annotations

from typing import Any

from clawgym_env.interfaces import Policy


def make_policy(
    model: str = "tiny-qwen3",
    *,
    engine: str = "transformers",
    tokenizer: Any = None,
    name: str = "policy",
    max_context: int = 32_768,
    **engine_options: Any,
) -> Policy:
    """Build the engine for `model` and the ChatML renderer of its tokenizer.

    The renderer checks once that its message-by-message segments equal the tokenizer's own chat
    template, so a model whose template is not ChatML fails here with a clear error, not later.
    """
    from clawgym_env.chat import ChatMLRenderer
    from clawgym_env.engines import make_engine

    if engine in ("transformers", "vllm"):
        built = make_engine(engine, model=model, **engine_options)
    else:
        built = (
            make_engine(engine, tokenizer=tokenizer, **engine_options)
            if engine == "scripted"
            else make_engine(engine, **engine_options)
        )
    tokenizer = tokenizer or getattr(built, "tokenizer", None)
    if tokenizer is None:
        from clawgym_env.engines import load_qwen_tokenizer

        tokenizer = load_qwen_tokenizer()
    return Policy(engine=built, renderer=ChatMLRenderer(tokenizer), name=name, max_context=max_context)
