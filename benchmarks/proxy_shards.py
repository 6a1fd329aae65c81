"""One proxy process against a `ShardedProxy` of K processes, side by side in one run, same load and engine.

    .venv/bin/python -m benchmarks.proxy_shards                         # 1 and 2 shards at N = 64, 1000
    .venv/bin/python -m benchmarks.proxy_shards --shards 1,2,4 --levels 1000 --clients 2
    .venv/bin/python -m benchmarks.proxy_shards --pool 2    # the real path: a VLLMServerPool over 2 stand-ins
    .venv/bin/python -m benchmarks.proxy_shards --pool 1 --via-hub   # ... its client in this process only

The load is `benchmarks.proxy_load`'s (its client processes: each rollout a keep-alive connection making
`--calls` streamed Chat Completions calls of a tool-calling conversation; the engine its `FastTestEngine`
double, which costs microseconds, so what is measured is the proxy). This process hosts the proxy: the
`ServingProxy` itself for 1 shard, or the `ShardedProxy`'s route table and engine hub for K > 1 (the engine
stays here; the shards' calls reach it through the hub). `--pool N`: the engine is a `VLLMServerPool` over N
`proxy_load` engine servers (the double behind the vLLM token API, in processes of their own; each answer
one chunk, or `--chunk-tokens K` ids per chunk), what `engine=vllm_server` trains with: each shard then runs
its own client of those servers (`--via-hub`: the pool's client stays in this process, the shards reach it
through the hub, as for an in-process engine).

Per row: calls/s through the proxy (wall), CPU per call in this process (the engine and, with shards, the
hub) and in the shards, and the calls per CPU-second of the busiest process: the throughput the proxy would
reach with a core per process (this machine may have fewer cores than processes; the wall calls/s then
stays flat while the per-process figure shows the headroom). Added latency: the median call through the
proxy minus the median of the same prompt ids sent straight into the engine at the same concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.headline import emit
from benchmarks.proxy_bench import COMPLETIONS
from benchmarks.proxy_load import FastTestEngine, client_commands, direct_baseline, remote_engine, run_on

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (from /proc: another process's clock)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def run_clients(routes: list[list[Any]], n: int, calls: int, clients: int, work: Path) -> list[dict[str, Any]]:
    """proxy_load's client processes (each route names its port), awaited so this loop serves meanwhile."""
    commands = client_commands(0, routes, n, calls, clients, work)
    procs = [await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE) for cmd in commands]
    results = []
    for proc in procs:
        out, _ = await proc.communicate()
        results.append(orjson.loads(out.splitlines()[-1]))
    return results


async def level(proxy: Any, policy: Any, n: int, rollouts: int, calls: int, clients: int, work: Path) -> dict[str, Any]:
    from clawgym_env.interfaces import RolloutLimits, SamplingParams

    shards = getattr(proxy, "shards", [])
    routes, ids = [], []
    for i in range(rollouts):
        rid = f"n{n}-{time.monotonic_ns()}-{i}"
        port = proxy.endpoint_for(rid).port
        route = proxy.open_rollout(rid, policy, RolloutLimits(max_calls=calls + 1))
        routes.append([route.path_prefix, route.api_key, port])
        ids.append(rid)
    main_at, shards_at = time.process_time(), [cpu_s(s.process.pid) for s in shards]
    results = await run_clients(routes, n, calls, max(1, min(clients, n)), work)
    main_cpu = time.process_time() - main_at
    shard_cpu = [cpu_s(s.process.pid) - at for s, at in zip(shards, shards_at)]
    recorded = [c for rid in ids for c in proxy.close_rollout(rid)]
    latencies = [x for r in results for x in r["latencies"]]
    sampling = SamplingParams(max_tokens=1024, stop_token_ids=tuple(policy.renderer.stop_token_ids))
    direct = await direct_baseline(policy.engine, [c.prompt_ids for c in recorded], n, sampling)
    errors = sum(len(r["errors"]) for r in results) + sum(c.error is not None for c in recorded)
    busiest = max([main_cpu, *shard_cpu])
    return {
        "shards": max(1, len(shards)),
        "n": n,
        "calls": len(latencies),
        "errors": errors,
        "calls_per_s": len(latencies) / max(r["wall_s"] for r in results),
        "main_cpu_ms_per_call": 1e3 * main_cpu / len(latencies),
        "shard_cpu_ms_per_call": 1e3 * sum(shard_cpu) / len(latencies),
        "busiest_calls_per_cpu_s": len(latencies) / busiest,
        "added_median_ms": 1e3 * (statistics.median(latencies) - statistics.median(direct["latencies"])),
        "load_avg": os.getloadavg()[0],
    }


