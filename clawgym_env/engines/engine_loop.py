"""A private event loop for an engine whose async client works on one event loop only.

vLLM's AsyncLLM (its output handler and ZMQ sockets) and the server pool's HTTP clients bind to the event
loop that first uses them; a call from another loop then hangs or finds the engine dead. Yet one engine
serves many loops in turn: the trainer's `Runtime`, and an evaluation's own `Runtime` per harness. So such
an engine keeps its client on an `EngineLoop` (a loop on a daemon thread of its own) and every caller, on
any loop or thread, reaches it through `call`, `stream` or `run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_END = object()


class EngineLoop:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def on_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T], hint: str = "await the async form") -> T:
        """Blocking: run `coro` on the engine's loop from a thread that is not that loop, and return its result."""
        if self.on_loop():
            coro.close()
            raise RuntimeError(f"this would block the engine's event loop; {hint}")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on the engine's loop from any loop; cancelling the caller cancels it there."""
        if self.on_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Start `coro` on the engine's loop and do not wait for it."""
        asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def stream(self, make: Callable[[], AsyncIterator[T]]) -> AsyncIterator[T]:
        """Relay the async iterator `make()` runs on the engine's loop to the caller's loop, item by item.

        Closing the relay early (or cancelling its consumer) cancels the iterator on the engine's loop, whose
        own clean-up (an abort) then runs there.
        """
        if self.on_loop():
            async with contextlib.aclosing(make()) as items:  # type: ignore[type-var]
                async for item in items:
                    yield item
            return
        caller = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue()

        def put(ok: bool, value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is listening
                caller.call_soon_threadsafe(queue.put_nowait, (ok, value))

        async def pump() -> None:
            try:
                async with contextlib.aclosing(make()) as items:  # type: ignore[type-var]
                    async for item in items:
                        put(True, item)
            except BaseException as exc:
                put(False, exc)
                raise
            put(False, _END)

        future = asyncio.run_coroutine_threadsafe(pump(), self.loop)
        try:
            while True:
                ok, value = await queue.get()
                if ok:
                    yield value
                elif value is _END:
                    return
                elif isinstance(value, asyncio.CancelledError):
                    raise RuntimeError("the engine's stream was cancelled on its own loop (the engine is closing)")
                else:
                    raise value
        finally:
            future.cancel()

    def close(self) -> None:
        """Stop the loop and its thread (after the engine's own shutdown)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.on_loop():
            self._thread.join(10)
            if not self._thread.is_alive():
                self.loop.close()
