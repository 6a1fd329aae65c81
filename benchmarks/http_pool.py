"""Many concurrent requests to one server over kept-alive connections: httpcore's pool against `Connections`.

    .venv/bin/python -m benchmarks.http_pool                      # 100 and 512 concurrent, 3 rounds each

`RemoteEngine` sends one request per model call in flight to its vLLM server. The server here is a bare
uvicorn app in its own process answering `GET /health` (microseconds), so what is measured is the client:
per round, `--concurrency` requests at once over the connections the previous round left open, and this
process's CPU time for the round. httpcore's `AsyncConnectionPool` (what httpx uses) with no connection cap
against `clawgym_env.engines.http_connections.Connections` (aiohttp's connections, no cap), alternated round by round,
side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import httpcore

from benchmarks import servers
from clawgym_env.engines.http_connections import Connections


def serve(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", loop="uvloop", timeout_keep_alive=60)


async def one_round(client: Any, url: str, concurrency: int) -> float:
    """CPU seconds for `concurrency` concurrent requests."""
    start = time.process_time()
    answers = await asyncio.gather(*(client.request("GET", url) for _ in range(concurrency)))
    assert all(a.status == 200 for a in answers)
    return time.process_time() - start


async def measure(url: str, levels: list[int], rounds: int) -> None:
    for concurrency in levels:
        clients = {
            "httpcore pool": httpcore.AsyncConnectionPool(max_connections=None, max_keepalive_connections=1024),
            "Connections": Connections(),
        }
        cpu: dict[str, list[float]] = {name: [] for name in clients}
        for client in clients.values():  # warm-up: open the connections
            await one_round(client, url + "/health", concurrency)
        for _ in range(rounds):
            for name, client in clients.items():
                cpu[name].append(await one_round(client, url + "/health", concurrency))
        base = statistics.median(cpu["httpcore pool"])
        for name, seconds in cpu.items():
            median = statistics.median(seconds)
            print(
                f"{concurrency:4d} concurrent, {name:13s}: {1e6 * median / concurrency:7.0f} µs CPU per request "
                f"({median / base:4.2f}x the pool; rounds {', '.join(f'{1e3 * s:.0f}' for s in seconds)} ms)",
                flush=True,
            )
        for client in clients.values():
            await client.aclose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="100,512", help="concurrent requests, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return
    levels = [int(n) for n in args.levels.split(",")]
    servers.measure_against(lambda url: measure(url, levels, args.rounds), "benchmarks.http_pool", "--serve", "{port}")


if __name__ == "__main__":
    main()
