"""TransformersEngine benchmark: load time, prefill/decode speed, batching and prefix-cache gains, side by side.

    .venv/bin/python -m benchmarks.engine_bench --model tiny-qwen3
    .venv/bin/python -m benchmarks.engine_bench --model smollm2-135m --prompt-tokens 1024 --new-tokens 32
    .venv/bin/python -m benchmarks.engine_bench --model qwen2.5-coder-0.5b --prompt-tokens 512 --new-tokens 16 --concurrency 4

Each ratio compares two configurations measured in the same run on the same prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import torch

from clawgym_env.engines.models import load_policy_model
from clawgym_env.engines.tokenizer import load_qwen_tokenizer
from clawgym_env.engines.transformers_engine import TransformersEngine
from clawgym_env.interfaces import SamplingParams


def make_prompt(tokenizer, n_tokens: int, salt: int = 0) -> list[int]:
    text = " ".join(f"line {salt}-{i}: the quick brown fox jumps over the lazy dog." for i in range(n_tokens // 8 + 8))
    ids = tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": text}],
        add_generation_prompt=True,
        return_dict=False,
    )
    return ids[-n_tokens:]


async def timed(coro):
    start = time.perf_counter()
    out = await coro
    return out, time.perf_counter() - start


async def bench(args) -> dict:
    t0 = time.perf_counter()
    load_qwen_tokenizer()
    tok_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    model, tokenizer = load_policy_model(args.model)
    model_load = time.perf_counter() - t0
    greedy = dict(temperature=1.0, stop_token_ids=())
    no_stop: set[int] = set()  # measure fixed lengths: no eos stop
    results: dict = {
        "model": args.model,
        "torch_threads": torch.get_num_threads(),
        "tokenizer_load_s": tok_load,
        "model_load_s": model_load,
    }

    # prefill and decode speed, batch 1, no cache reuse
    eng = TransformersEngine(model, tokenizer, max_batch_size=1, prefix_cache_entries=0, stop_token_ids=no_stop)
    prompt = make_prompt(tokenizer, args.prompt_tokens)
    await eng.generate(prompt[:16], SamplingParams(max_tokens=2))  # warm-up
    _, t_prefill = await timed(eng.generate(prompt, SamplingParams(max_tokens=1, **greedy)))
    _, t_full = await timed(eng.generate(prompt, SamplingParams(max_tokens=args.new_tokens + 1, **greedy)))
    _, t_prefill2 = await timed(eng.generate(prompt, SamplingParams(max_tokens=1, **greedy)))
    t_prefill = min(t_prefill, t_prefill2)
    results["prefill_tok_s"] = len(prompt) / t_prefill
    results["decode_tok_s"] = args.new_tokens / max(t_full - t_prefill, 1e-9)

    # concurrency: continuous batching vs one at a time (same prompts, same seeds)
    prompts = [make_prompt(tokenizer, args.prompt_tokens // 4, salt=i) for i in range(args.concurrency)]
    params = [SamplingParams(max_tokens=args.new_tokens, seed=i, **greedy) for i in range(args.concurrency)]
    serial = TransformersEngine(model, tokenizer, max_batch_size=1, prefix_cache_entries=0, stop_token_ids=no_stop)
    batched = TransformersEngine(model, tokenizer, max_batch_size=args.concurrency, prefix_cache_entries=0, stop_token_ids=no_stop)
    _, t_serial = await timed(asyncio.gather(*(serial.generate(p, s) for p, s in zip(prompts, params))))
    _, t_batched = await timed(asyncio.gather(*(batched.generate(p, s) for p, s in zip(prompts, params))))
    total = args.concurrency * args.new_tokens
    results[f"serial_x{args.concurrency}_tok_s"] = total / t_serial
    results[f"batched_x{args.concurrency}_tok_s"] = total / t_batched
    results["batching_speedup"] = t_serial / t_batched

    # prefix cache: a 4-call rollout whose prompts extend each other
    async def rollout(engine: TransformersEngine) -> float:
        p = make_prompt(tokenizer, args.prompt_tokens, salt=99)
        start = time.perf_counter()
        for turn in range(4):
            g = await engine.generate(p, SamplingParams(max_tokens=args.new_tokens // 2 or 1, seed=turn, **greedy))
            p = p + g.token_ids + tokenizer.encode(f"<|im_end|>\n<|im_start|>user\nresult {turn}<|im_end|>\n<|im_start|>assistant\n")
        return time.perf_counter() - start

    t_nocache = await rollout(TransformersEngine(model, tokenizer, prefix_cache_entries=0, stop_token_ids=no_stop))
    cached = TransformersEngine(model, tokenizer, stop_token_ids=no_stop)
    t_cache = await rollout(cached)
    results["rollout_4_calls_no_cache_s"] = t_nocache
    results["rollout_4_calls_prefix_cache_s"] = t_cache
    results["prefix_cache_speedup"] = t_nocache / t_cache
    for e in (eng, serial, batched, cached):
        e.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = asyncio.run(bench(args))
    width = max(len(k) for k in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value:.3f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
