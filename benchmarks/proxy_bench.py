"""Serving-proxy overhead: N concurrent rollouts through the proxy vs calling the engine directly.

    .venv/bin/python -m benchmarks.proxy_bench            # N = 1, 16, 64, non-streamed and streamed
    .venv/bin/python -m benchmarks.proxy_bench --quick    # fewer calls

Each rollout is an append-only tool-calling conversation (a ~2 kB system prompt, 4 tools, the
assistant turn echoed back every call, so rendering and splicing run for real) over HTTP on loopback,
with a minimal keep-alive HTTP client so the client's own cost stays small. The engine is a
ScriptedTestEngine (fast: tokenizes a scripted completion); for streamed calls it is paced at a fixed
time per generated token, since "overhead as a share of engine time" needs an engine that takes time.
The direct baseline replays the exact prompt ids the proxy sent, with the same concurrency, to the same
engine. Added latency = proxy latency - direct latency (median, p99), all measured in this one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from clawgym_env.chat import ChatMLRenderer
from clawgym_env.engines.scripted import ScriptedTestEngine
from clawgym_env.engines.tokenizer import load_qwen_tokenizer
from clawgym_env.interfaces import Generation, Policy, RolloutLimits, SamplingParams, TokenChunk
from clawgym_env.proxy import ServingProxy

SYSTEM = ("You are a careful coding agent working in /root/.openclaw/workspace. " * 30).strip()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool. " * 5,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
        },
    }
    for name in ("read", "write", "edit", "exec")
]
COMPLETIONS = [
    '<tool_call>\n{"name": "exec", "arguments": {"path": "ls -la", "content": ""}}\n</tool_call>',
    "The folder holds three files; next I will read the first one and summarise it for you.",
]


class PacedTestEngine(ScriptedTestEngine):
    """Test double: a ScriptedTestEngine that takes `per_token_s` per generated token, like a real decoder;
    its stream yields each token when it is "decoded"."""

    def __init__(self, tokenizer: Any, completions: Any, per_token_s: float) -> None:
        super().__init__(tokenizer, completions)
        self.per_token_s = per_token_s

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        generation = await super().generate(prompt_ids, sampling)
        await asyncio.sleep(self.per_token_s * len(generation.token_ids))
        return generation

    async def stream(
        self, prompt_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> AsyncIterator[TokenChunk]:
        generation = await super().generate(prompt_ids, sampling)
        start, last = time.perf_counter(), len(generation.token_ids) - 1
        for i, token in enumerate(generation.token_ids):
            await asyncio.sleep(max(0.0, start + (i + 1) * self.per_token_s - time.perf_counter()))
            finish = generation.finish_reason if i == last else None
            yield TokenChunk([token], [generation.logprobs[i]], finish, generation.policy_version)


class RawHttpClient:
    """A minimal HTTP/1.1 keep-alive client (Content-Length and chunked bodies): cheap, so the proxy's cost shows."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, api_key: str) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\nauthorization: Bearer {api_key}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        assert self.reader is not None
        raw_head = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        if "content-length" in fields:
            return status, await self.reader.readexactly(int(fields["content-length"]))
        chunks = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                return status, b"".join(chunks)
            chunks.append(data[:-2])

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


@dataclass
class Result:
    latencies: list[float]
    wall_s: float
    errors: int

    @property
    def calls(self) -> int:
        return len(self.latencies)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_proxy(
    proxy: ServingProxy, policy: Policy, n: int, rollouts: int, calls_each: int, stream: bool
) -> tuple[Result, list[list[int]]]:
    latencies: list[float] = []
    errors = 0
    prompts: list[list[int]] = []
    sem = asyncio.Semaphore(n)
    counter = iter(range(10**9))

    async def rollout() -> None:
        nonlocal errors
        async with sem:
            rid = f"r{next(counter)}-{time.monotonic_ns()}"
            route = proxy.open_rollout(rid, policy, RolloutLimits(max_calls=calls_each + 1))
            client = RawHttpClient(proxy.endpoint.host, proxy.endpoint.port or 0)
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Task {rid}"},
            ]
            try:
                for _ in range(calls_each):
                    body = json.dumps(
                        {"model": "policy", "messages": messages, "tools": TOOLS, "stream": stream}
                    ).encode()
                    start = time.perf_counter()
                    status, data = await client.post(route.path_prefix + "/v1/chat/completions", body, route.api_key)
                    latencies.append(time.perf_counter() - start)
                    if status != 200:
                        errors += 1
                        break
                    message = (
                        message_from_events(_sse_data(data)) if stream else json.loads(data)["choices"][0]["message"]
                    )
                    messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
                    for call in message.get("tool_calls") or ():
                        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "a.txt b.txt c.txt"})
                    if not message.get("tool_calls"):
                        messages.append({"role": "user", "content": "go on"})
            finally:
                await client.close()
                calls = proxy.close_rollout(rid)
                errors += sum(c.error is not None or c.drift_events > 0 for c in calls)
                prompts.extend(c.prompt_ids for c in calls)

    start = time.perf_counter()
    await asyncio.gather(*(rollout() for _ in range(rollouts)))
    return Result(latencies, time.perf_counter() - start, errors), prompts


