"""The runtime: one background event loop that hosts the serving proxy and runs rollouts.

Gymnasium's API is synchronous, but a rollout is concurrent by nature (the harness process talks to the
proxy while we wait on it). So every env of a process shares one `Runtime`: an asyncio loop in a daemon
thread that owns the proxy server and the sandbox backends; `env.step` submits a coroutine to it and
waits. Many envs (and the vector env) therefore share one proxy and one call log per run directory.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from clawgym_env.interfaces import RolloutProxy, SandboxBackend
from clawgym_env.loop_thread import LoopThread

T = TypeVar("T")


def default_run_dir() -> Path:
    return Path.cwd() / "runs" / time.strftime("%Y%m%d-%H%M%S")


class FailureCounter:
    """Every failure counted and visible: `{stage: {reason: count}}`, thread-safe.

    Reasons can name a rollout (an exception's text), so each stage keeps at most `max_reasons` distinct
    ones; later new reasons are counted under `OTHER`: the table stays bounded over millions of rollouts.
    """

    OTHER = "(other reasons)"

    def __init__(self, max_reasons: int = 256) -> None:
        self._lock = threading.Lock()
        self.max_reasons = max_reasons
        self.counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)

    def add(self, stage: str, reason: str) -> None:
        reason = reason.split("\n", 1)[0][:120]
        with self._lock:
            counter = self.counts[stage]
            if reason not in counter and len(counter) >= self.max_reasons:
                reason = self.OTHER
            counter[reason] += 1

    def total(self) -> int:
        with self._lock:
            return sum(sum(c.values()) for c in self.counts.values())

    def as_dict(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {stage: dict(c) for stage, c in self.counts.items()}


class Runtime:
    """Owns the event loop thread, the serving proxy and the sandbox backends of a run directory."""

    _default: Runtime | None = None
    _default_lock = threading.Lock()

    def __init__(
        self,
        run_dir: Path | None = None,
        *,
        proxy_port: int | None = None,
        proxy_public_url: str | None = None,
        proxy_shards: int = 1,
    ) -> None:
        """proxy_port: also serve the proxy on this loopback TCP port (0 = any free one); proxy_public_url: where
        remote sandboxes (Daytona) reach it, e.g. a tunnel to that port (it implies TCP on a free port).
        proxy_shards: above 1, the proxy is a `ShardedProxy` of that many processes (for thousands of calls per
        second; docs/proxy.md), with each shard's call log under `run_dir/shard-K/`."""
        if proxy_shards > 1 and (proxy_public_url or proxy_port not in (None, 0)):
            raise ValueError(
                "proxy_shards > 1 serves each shard on its own socket and free port: it cannot be combined with "
                "proxy_public_url or a fixed proxy_port (use one shard behind a tunnel for remote sandboxes)"
            )
        self.run_dir = Path(run_dir) if run_dir else default_run_dir()
        self.proxy_port = 0 if proxy_public_url and proxy_port is None else proxy_port
        self.proxy_public_url = proxy_public_url
        self.proxy_shards = proxy_shards
        self.failures = FailureCounter()
        self._loop_thread = LoopThread("clawgym-runtime")
        self._proxy: RolloutProxy | None = None
        self._proxy_lock = asyncio.Lock()
        self._backends: dict[tuple[str, str], SandboxBackend] = {}
        self._closed = False
        atexit.register(self.close)

    @classmethod
    def is_default(cls, runtime: Runtime) -> bool:
        """Whether `runtime` is the shared default one (which outlives the envs that use it)."""
        return runtime is cls._default

    @classmethod
    def default(cls) -> Runtime:
        with cls._default_lock:
            if cls._default is None or cls._default._closed:
                cls._default = Runtime()
            return cls._default

    # ------------------------------------------------------------------ running coroutines
    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the runtime's loop from synchronous code and wait for it."""
        if self._closed:
            coro.close()
            raise RuntimeError("this Runtime is closed; make a new environment")
        # KeyboardInterrupt / timeout cancel it on the loop: the rollout's finally-blocks destroy its sandbox
        return self._loop_thread.run(coro, "await it on the runtime's loop instead", timeout=timeout)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop_thread.loop

    # ------------------------------------------------------------------ shared parts
    async def proxy(self) -> RolloutProxy:
        """The serving proxy of this run, started on first use (Unix socket + loopback port)."""
        async with self._proxy_lock:  # concurrent first rollouts must not start two proxies
            if self._proxy is None:
                from clawgym_env.proxy import ServingProxy, ShardedProxy

                proxy: RolloutProxy = (
                    ShardedProxy(self.run_dir, self.proxy_shards, port=self.proxy_port)
                    if self.proxy_shards > 1
                    else ServingProxy(run_dir=self.run_dir, port=self.proxy_port, public_url=self.proxy_public_url)
                )
                await proxy.start()
                self._proxy = proxy
        return self._proxy

    def proxy_report(self) -> dict[str, Any] | None:
        """The proxy's counts for a run's summary (its shards and any lost, when sharded); None before it started."""
        report = getattr(self._proxy, "report", None)
        return report() if callable(report) else None

    async def backend(self, name: str, options: dict[str, Any]) -> SandboxBackend:
        key = (name, repr(sorted(options.items())))
        if key not in self._backends:
            from clawgym_env.serving_stack import backend_hiding_run_dir

            self._backends[key] = backend_hiding_run_dir(name, options, self.run_dir)
        return self._backends[key]

    # ------------------------------------------------------------------ teardown
    async def _aclose(self) -> None:
        for backend in self._backends.values():
            await backend.aclose()
        self._backends.clear()
        if self._proxy is not None:
            await self._proxy.stop()
            self._proxy = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.loop.is_running():
            try:
                self._loop_thread.run(self._aclose(), timeout=60)
            except Exception:  # noqa: BLE001 - best effort at exit; the reaper cleans leftovers
                pass
        self._loop_thread.close()
        atexit.unregister(self.close)
