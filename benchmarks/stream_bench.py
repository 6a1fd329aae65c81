"""Time to first byte of a streamed call, live vs buffered, next to the engine's own first token.

    .venv/bin/python -m benchmarks.stream_bench               # tiny-qwen3, 64 tokens, 6 calls per mode
    .venv/bin/python -m benchmarks.stream_bench --model qwen2.5-coder-0.5b --calls 3

One TransformersEngine (greedy, asked for a long story, `--tokens` at most) serves two
proxies: `live_streaming=True` (SSE events leave as tokens decode) and `live_streaming=False` (the
buffered answer every streamed call got before issue #18). Calls alternate between them, then the same
prompt ids go to `engine.stream()` directly. Printed per mode: median time to the first body byte and to
the first text delta, the total, and first byte / total; for the live proxy also the recorded time from
request receipt to the engine's first token (`ModelCall.timings.first_token_s`); for the engine alone,
first token / total.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.headline import emit
from clawgym_env.interfaces import RolloutLimits, SamplingParams
from clawgym_env.policies import make_policy
from clawgym_env.proxy import ServingProxy

PROMPT = "Write a long story (500 words) about a lighthouse keeper who finds a message in a bottle."


async def _one_call(client: httpx.AsyncClient, url: str, key: str, tokens: int) -> tuple[float, float, float]:
    """(first body byte, first text delta, total) in seconds for one streamed Anthropic call."""
    body = {"model": "p", "max_tokens": tokens, "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    t0 = time.perf_counter()
    first_byte = first_text = 0.0
    async with client.stream("POST", url + "/v1/messages", json=body, headers={"x-api-key": key}) as response:
        async for data in response.aiter_bytes():
            now = time.perf_counter() - t0
            first_byte = first_byte or now
            if not first_text and b'"text_delta"' in data:
                first_text = now
    return first_byte, first_text, time.perf_counter() - t0


async def main(model: str, tokens: int, calls: int) -> None:
    policy = make_policy(model, name="p", seed=0, max_batch_size=4)
    engine = policy.engine
    engine.default_stop_ids = frozenset()
    limits = RolloutLimits(max_new_tokens=tokens, temperature=0.0, max_calls=calls + 1)
    results: dict[str, list[tuple[float, float, float]]] = {"live": [], "buffered": []}
    with tempfile.TemporaryDirectory() as tmp:
        live = ServingProxy(Path(tmp) / "live", unix_socket=None, port=0, live_streaming=True)
        buffered = ServingProxy(Path(tmp) / "buffered", unix_socket=None, port=0, live_streaming=False)
        async with live, buffered, httpx.AsyncClient(timeout=600) as client:
            routes = {
                name: p.open_rollout(name, policy, limits) for name, p in (("live", live), ("buffered", buffered))
            }
            proxies = {"live": live, "buffered": buffered}
            await _one_call(client, live.base_url(routes["live"]), routes["live"].api_key, tokens)  # warm-up
            for _ in range(calls):
                for name in ("buffered", "live"):
                    route = routes[name]
                    results[name].append(await _one_call(client, proxies[name].base_url(route), route.api_key, tokens))
            prompt_ids = live.calls("live")[0].prompt_ids
            # server side: request received -> engine's first token (live calls; the warm-up left out)
            first_token = statistics.median(c.timings.first_token_s or 0.0 for c in live.calls("live")[1:])
            made = sorted({len(c.generated_ids) for c in live.calls("live") + buffered.calls("buffered")})
    direct = []
    sampling = SamplingParams(max_tokens=tokens, temperature=0.0)
    for _ in range(calls):
        t0 = time.perf_counter()
        first = 0.0
        async for _chunk in engine.stream(prompt_ids, sampling):
            first = first or time.perf_counter() - t0
        direct.append((first, first, time.perf_counter() - t0))
    await engine.aclose()

    def med(rows: list[tuple[float, float, float]], i: int) -> float:
        return statistics.median(r[i] for r in rows)

    print(f"model {model}, {made} tokens per call, {calls} calls per mode, load average {os.getloadavg()}")
    print("| mode | first byte | first text delta | total | first byte / total |")
    print("|---|---|---|---|---|")
    for name, rows in (("proxy, buffered (before)", results["buffered"]), ("proxy, live (after)", results["live"])):
        fb, ft, total = med(rows, 0), med(rows, 1), med(rows, 2)
        print(f"| {name} | {fb * 1e3:.1f} ms | {ft * 1e3:.1f} ms | {total * 1e3:.1f} ms | {fb / total:.3f} |")
    print(
        f"| proxy, live: request received -> engine's first token (recorded) | {first_token * 1e3:.1f} ms | - | - | - |"
    )
    fb, total = med(direct, 0), med(direct, 2)
    print(f"| engine.stream() direct | {fb * 1e3:.1f} ms (first token) | - | {total * 1e3:.1f} ms | {fb / total:.3f} |")
    live, buffered = (med(results[m], 0) / med(results[m], 2) for m in ("live", "buffered"))
    emit("stream", live, f"first byte / total {live:.3f} live vs {buffered:.3f} buffered ({model})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--calls", type=int, default=6)
    args = parser.parse_args()
    asyncio.run(main(args.model, args.tokens, args.calls))