def message_from_events(events: list[bytes]) -> dict[str, Any]:
    """Accumulate chat-completion chunks into the assistant message, as an SDK would."""
    text, calls = "", {}
    for data in events:
        if data == b"[DONE]":
            continue
        for choice in orjson.loads(data).get("choices", ()):
            delta = choice["delta"]
            text += delta.get("content") or ""
            for tc in delta.get("tool_calls") or ():
                slot = calls.setdefault(
                    tc["index"], {"id": tc.get("id"), "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["function"]["name"] += tc["function"].get("name") or ""
                slot["function"]["arguments"] += tc["function"].get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def _sse_data(body: bytes) -> list[bytes]:
    """The `data:` payloads of an SSE body."""
    return [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]


async def run_direct(policy: Policy, n: int, prompts: list[list[int]], stream: bool = False) -> Result:
    """The same prompts straight to the engine (its stream read to the end when `stream`)."""
    latencies: list[float] = []
    queue = list(prompts)
    sampling = SamplingParams(max_tokens=1024, stop_token_ids=tuple(policy.renderer.stop_token_ids))

    async def worker() -> None:
        while queue:
            prompt = queue.pop()
            start = time.perf_counter()
            if stream:
                async for _ in policy.engine.stream(prompt, sampling):
                    pass
            else:
                await policy.engine.generate(prompt, sampling)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(n)))
    return Result(latencies, time.perf_counter() - start, 0)


async def bench(quick: bool) -> list[dict[str, Any]]:
    tokenizer = load_qwen_tokenizer()
    renderer = ChatMLRenderer(tokenizer)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as run_dir:
        async with ServingProxy(Path(run_dir), port=0, unix_socket=None) as proxy:
            for stream in (False, True):
                per_token = 0.002 if stream else 0.0
                for n in (1, 16, 64):
                    calls_each = 4 if stream else 8
                    rollouts = max(n, (16 if stream else 32) // (2 if quick else 1))
                    script = lambda _p, it=iter(COMPLETIONS * 10**6): next(it)  # noqa: E731
                    engine = (
                        PacedTestEngine(tokenizer, script, per_token)
                        if stream
                        else ScriptedTestEngine(tokenizer, script)
                    )
                    policy = Policy(engine=engine, renderer=renderer)
                    await run_proxy(proxy, policy, n, min(rollouts, 4), 2, stream)  # warm-up (block cache, connections)
                    via_proxy, prompts = await run_proxy(proxy, policy, n, rollouts, calls_each, stream)
                    direct = await run_direct(policy, n, prompts, stream)
                    rows.append(row(n, stream, via_proxy, direct, per_token))
                    print(format_row(rows[-1]), flush=True)
    return rows


def row(n: int, stream: bool, proxy: Result, direct: Result, per_token: float) -> dict[str, Any]:
    p_med, d_med = statistics.median(proxy.latencies), statistics.median(direct.latencies)
    p_99, d_99 = pct(proxy.latencies, 0.99), pct(direct.latencies, 0.99)
    return {
        "n": n,
        "stream": stream,
        "engine_s_per_token": per_token,
        "calls": proxy.calls,
        "errors": proxy.errors,
        "direct_median_ms": d_med * 1e3,
        "proxy_median_ms": p_med * 1e3,
        "added_median_ms": (p_med - d_med) * 1e3,
        "added_p99_ms": (p_99 - d_99) * 1e3,
        "added_share_of_engine": (p_med - d_med) / d_med if d_med > 0 else None,
        "proxy_calls_per_s": proxy.calls / proxy.wall_s,
        "direct_calls_per_s": direct.calls / direct.wall_s,
    }


def format_row(r: dict[str, Any]) -> str:
    share = f"{100 * r['added_share_of_engine']:.1f}%" if r["stream"] else "-"
    return (
        f"{'SSE ' if r['stream'] else 'JSON'} N={r['n']:>2}  calls={r['calls']:>4} errors={r['errors']}  "
        f"engine median {r['direct_median_ms']:7.2f} ms | proxy median {r['proxy_median_ms']:7.2f} ms | "
        f"added median {r['added_median_ms']:6.2f} ms, p99 {r['added_p99_ms']:6.2f} ms, of engine {share:>6} | "
        f"throughput proxy {r['proxy_calls_per_s']:7.1f}/s vs direct {r['direct_calls_per_s']:8.1f}/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = asyncio.run(bench(args.quick))
    json_ok = [r for r in rows if not r["stream"]]
    sse = [r for r in rows if r["stream"]]
    print("\ntargets:")
    print(f"  added median latency, non-streamed, N=1: {json_ok[0]['added_median_ms']:.2f} ms (target < 2 ms)")
    print(
        f"  added median latency, streamed, N=1: {100 * sse[0]['added_share_of_engine']:.1f}% of engine time (target < 5%)"
    )
    print(f"  errors at N=64: {sum(r['errors'] for r in rows if r['n'] == 64)} (target 0)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
