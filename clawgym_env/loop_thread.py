"""An event loop on a daemon thread of its own, reached from any other loop or thread.

Two parts need one: the `Runtime` (its proxy and sandboxes live on one loop while the trainer's code is
synchronous) and an engine whose async client works on one event loop only. vLLM's AsyncLLM (its output
handler and ZMQ sockets) and the server pool's HTTP clients bind to the event loop that first uses them; a
call from another loop then hangs or finds the engine dead. Yet one engine serves many loops in turn: the
trainer's `Runtime`, and an evaluation's own `Runtime` per harness. So such an engine keeps its client on a
`LoopThread` too, and every caller, on any loop or thread, reaches it through `call`, `stream` or `run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_END = object()


class LoopThread:
    """A loop running forever on a daemon thread named `name`, until `close`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def on_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T], hint: str = "await the async form", timeout: float | None = None) -> T:
        """Blocking: run `coro` on the loop from a thread that is not that loop, and return its result.

        If waiting ends early (a timeout, KeyboardInterrupt), `coro` is cancelled on the loop, so its
        finally-blocks (a rollout destroying its sandbox, an engine aborting its request) still run.
        """
        if self.on_loop():
            coro.close()
            raise RuntimeError(f"this would block the loop's thread; {hint}")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on this loop from any loop; cancelling the caller cancels it there."""
        if self.on_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Start `coro` on this loop and do not wait for it."""
        asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def stream(self, make: Callable[[], AsyncIterator[T]]) -> AsyncIterator[T]:
        """Relay the async iterator `make()` runs on this loop to the caller's loop, item by item.

        Closing the relay early (or cancelling its consumer) cancels the iterator on this loop, whose
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
                    raise RuntimeError("the stream was cancelled on its own loop (its owner is closing)")
                else:
                    raise value
        finally:
            future.cancel()

    def close(self) -> None:
        """Stop the loop and its thread (after its owner's own shutdown ran on it), then close the loop.

        Closed here, not by the garbage collector: a stopped loop left in a reference cycle was finalized after
        its own self-pipe sockets ("Invalid file descriptor: -1"), inside whichever later test collected it.
        """
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.on_loop():
            self._thread.join(10)
            if not self._thread.is_alive():
                self.loop.close()
