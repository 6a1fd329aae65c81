"""How long the event loop stalled while an attack ran: what every other rollout's model call would wait.

    async with LoopLag() as lag:
        await verify_stage(...)
    assert lag.worst_s < 1.0

A ticker sleeps `tick_s` and records how late each wake-up was; the worst lateness is the longest time the
loop could not run anything else (a proxy call of another rollout shares this loop).
"""

from __future__ import annotations

import asyncio
import time


class LoopLag:
    def __init__(self, tick_s: float = 0.01) -> None:
        self.tick_s = tick_s
        self.worst_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.tick_s)
            self.worst_s = max(self.worst_s, time.perf_counter() - before - self.tick_s)

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
