"""One reading of a remote value shared by every caller that asked for it at once.

`VLLMServerPool` asks a server for its policy version before a call, and after it when the server does not
name its life (a version that changed in between, e.g. a restart, means the call's output came from no
single policy). The answer must come from a request sent *after* the caller asked: an older one may
predate the change it is checking for. Sending one request per check makes 2,000 requests at 1,000 calls
in flight, each one a pass through the server's engine loop (vLLM's `/collective_rpc` waits for a
scheduler step). Here, a caller that arrives while a request is out waits for the next one, which starts
when that one ends and answers everyone who arrived meanwhile: at most one request out and one queued per
value, whatever the concurrency, and every answer still comes from a request sent after its caller asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SharedReading(Generic[T]):
    """`await reading.fresh()`: the result of a `read()` that started after this call (shared, see above).

    A failed read raises in every caller that shared it. Cancelling a caller does not cancel the read others
    wait for. `requests` counts the reads sent (for tests and reports). Use it on one event loop.
    """

    def __init__(self, read: Callable[[], Awaitable[T]]) -> None:
        self._read = read
        self._out: asyncio.Future[T] | None = None  # the read now out: started before anyone arriving now
        self._queued: asyncio.Future[T] | None = None  # the next read, for those who arrived while one was out
        self.requests = 0

    async def fresh(self) -> T:
        if self._out is None:
            self._out = self._start()
            waiter = self._out
        else:
            if self._queued is None:
                self._queued = asyncio.get_running_loop().create_future()
            waiter = self._queued
        return await asyncio.shield(waiter)

    def _start(self) -> asyncio.Future[T]:
        self.requests += 1
        task = asyncio.ensure_future(self._read())
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Future[T]) -> None:
        queued, self._queued = self._queued, None
        if queued is None:
            self._out = None
            return
        self._out = self._start()
        self._out.add_done_callback(lambda done: _copy_result(done, queued))


def _copy_result(source: asyncio.Future[T], target: asyncio.Future[T]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())
