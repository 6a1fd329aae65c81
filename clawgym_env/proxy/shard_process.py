"""A proxy shard process: `python -m clawgym_env.proxy.shard_process FD`, started by `ShardedProxy`.

It runs one `ServingProxy` on its own socket whose policies generate through the `EngineHub` of the process
that started it (`HubEngine`), and takes control calls (open, close, stats, ...) over the socket it
inherited as FD. When that socket closes (the main process stopped it, or died) the shard stops.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from clawgym_env.interfaces import Policy
from clawgym_env.proxy.engine_hub import HubEngine, HubLink

# what a shard's control thread may call on its ServingProxy (anything else is refused)
SHARD_METHODS = ("close_rollout", "stats", "calls", "record_inprocess_call", "guard_stats", "table_sizes")


def shard_main(control_fd: int) -> None:
    """A shard process (`python -m clawgym_env.proxy.shards FD`): a `ServingProxy` whose engines are the
    hub's, driven over the control socket it inherited until that closes. Its first message says what to be."""
    conn = Connection(control_fd)
    index, run_dir, options, hub_path = conn.recv()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_serve_shard(index, run_dir, options, hub_path, conn))


async def _serve_shard(index: int, run_dir: Path, options: dict[str, Any], hub_path: str, conn: Connection) -> None:
    from clawgym_env.proxy.server import ServingProxy

    loop = asyncio.get_running_loop()
    link = await HubLink.connect(hub_path)
    proxy = ServingProxy(run_dir, **options)
    await proxy.start()
    policies: dict[int, Policy] = {}

    def handle(message: tuple[Any, ...]) -> Any:
        op, *args = message
        if op == "policy":
            key, renderer, name, max_context, version, abortable = args
            engine = HubEngine(link, key, version, abortable)
            policies[key] = Policy(engine=engine, renderer=pickle.loads(renderer), name=name, max_context=max_context)
            return None
        if op == "open":
            rollout_id, key, limits = args
            return proxy.open_rollout(rollout_id, policies[key], limits)
        if op == "stop":
            stopping.set()
            return None
        if op not in SHARD_METHODS:
            raise ValueError(f"proxy shard: unknown control call {op!r}")
        return getattr(proxy, op)(*args)

    async def run(message: tuple[Any, ...]) -> Any:
        return handle(message)

    def control() -> None:
        """Blocks on the pipe in a thread; each request runs on the shard's loop, between its calls."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                loop.call_soon_threadsafe(stopping.set)  # the main process is gone
                return
            try:
                answer: tuple[Any, ...] = ("ok", asyncio.run_coroutine_threadsafe(run(message), loop).result())
            except Exception as exc:  # noqa: BLE001 - raised again in the main process
                answer = ("error", type(exc).__name__, str(exc))
            try:
                conn.send(answer)
            except (EOFError, OSError):
                return
            if message[0] == "stop":
                return

    stopping = asyncio.Event()
    conn.send(("ready", proxy.endpoint))
    threading.Thread(target=control, name=f"clawgym-shard-{index}-control", daemon=True).start()
    try:
        await stopping.wait()
    finally:
        await proxy.stop()
        await link.aclose()


if __name__ == "__main__":
    shard_main(int(sys.argv[1]))
