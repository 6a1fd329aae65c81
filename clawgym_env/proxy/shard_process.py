"""A proxy shard process: `python -m clawgym_env.proxy.shard_process FD`, started by `ShardedProxy`.

It runs one `ServingProxy` on its own socket whose policies generate through the `EngineHub` of the process
that started it (`HubEngine`), or, for an engine that is a client of servers anyway (`VLLMServerPool`),
through the shard's own client of the same servers, which follows the caller's weight updates (`hold`,
`release`). It takes control calls (open, close, stats, ...) over the socket it inherited as FD, each
`(id, message)` and answered `(id, answer)`; when that socket closes (the caller stopped it, or died) the
shard stops.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import pickle
import sys
import threading
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from clawgym_env.interfaces import Policy
from clawgym_env.proxy.engine_hub import HubEngine, HubLink
from clawgym_env.specs import resolve_callable

# what a shard's control thread may call on its ServingProxy (anything else is refused)
SHARD_METHODS = (
    "close_rollout",
    "stats",
    "calls",
    "admit_in_process",
    "record_inprocess_call",
    "guard_stats",
    "table_sizes",
)
# what it may call on a policy's engine when the shard runs its own client of it (`follower_engine`)
FOLLOWER_METHODS = ("hold", "release", "report")


def shard_main(control_fd: int) -> None:
    """A shard process (`python -m clawgym_env.proxy.shard_process FD`): a `ServingProxy` whose engines are the
    hub's, driven over the control socket it inherited until that closes. Its first message says what to be."""
    conn = Connection(control_fd)
    index, run_dir, options, hub_path = conn.recv()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    sys.exit(asyncio.run(_serve_shard(index, run_dir, options, hub_path, conn)))


async def _serve_shard(index: int, run_dir: Path, options: dict[str, Any], hub_path: str, conn: Connection) -> int:
    from clawgym_env.proxy.server import ServingProxy

    loop = asyncio.get_running_loop()
    link = await HubLink.connect(hub_path)
    proxy = ServingProxy(run_dir, **options)
    await proxy.start()
    policies: dict[int, Policy] = {}
    renderers: dict[int, Any] = {}
    followers: dict[int, Any] = {}  # engine key -> this shard's own client of it
    send_lock = threading.Lock()
    stopping = asyncio.Event()
    exit_code = 0

    def hub_lost(why: str) -> None:
        """Without its hub a shard cannot generate: it exits (non-zero), and its caller counts and replaces it."""
        nonlocal exit_code
        print(f"clawgym proxy shard {index}: {why}; exiting", file=sys.stderr, flush=True)
        exit_code = 3
        stopping.set()

    link.on_lost = hub_lost

    async def handle(op: str, *args: Any) -> Any:
        if op == "policy":
            key, (renderer_key, pickled), name, max_context, version, abortable, follower = args
            if pickled is not None:  # each renderer comes once; the policies made per rollout share it
                renderers[renderer_key] = pickle.loads(pickled)
            if follower is not None:  # this shard's own client of the engine, built once per engine
                engine_key, spec = follower
                if spec is not None:
                    followers[engine_key] = follower_engine(spec)
                engine = followers[engine_key]
            else:
                engine = HubEngine(link, key, version, abortable)
            renderer = renderers[renderer_key]
            policies[key] = Policy(engine=engine, renderer=renderer, name=name, max_context=max_context)
            return None
        if op == "open":
            rollout_id, key, limits = args
            return proxy.open_rollout(rollout_id, policies[key], limits)
        if op in FOLLOWER_METHODS:  # the caller's engine is updating weights: this shard's own client follows
            engine_key, *rest = args
            result = getattr(followers[engine_key], op)(*rest)
            return await result if inspect.isawaitable(result) else result
        if op == "stop":
            stopping.set()
            return None
        if op not in SHARD_METHODS:
            raise ValueError(f"proxy shard: unknown control call {op!r}")
        return getattr(proxy, op)(*args)

    def reply(call_id: int, answer: tuple[Any, ...]) -> None:
        with send_lock:
            try:
                conn.send((call_id, answer))
            except (EOFError, OSError):
                loop.call_soon_threadsafe(stopping.set)

    def answered(call_id: int, done: Future[Any]) -> None:
        exc = done.exception()
        reply(call_id, ("ok", done.result()) if exc is None else ("error", type(exc).__name__, str(exc)))

    def control() -> None:
        """Blocks on the socket in a thread; each call runs on the shard's loop, between its HTTP calls, and
        is answered when it ends (a slow one, such as `hold`, holds up no other)."""
        while True:
            try:
                call_id, message = conn.recv()
            except (EOFError, OSError):
                loop.call_soon_threadsafe(stopping.set)  # the main process is gone
                return
            done = asyncio.run_coroutine_threadsafe(handle(*message), loop)
            done.add_done_callback(functools.partial(answered, call_id))

    reply(0, ("ok", proxy.endpoint))
    threading.Thread(target=control, name=f"clawgym-shard-{index}-control", daemon=True).start()
    try:
        await stopping.wait()
    finally:
        await proxy.stop()
        await link.aclose()
        for engine in followers.values():
            await engine.aclose()
    return exit_code


def follower_engine(spec: dict[str, Any]) -> Any:
    """A shard's own client of the caller's engine (`engine.follower_spec()`: `factory` names the class)."""
    factory = resolve_callable(spec["factory"])
    return factory(**spec["options"])


if __name__ == "__main__":
    shard_main(int(sys.argv[1]))