def row(r: dict[str, Any]) -> str:
    return (
        f"shards={r['shards']} N={r['n']:>4} calls={r['calls']:>5} errors={r['errors']} | calls/s {r['calls_per_s']:6.0f} | "
        f"CPU ms/call main {r['main_cpu_ms_per_call']:.3f} shards {r['shard_cpu_ms_per_call']:.3f} | busiest process "
        f"{r['busiest_calls_per_cpu_s']:6.0f} calls per CPU-s | added median {r['added_median_ms']:6.2f} ms | "
        f"load {r['load_avg']:.2f}"
    )


async def bench(
    shard_counts: list[int],
    levels: list[int],
    calls: int,
    clients: int,
    min_rollouts: int,
    pool: int = 0,
    chunk_tokens: int = 0,
    via_hub: bool = False,
) -> list[dict]:
    from benchmarks import servers
    from clawgym_env.chat import ChatMLRenderer
    from clawgym_env.engines.tokenizer import load_qwen_tokenizer
    from clawgym_env.interfaces import Policy
    from clawgym_env.proxy import ServingProxy, ShardedProxy

    tokenizer = load_qwen_tokenizer()
    processes = []
    if pool:
        options = argparse.Namespace(pool=pool, chunk_tokens=chunk_tokens, token_delay_ms=0.0, engine_delay_ms=0.0)
        engine, processes = await remote_engine(options)
    else:
        engine = FastTestEngine(tokenizer, COMPLETIONS)
    policy = Policy(engine=engine, renderer=ChatMLRenderer(tokenizer))  # type: ignore[arg-type]
    rows = []
    with contextlib.ExitStack() as cleanup, tempfile.TemporaryDirectory(prefix="clawgym-proxy-shards-") as tmp:
        for process in processes:
            cleanup.callback(servers.stop, process)
        if pool:
            cleanup.callback(engine.close)
        work = Path(tmp)
        for k in shard_counts:
            run_dir = work / f"run-{k}"
            proxy = (
                ShardedProxy(run_dir, k, port=0, engines_in_shards=not via_hub)
                if k > 1
                else ServingProxy(run_dir, port=0, unix_socket=None)
            )
            async with proxy:
                await level(proxy, policy, 8, 16, 2, 1, work)  # warm-up: imports, caches, first connections
                for n in levels:
                    rows.append(await level(proxy, policy, n, max(n, min_rollouts), calls, clients, work))
                    print(row(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy_shards", description=__doc__.split("\n")[0])
    parser.add_argument("--shards", default="1,2", help="shard counts to compare, comma-separated (1 = ServingProxy)")
    parser.add_argument("--levels", default="64,1000", help="concurrent rollouts, comma-separated")
    parser.add_argument("--calls", type=int, default=4, help="streamed calls per rollout")
    parser.add_argument("--clients", type=int, default=1, help="client processes")
    parser.add_argument("--min-rollouts", type=int, default=256)
    parser.add_argument("--pool", type=int, default=0, help="engine: a VLLMServerPool over this many engine servers")
    parser.add_argument(
        "--chunk-tokens", type=int, default=0, help="with --pool: ids per streamed chunk (0: one chunk)"
    )
    parser.add_argument("--via-hub", action="store_true", help="with --pool: shards reach the pool through the hub")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = run_on(
        bench(
            [int(x) for x in args.shards.split(",")],
            [int(x) for x in args.levels.split(",")],
            args.calls,
            args.clients,
            args.min_rollouts,
            args.pool,
            args.chunk_tokens,
            args.via_hub,
        )
    )
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    top_n = max(r["n"] for r in rows)
    at = {r["shards"]: r for r in rows if r["n"] == top_n}
    most, least = at[max(at)], at[min(at)]
    emit(
        "proxy_shards",
        most["busiest_calls_per_cpu_s"],
        f"busiest process {most['busiest_calls_per_cpu_s']:,.0f} calls per CPU-s with {most['shards']} shards vs "
        f"{least['busiest_calls_per_cpu_s']:,.0f} with {least['shards']} at N = {top_n:,}, "
        f"{sum(r['errors'] for r in rows)} errors",
    )
    return rows


if __name__ == "__main__":
    main()
