"""Blocking forms of an engine's async calls, for trainer threads that do not run its event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import Any


def run_on_engine_loop(loop: asyncio.AbstractEventLoop, make: Callable[[], Coroutine[Any, Any, Any]], hint: str) -> Any:
    """Run `make()` on the engine's (running) event loop from another thread and wait for its result.

    Called on the engine's own loop this would wait for itself forever, so it refuses; `hint` says which
    coroutine to await there instead.
    """
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        raise RuntimeError(f"this would block the engine's event loop; use `{hint}`")
    return asyncio.run_coroutine_threadsafe(make(), loop).result()


class LoopBoundWeights:
    """Weight updates for an engine whose async client binds to the first event loop that uses it (vLLM's
    AsyncLLM; the server pool's HTTP clients).

    A blocking `update_weights` before any loop has used the engine (a trained policy built for evaluation,
    a resumed run's first sync) must not run on a throwaway loop: the client would stay bound to that dead
    loop and every later call would hang. The weights are held instead and go in at the start of the first
    call, on that call's loop, before it generates; `policy_version` already names them.
    Subclasses set `_loop = None` and `policy_version`, define `aupdate_weights`, and call `await
    self._bind_loop()` first in every call.
    """

    _loop: asyncio.AbstractEventLoop | None
    _pending_weights: tuple[Mapping[str, Any], int] | None = None
    _applying: asyncio.Future[None] | None = None
    policy_version: int

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Blocking form for a trainer thread; inside the engine's event loop `await aupdate_weights(...)`."""
        if self._loop is None or self._loop.is_closed():
            self._pending_weights = (state_dict, version)
            self.policy_version = version
            return
        run_on_engine_loop(
            self._loop, lambda: self.aupdate_weights(state_dict, version), "await engine.aupdate_weights(...)"
        )

    async def aupdate_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        raise NotImplementedError

    async def _bind_loop(self) -> None:
        """Adopt the running loop; load weights handed over before there was one (every early call waits)."""
        self._loop = asyncio.get_running_loop()
        if self._pending_weights is not None:
            pending, self._pending_weights = self._pending_weights, None
            self._applying = asyncio.ensure_future(self.aupdate_weights(*pending))
        if self._applying is not None:
            await asyncio.shield(self._applying)  # a cancelled caller does not cancel the load
            self._applying = None
