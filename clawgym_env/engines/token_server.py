"""A stand-in for vLLM's and SGLang's token-level HTTP APIs, serving any in-process `InferenceEngine`.

It implements just the token-level subset RemoteEngine uses: vLLM's `POST /v1/completions` with a
token-id prompt (`logprobs`, `return_token_ids`, `return_tokens_as_token_ids`), SGLang's
`POST /generate` with `input_ids`, plus `GET /v1/models` and `GET /health`; and of vLLM's dev-mode routes
what `VLLMServerPool` asks of every call (`POST /collective_rpc` with `clawgym_get_policy_version`, one
result per worker: here one), of a weight update (`clawgym_load_weights_from_file`: the file's tensors go
to the engine's `update_weights` at the version named) and `POST /reset_prefix_cache`. Tests and
benchmarks use it to exercise RemoteEngine and the pool over real HTTP; it can also serve a
TransformersEngine to other machines:

    python -m clawgym_env.engines.token_server --model tiny-qwen3 --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from clawgym_env.engines.token_stream import stream_tokens
from clawgym_env.interfaces import InferenceEngine, SamplingParams


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: list[int] | list[list[int]] | str
    max_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    logprobs: int | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    stream: bool = False
    stream_interval: int = Field(default=1, ge=1)  # tokens per streamed chunk after the first (vLLM >= 0.12)
    model_config = {"extra": "allow"}


class SGLangSampling(BaseModel):
    max_new_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = -1
    stop_token_ids: list[int] = Field(default_factory=list)
    sampling_seed: int | None = None
    model_config = {"extra": "allow"}


class SGLangRequest(BaseModel):
    input_ids: list[int]
    sampling_params: SGLangSampling = Field(default_factory=SGLangSampling)
    return_logprob: bool = False
    model_config = {"extra": "allow"}


def make_token_server(engine: InferenceEngine, model_name: str = "policy", tokenizer: Any = None) -> FastAPI:
    app = FastAPI(title="ClawGym token server (vLLM/SGLang API stand-in)")

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids) if tokenizer is not None else ""

    async def _run(prompt: list[int], sampling: SamplingParams):
        try:
            return await engine.generate(prompt, sampling)
        except ValueError as exc:  # bad prompt ids, prompt too long: the client's fault
            raise HTTPException(400, str(exc)) from exc

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/collective_rpc")
    async def collective_rpc(body: dict[str, Any]) -> dict[str, Any]:
        method, args = body.get("method"), body.get("args") or []
        if method == "clawgym_load_weights_from_file":  # the file's tensors to the engine, at the version named
            from safetensors.torch import load_file

            path, version = args
            engine.update_weights(await asyncio.to_thread(load_file, path), int(version))
            return {"results": [None]}
        if method != "clawgym_get_policy_version":
            raise HTTPException(
                400, f"the stand-in runs clawgym_get_policy_version and clawgym_load_weights_from_file, not {method!r}"
            )
        return {"results": [getattr(engine, "policy_version", 0)]}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "clawgym"}]}

    def completion_choice(req: CompletionRequest, ids: list[int], logprobs: list[float], finish: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "text": decode(ids), "finish_reason": finish}
        if req.return_token_ids:
            choice["token_ids"] = ids
        if req.logprobs is not None:
            tokens = [f"token_id:{t}" if req.return_tokens_as_token_ids else decode([t]) for t in ids]
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": logprobs,
                "top_logprobs": None,
                "text_offset": None,
            }
        return choice

    async def stream_completion(req: CompletionRequest, sampling: SamplingParams) -> StreamingResponse:
        """vLLM's `stream: true`: an SSE chunk per engine chunk (ids and logprobs of the new tokens); with
        `stream_interval`, as vLLM does: the first chunk at once, then one per that many tokens, and the end."""
        chunks = stream_tokens(engine, list(req.prompt), sampling)  # type: ignore[arg-type]
        try:
            first = await anext(chunks)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from exc
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time())}

        def event(ids: list[int], logprobs: list[float], finish: Any) -> str:
            choice = completion_choice(req, ids, logprobs, finish)
            return f"data: {json.dumps({**head, 'model': model_name, 'choices': [choice]})}\n\n"

        async def events():
            yield event(first.token_ids, first.logprobs, first.finish_reason)
            finish = first.finish_reason
            ids: list[int] = []
            logprobs: list[float] = []
            while finish is None:
                chunk = await anext(chunks)
                ids, logprobs, finish = ids + chunk.token_ids, logprobs + chunk.logprobs, chunk.finish_reason
                if finish is not None or len(ids) >= req.stream_interval:
                    yield event(ids, logprobs, finish)
                    ids, logprobs = [], []
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest) -> dict[str, Any] | StreamingResponse:
        if not isinstance(req.prompt, list) or not req.prompt or not isinstance(req.prompt[0], int):
            raise HTTPException(400, "this server takes one token-id list as `prompt` (text prompts are not supported)")
        sampling = SamplingParams(
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=max(req.top_k, 0),
            seed=req.seed,
            stop_token_ids=tuple(req.stop_token_ids),
        )
        if req.stream:
            return await stream_completion(req, sampling)
        gen = await _run(list(req.prompt), sampling)
        choice = completion_choice(req, gen.token_ids, gen.logprobs, gen.finish_reason)
        if req.return_token_ids:
            choice["prompt_token_ids"] = list(req.prompt)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(req.prompt),
                "completion_tokens": len(gen.token_ids),
                "total_tokens": len(req.prompt) + len(gen.token_ids),
            },
        }

    @app.post("/generate")
    async def generate(req: SGLangRequest) -> dict[str, Any]:
        if not req.input_ids:
            raise HTTPException(400, "input_ids is empty")
        p = req.sampling_params
        sampling = SamplingParams(
            max_tokens=p.max_new_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=max(p.top_k, 0),
            seed=p.sampling_seed,
            stop_token_ids=tuple(p.stop_token_ids),
        )
        gen = await _run(req.input_ids, sampling)
        meta: dict[str, Any] = {
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(gen.token_ids),
            "finish_reason": {"type": gen.finish_reason},
        }
        if req.return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(gen.logprobs, gen.token_ids)]
        return {"text": decode(gen.token_ids), "output_ids": gen.token_ids, "meta_info": meta}

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from clawgym_env.engines.transformers_engine import TransformersEngine

    parser = argparse.ArgumentParser(description="Serve a TransformersEngine over vLLM/SGLang-style token APIs.")
    parser.add_argument("--model", default="tiny-qwen3", help="zoo name or local HF folder / GGUF path")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    engine = TransformersEngine.from_pretrained(args.model)
    uvicorn.run(make_token_server(engine, args.model, engine.tokenizer), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
