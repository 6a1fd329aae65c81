"""The proxy's own CPU per call, without sockets: ASGI scopes straight into its hot routes, in one process.

    .venv/bin/python -m benchmarks.proxy_handler                  # 4-call and 32-call rollouts, µs per call
    .venv/bin/python -m benchmarks.proxy_handler --calls 32 --profile /tmp/handler.prof
    .venv/bin/python -m benchmarks.proxy_handler --chunk-tokens 1      # the engine streams token by token

`benchmarks.proxy_load` measures the proxy as harnesses see it (HTTP, a client in its own process, calls
per proxy CPU-second). This one takes the HTTP server, the sockets and the client out: each call is a scope,
a body and a `send` that keeps the bytes, handed to the proxy's `HotRoutes` (what uvicorn would call), on
the same workload (`FastTestEngine`, a named test double, and the same append-only tool-calling chat). What
is left is the proxy's own work per call (rendering, splicing, validation, streaming, recording), timed
with the process's CPU clock around the handler only (and, apart, around `close_rollout`, which reads a
rollout's calls back from the log for the trainer), so A/B runs of small changes are not drowned in the
noise of the other two processes. The conversation grows with `--calls`, as a real rollout's does.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.proxy_bench import COMPLETIONS, SYSTEM, TOOLS
from benchmarks.proxy_load import FastTestEngine, StreamingFastTestEngine, next_turn, run_on


def chat_call(route: Any, tools: bytes, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], bytes]:
    """The ASGI scope and body of a streamed Chat Completions call on `route` (what uvicorn would hand over)."""
    body = b'{"model":"policy","stream":true,"tools":' + tools + b',"messages":' + orjson.dumps(messages) + b"}"
    headers = [(b"authorization", b"Bearer " + route.api_key.encode()), (b"content-type", b"application/json")]
    scope = {
        "type": "http",
        "method": "POST",
        "path": f"{route.path_prefix}/v1/chat/completions",
        "headers": [*headers, (b"content-length", str(len(body)).encode())],
        "query_string": b"",
        "extensions": {},
    }
    return scope, body


async def _serve_one(app: Any, scope: dict[str, Any], body: bytes) -> tuple[int, bytes]:
    """One call through the ASGI app, as uvicorn would make it: (status, the whole response body)."""
    sent = False
    status = 0
    out: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.get_running_loop().create_future()  # the client never leaves
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            out.append(message["body"])

    await app(scope, receive, send)
    return status, b"".join(out)


async def measure(
    rollouts: int, calls: int, concurrency: int = 1, profile: Path | None = None, chunk_tokens: int = 0
) -> dict[str, Any]:
    """Run `rollouts` rollouts of `calls` streamed Chat Completions calls through the handler; µs per call."""
    from clawgym_env.chat import ChatMLRenderer
    from clawgym_env.engines.tokenizer import load_qwen_tokenizer
    from clawgym_env.interfaces import Policy, RolloutLimits
    from clawgym_env.proxy import ServingProxy

    tokenizer = load_qwen_tokenizer()
    engine = (
        StreamingFastTestEngine(tokenizer, COMPLETIONS, chunk_tokens)
        if chunk_tokens
        else FastTestEngine(tokenizer, COMPLETIONS)
    )
    policy = Policy(engine=engine, renderer=ChatMLRenderer(tokenizer))  # type: ignore[arg-type]
    run_dir = Path(tempfile.mkdtemp(prefix="proxy-handler-"))  # its call log: up to 100s of MB, removed below
    proxy = ServingProxy(run_dir, port=0, unix_socket=None)
    await proxy.start()
    app = proxy.asgi
    tools = orjson.dumps(TOOLS)
    handler_cpu = close_cpu = 0.0
    statuses: dict[int, int] = {}
    recorded = drift = 0

    async def rollout(name: str) -> None:
        nonlocal handler_cpu, close_cpu, recorded, drift
        route = proxy.open_rollout(name, policy, RolloutLimits(max_calls=calls + 1))
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": name}]
        for _ in range(calls):
            scope, body = chat_call(route, tools, messages)
            start = time.process_time()
            status, answer = await _serve_one(app, scope, body)
            handler_cpu += time.process_time() - start
            statuses[status] = statuses.get(status, 0) + 1
            events = [line[6:] for line in answer.split(b"\n") if line.startswith(b"data: ")]
            next_turn(messages, events)
        start = time.process_time()
        calls_back = proxy.close_rollout(name)  # the rollout's calls handed to the trainer
        close_cpu += time.process_time() - start
        for call in calls_back:
            recorded += 1
            drift += call.drift_events

    for i in range(5):  # warm-up: caches, the tokenizer, the first-call paths
        await rollout(f"warm{i}")
    statuses.clear()
    recorded = drift = 0
    handler_cpu = close_cpu = 0.0
    gc.collect()
    queue = [f"r{i}" for i in range(rollouts)]

    async def worker() -> None:
        while queue:
            await rollout(queue.pop())

    profiler = None
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(str(profile))
    await proxy.stop()
    shutil.rmtree(run_dir, ignore_errors=True)
    total = rollouts * calls
    return {
        "calls_per_rollout": calls,
        "calls": total,
        "recorded": recorded,
        "drift_events": drift,
        "statuses": statuses,
        "handler_us_per_call": 1e6 * handler_cpu / max(total, 1),
        "close_us_per_call": 1e6 * close_cpu / max(total, 1),  # close_rollout's CPU, per call it hands back
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", default="4,32", help="calls per rollout, comma-separated (one row each)")
    parser.add_argument("--rollouts", type=int, default=0, help="rollouts per row (default: ~1,600 calls' worth)")
    parser.add_argument("--concurrency", type=int, default=1, help="rollouts in flight at once")
    parser.add_argument("--runs", type=int, default=3, help="runs per row; the lowest is the one to compare")
    parser.add_argument("--profile", type=Path, help="cProfile (CPU clock) of the last run into this file")
    parser.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio"))
    parser.add_argument(
        "--chunk-tokens", type=int, default=0, help="the engine streams this many ids per chunk (0: one chunk per call)"
    )
    args = parser.parse_args(argv)
    rows = []
    for calls in (int(c) for c in args.calls.split(",")):
        rollouts = args.rollouts or max(1, 1600 // calls)
        runs = []
        for run in range(args.runs):
            last = run == args.runs - 1
            runs.append(
                run_on(
                    measure(rollouts, calls, args.concurrency, args.profile if last else None, args.chunk_tokens),
                    args.loop,
                )
            )
        best = min(runs, key=lambda r: r["handler_us_per_call"])
        best["runs_us"] = [round(r["handler_us_per_call"]) for r in runs]
        rows.append(best)
        print(
            f"{calls:3d} calls per rollout x {rollouts} rollouts: handler {best['handler_us_per_call']:6.0f} µs per "
            f"call (runs {best['runs_us']}), close_rollout {best['close_us_per_call']:5.0f} µs per call, "
            f"answers {best['statuses']}, recorded {best['recorded']}, "
            f"drift {best['drift_events']}",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()
