"""What an open rollout costs the proxy in memory, as its calls add up.

    .venv/bin/python -m benchmarks.proxy_memory                      # 4, 32 and 96 calls per rollout
    PYTHONPATH=/path/to/other/checkout .venv/bin/python -m benchmarks.proxy_memory    # A/B another version

`--rollouts` rollouts of the proxy_load workload (`FastTestEngine`, a named test double; the append-only
tool-calling chat, one streamed Chat Completions call per turn, through the proxy's ASGI hot routes as
`benchmarks.proxy_handler` drives them) are played to `--calls` calls each and left open, as a proxy
serving long rollouts holds them. Printed per row: the bytes Python holds for them (tracemalloc: what the
proxy keeps, not what the allocator has not given back) and the process's RSS growth, per open rollout and
per call. Memory per call that stays flat as rollouts grow is linear; memory per call that grows with the
calls is the square of them (every call's whole prompt kept).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import orjson

from benchmarks.proxy_bench import COMPLETIONS, SYSTEM, TOOLS
from benchmarks.proxy_handler import _serve_one, chat_call
from benchmarks.proxy_load import FastTestEngine, next_turn, rss_mb, run_on


async def held_by_open_rollouts(rollouts: int, calls: int) -> dict[str, float]:
    from clawgym_env.chat import ChatMLRenderer
    from clawgym_env.engines.tokenizer import load_qwen_tokenizer
    from clawgym_env.interfaces import Policy, RolloutLimits
    from clawgym_env.proxy import ServingProxy

    tokenizer = load_qwen_tokenizer()
    policy = Policy(engine=FastTestEngine(tokenizer, COMPLETIONS), renderer=ChatMLRenderer(tokenizer))  # type: ignore[arg-type]
    run_dir = Path(tempfile.mkdtemp(prefix="proxy-memory-"))
    proxy = ServingProxy(run_dir, port=0, unix_socket=None)
    await proxy.start()
    app = proxy.asgi
    tools = orjson.dumps(TOOLS)

    async def rollout(name: str) -> None:
        route = proxy.open_rollout(name, policy, RolloutLimits(max_calls=calls + 1))
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": name}]
        for _ in range(calls):
            scope, body = chat_call(route, tools, messages)
            status, answer = await _serve_one(app, scope, body)
            assert status == 200, answer[:300]
            next_turn(messages, [line[6:] for line in answer.split(b"\n") if line.startswith(b"data: ")])

    await rollout("warm-up")
    proxy.close_rollout("warm-up")
    gc.collect()
    rss_before = rss_mb()
    tracemalloc.start()
    await asyncio.gather(*(rollout(f"r{i}") for i in range(rollouts)))
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    rss_after = rss_mb()
    await proxy.stop()
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"held_kb": held / 1e3 / rollouts, "rss_kb": (rss_after - rss_before) * 1024 / rollouts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", default="4,32,96", help="calls per rollout, comma-separated (one row each)")
    parser.add_argument("--rollouts", type=int, default=100, help="open rollouts per row")
    args = parser.parse_args()
    for calls in (int(c) for c in args.calls.split(",")):
        row = run_on(held_by_open_rollouts(args.rollouts, calls))
        print(
            f"{calls:3d} calls per rollout x {args.rollouts} open: held {row['held_kb']:7.0f} kB per rollout "
            f"({row['held_kb'] / calls:5.1f} kB per call), RSS +{row['rss_kb']:7.0f} kB per rollout"
        )


if __name__ == "__main__":
    main()
