"""Blocking forms of an engine's async calls, for trainer threads that do not run its event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


def run_on_engine_loop(
    loop: asyncio.AbstractEventLoop | None, make: Callable[[], Coroutine[Any, Any, Any]], hint: str
) -> Any:
    """Run `make()` on the engine's event loop and wait for its result; with no (live) loop yet, on a fresh one.

    Called on the engine's own loop this would wait for itself forever, so it refuses; `hint` says which
    coroutine to await there instead.
    """
    if loop is None or loop.is_closed():
        return asyncio.run(make())
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        raise RuntimeError(f"this would block the engine's event loop; use `{hint}`")
    return asyncio.run_coroutine_threadsafe(make(), loop).result()
