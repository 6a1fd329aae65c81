"""TransformersEngine benchmark: load time, prefill/decode speed, batching and prefix-cache gains, side by side.

    .venv/bin/python -m benchmarks.engine_bench --model tiny-qwen3
    .venv/bin/python -m benchmarks.engine_bench --model smollm2-135m --prompt-tokens 1024 --new-tokens 32
    .venv/bin/python -m benchmarks.engine_bench --model qwen2.5-coder-0.5b --prompt-tokens 512 --new-tokens 16 --concurrency 4

Each ratio compares two configurations measured in the same run on the same prompts.

    .venv/bin/python -m benchmarks.engine_bench --compare-engines --model tiny-qwen3-h64 --concurrency 8

compares engines instead (transformers, in-process vLLM, one vLLM server) on the same batch of
multi-call rollouts (a shared system prompt, each call extending the previous one): start-up time,
wall time, generated tokens/s, prompt tokens served from vLLM's prefix cache, peak RSS of the engine's
processes, and the server's weight sync by file and by broadcast. vLLM runs float32 on CPU like the
transformers engine (a fair comparison of the engines, not of the dtypes; `--vllm-dtype auto` runs it in
vLLM's CPU default, bfloat16).

    .venv/bin/python -m benchmarks.engine_bench --compare-engines --model qwen2.5-coder-0.5b \
        --replay runs/main-vllm-s0/rollouts/calls.jsonl --concurrency 8

replays real rollouts instead: the first 8 pi rollouts recorded by a main-job run, each call with its
recorded prompt ids and as many new tokens as it generated then (no stop token), so every engine does
exactly the same work, the calls of a rollout one after another and the rollouts concurrently.

    .venv/bin/python -m benchmarks.engine_bench --compare-engines --model qwen2.5-coder-0.5b \
        --replay runs/main-vllm-s0/rollouts/calls.jsonl --vllm-dtype bfloat16 float32 --omp-bind 0-1 --no-server

puts in-process vLLM in each dtype (its threads on cores 0-1, as the main job runs it on 2 cores) beside the
transformers engine on the same replayed rollouts: what the main job's engine choice rests on for a CPU
(trainers/engine_choice.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import torch

from benchmarks.headline import emit
from clawgym_env.engines.models import load_policy_model
from clawgym_env.engines.tokenizer import load_qwen_tokenizer
from clawgym_env.engines.transformers_engine import TransformersEngine
from clawgym_env.interfaces import SamplingParams
from clawgym_env.records import ModelCall, read_calls
from trainers.process_memory import tree_rss_mb


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
    batched = TransformersEngine(
        model, tokenizer, max_batch_size=args.concurrency, prefix_cache_entries=0, stop_token_ids=no_stop
    )
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
            p = (
                p
                + g.token_ids
                + tokenizer.encode(f"<|im_end|>\n<|im_start|>user\nresult {turn}<|im_end|>\n<|im_start|>assistant\n")
            )
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


async def rollouts(engine, tokenizer, n: int, calls: int, prompt_tokens: int, new_tokens: int) -> tuple[float, int]:
    """n concurrent rollouts of `calls` calls each, behind one shared system prompt; (wall s, generated tokens)."""
    system = make_prompt(tokenizer, prompt_tokens, salt=7)
    tail = tokenizer.encode("<|im_end|>\n<|im_start|>user\ntool result<|im_end|>\n<|im_start|>assistant\n")

    async def one(i: int) -> int:
        p = system + tokenizer.encode(f"task {i}")
        made = 0
        for turn in range(calls):
            g = await engine.generate(p, SamplingParams(max_tokens=new_tokens, seed=100 * i + turn, ignore_eos=True))
            made += len(g.token_ids)
            p = p + g.token_ids + tail
        return made

    start = time.perf_counter()
    made = await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - start, sum(made)


def recorded_rollouts(path: str, n: int) -> list[list[tuple[list[int], int]]]:
    """The first `n` rollouts (in recording order) of a run's calls.jsonl: each a list of (prompt ids,
    generated length) of its calls that generated, in call order (a call the proxy refused, such as one past
    the rollout's call cap, generated nothing and is left out)."""
    calls: dict[str, list[ModelCall]] = {}
    for call in read_calls(Path(path)):  # a line holds only what its call adds: read_calls puts calls together
        calls.setdefault(call.rollout_id, []).append(call)
    out = []
    for rollout in calls.values():
        rollout.sort(key=lambda c: c.call_index)
        generated = [(c.prompt_ids, len(c.generated_ids)) for c in rollout if c.generated_ids]
        if generated:
            out.append(generated)
        if len(out) == n:
            return out
    raise SystemExit(f"{path} holds only {len(out)} rollouts that generated, fewer than the {n} asked for")


async def replay(engine, recorded: list[list[tuple[list[int], int]]]) -> tuple[float, int]:
    """Each recorded rollout's calls in order (all rollouts concurrently); (wall s, generated tokens)."""

    async def one(i: int, calls: list[tuple[list[int], int]]) -> int:
        made = 0
        for turn, (prompt, length) in enumerate(calls):
            sampling = SamplingParams(max_tokens=length, seed=100 * i + turn, ignore_eos=True)
            made += len((await engine.generate(prompt, sampling)).token_ids)
        return made

    start = time.perf_counter()
    made = await asyncio.gather(*(one(i, calls) for i, calls in enumerate(recorded)))
    return time.perf_counter() - start, sum(made)


async def compare_engines(args) -> dict:
    import psutil

    from clawgym_env.engines.vllm_engine import VLLMEngine

    results: dict = {"model": args.model, "concurrency": args.concurrency, "load_avg_1min": psutil.getloadavg()[0]}
    model, tokenizer = load_policy_model(args.model)
    max_len = 4096
    if args.replay:
        recorded = recorded_rollouts(args.replay, args.concurrency)
        results["replayed_calls"] = sum(len(r) for r in recorded)
        results["replayed_prompt_tokens"] = sum(len(p) for r in recorded for p, _ in r)
        max_len = max(max_len, *(len(p) + n + 16 for r in recorded for p, n in r))  # the longest recorded call

        def work(engine):
            return replay(engine, recorded)
    else:
        shape = dict(n=args.concurrency, calls=4, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens)

        def work(engine):
            return rollouts(engine, tokenizer, **shape)

    base_rss = tree_rss_mb()

    t0 = time.perf_counter()
    eng = TransformersEngine(model, tokenizer, max_batch_size=args.concurrency, stop_token_ids=set())
    results["transformers_start_s"] = time.perf_counter() - t0
    wall, made = await work(eng)
    results["transformers_wall_s"], results["transformers_tok_s"] = wall, made / wall
    results["transformers_rss_mb"] = tree_rss_mb()
    eng.close()

    for i, dtype in enumerate(args.vllm_dtype):  # the first dtype's keys are `vllm_*`, a later one's `vllm_<dtype>_*`
        name = "vllm" if i == 0 else f"vllm_{dtype}"
        for label in ("cold", "warm"):  # the second start finds vLLM's caches (.cache/vllm) filled
            t0 = time.perf_counter()
            veng = VLLMEngine(
                args.model,
                dtype=dtype,
                max_model_len=max_len,
                max_num_seqs=args.concurrency,
                cpu_omp_bind=args.omp_bind,
            )
            results[f"{name}_{label}_start_s"] = time.perf_counter() - t0
            if label == "warm":
                wall, made = await work(veng)
                results[f"{name}_wall_s"], results[f"{name}_tok_s"] = wall, made / wall
                results[f"{name}_prefix_cached_prompt_tokens"] = veng.stats.cached_prompt_tokens
                results[f"{name}_prompt_tokens"] = veng.stats.prompt_tokens
                results[f"{name}_rss_mb"] = tree_rss_mb() - base_rss
                results[f"{name}_vs_transformers_tok_s"] = results[f"{name}_tok_s"] / results["transformers_tok_s"]
            veng.close()
            del veng
    if not args.no_server:
        results.update(await server_figures(args, model, work, max_len))
        results["server_vs_transformers_tok_s"] = results["server_tok_s"] / results["transformers_tok_s"]
    results["load_avg_1min_end"] = psutil.getloadavg()[0]
    return results


async def server_figures(args, model, work, max_len: int) -> dict:
    """One vLLM server (in the first dtype) on the same work: start-up, speed, RSS, and its weight sync by file
    and by broadcast."""
    from clawgym_env.engines.vllm_server import VLLMServerPool

    results: dict = {}
    t0 = time.perf_counter()
    pool = await asyncio.to_thread(
        VLLMServerPool.launch,
        args.model,
        1,
        dtype=args.vllm_dtype[0],
        max_model_len=max_len,
        max_batch_size=args.concurrency,
    )
    results["server_start_s"] = time.perf_counter() - t0
    try:
        wall, made = await work(pool)
        results["server_wall_s"], results["server_tok_s"] = wall, made / wall
        results["server_rss_mb"] = tree_rss_mb(pool.servers[0].proc.pid)
        state = model.state_dict()
        steps = (("disk", "disk"), ("broadcast", "broadcast_joining"), ("broadcast", "broadcast"))
        for version, (transfer, label) in enumerate(steps, start=1):  # the 2nd broadcast reuses the group
            pool.weight_transfer = transfer
            t0 = time.perf_counter()
            await pool.aupdate_weights(state, version)
            results[f"server_weight_sync_{label}_s"] = time.perf_counter() - t0
        results["server_broadcast_failures"] = pool.stats.broadcast_failures
    finally:
        await pool.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--replay", default=None, help="a run's rollouts/calls.jsonl: replay its recorded rollouts")
    parser.add_argument(
        "--vllm-dtype",
        nargs="+",
        default=["float32"],
        help="in-process vLLM's dtype, or several side by side (float32 = the trainer's; bfloat16; auto); "
        "the server runs the first",
    )
    parser.add_argument("--omp-bind", default=None, help="in-process vLLM's CPU cores, e.g. 0-1 (default: vLLM's own)")
    parser.add_argument("--no-server", action="store_true", help="in-process engines only (no vLLM server)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument(
        "--compare-engines", action="store_true", help="transformers vs in-process vLLM vs a vLLM server"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = asyncio.run(compare_engines(args) if args.compare_engines else bench(args))
    width = max(len(k) for k in results)
    for key, value in results.items():
        print(f"{key:<{width}}  {value:.3f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    print(json.dumps(results))
    if args.compare_engines and not args.no_server and len(args.vllm_dtype) == 1:  # the README row's shape
        vllm, server = results["vllm_vs_transformers_tok_s"], results["server_vs_transformers_tok_s"]
        workload = "replayed rollouts" if args.replay else f"{args.concurrency} synthetic 4-call rollouts"
        emit(
            "engines",
            vllm,
            f"vLLM in-process {vllm:.2f}x, vLLM server {server:.2f}x the transformers engine's generated tokens/s "
            f"({args.model}, vLLM dtype {args.vllm_dtype[0]}, {workload})",
        )


if __name__ == "__main__":
    main()
