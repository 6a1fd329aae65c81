"""A benchmark's server in a process of its own, on a free loopback port: start it, wait until it answers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable

import httpx

from clawgym_env.engines.vllm_server import free_port


def start(module: str, *args: str) -> tuple[str, subprocess.Popen[bytes]]:
    """Run `python -m module *args` with "{port}" in `args` replaced by a free port; (its URL, the process)."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", module, *(a.replace("{port}", str(port)) for a in args)])
    return f"http://127.0.0.1:{port}", process


async def wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    """Until `GET url/health` answers 200 (the server imports and loads its tokenizer first)."""
    async with httpx.AsyncClient() as client:
        for _ in range(int(timeout_s / 0.1)):
            try:
                if (await client.get(url + "/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} did not answer /health within {timeout_s:g} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(10)


def measure_against(measure: Callable[[str], Awaitable[None]], module: str, *args: str) -> None:
    """Start the server (as `start`), wait until it answers, run `measure(url)` on a fresh event loop, stop it."""
    url, process = start(module, *args)

    async def run() -> None:
        await wait_healthy(url)
        await measure(url)

    try:
        asyncio.run(run())
    finally:
        stop(process)
