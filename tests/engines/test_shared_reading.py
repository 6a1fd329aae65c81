"""`SharedReading`: concurrent callers share one read, and each gets a read that started after it asked."""

from __future__ import annotations

import asyncio
import gc

import pytest

from clawgym_env.engines.shared_reading import SharedReading


class Counter:
    """A value that changes with every read: a read returns how many reads had started when it started."""

    def __init__(self, delay_s: float = 0.02, fail: bool = False) -> None:
        self.started = 0
        self.delay_s = delay_s
        self.fail = fail

    async def read(self) -> int:
        self.started += 1
        seen = self.started
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise ConnectionError(f"read {seen} failed")
        return seen


async def test_many_callers_at_once_share_two_reads():
    counter = Counter()
    reading = SharedReading(counter.read)
    first = asyncio.create_task(reading.fresh())
    await asyncio.sleep(0)  # the first read is out
    rest = [asyncio.create_task(reading.fresh()) for _ in range(99)]
    assert await first == 1
    assert await asyncio.gather(*rest) == [2] * 99  # they arrived while read 1 was out: all wait for read 2
    assert counter.started == reading.requests == 2


class GatedCounter:
    """Reads that end when the test says: read k returns k (the number of reads started when it started)."""

    def __init__(self) -> None:
        self.started = 0
        self.gates: list[asyncio.Event] = []

    async def read(self) -> int:
        self.started += 1
        seen = self.started
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return seen

    async def end(self, k: int) -> None:
        while len(self.gates) < k:
            await asyncio.sleep(0)
        self.gates[k - 1].set()


async def test_a_caller_never_gets_a_read_that_started_before_it_asked():
    counter = GatedCounter()
    reading = SharedReading(counter.read)
    a = asyncio.create_task(reading.fresh())  # starts read 1
    await asyncio.sleep(0)
    b = asyncio.create_task(reading.fresh())  # read 1 is out: b waits for read 2
    await asyncio.sleep(0)
    await counter.end(1)
    assert await a == 1
    c = asyncio.create_task(reading.fresh())  # read 2 (b's) is out: c waits for read 3
    d = asyncio.create_task(reading.fresh())  # ... and shares it with c
    await asyncio.sleep(0)
    await counter.end(2)
    assert await b == 2
    await counter.end(3)
    assert (await c, await d) == (3, 3) and reading.requests == counter.started == 3


async def test_one_caller_after_another_each_reads_anew():
    counter = Counter(delay_s=0)
    reading = SharedReading(counter.read)
    assert [await reading.fresh() for _ in range(3)] == [1, 2, 3]


async def test_a_failed_read_fails_every_caller_that_shared_it_and_the_next_read_is_new():
    counter = Counter(fail=True)
    reading = SharedReading(counter.read)
    first = asyncio.create_task(reading.fresh())
    await asyncio.sleep(0)
    queued = [asyncio.create_task(reading.fresh()) for _ in range(3)]
    with pytest.raises(ConnectionError, match="read 1"):
        await first
    for task in queued:
        with pytest.raises(ConnectionError, match="read 2"):
            await task
    counter.fail = False
    assert await reading.fresh() == 3


async def test_a_cancelled_caller_does_not_cancel_the_read_others_wait_for():
    counter = Counter()
    reading = SharedReading(counter.read)
    leaving = asyncio.create_task(reading.fresh())
    staying = asyncio.create_task(reading.fresh())
    await asyncio.sleep(0.005)
    leaving.cancel()
    assert await staying in (1, 2)
    with pytest.raises(asyncio.CancelledError):
        await leaving


async def test_failed_reads_nobody_waits_for_are_not_reported_as_unretrieved():
    loop = asyncio.get_running_loop()
    reports: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: reports.append(context))
    try:
        reading = SharedReading(Counter(fail=True).read)
        callers = [asyncio.create_task(reading.fresh())]
        await asyncio.sleep(0)
        callers.append(asyncio.create_task(reading.fresh()))  # queued for the second read
        await asyncio.sleep(0)
        for caller in callers:
            caller.cancel()
        await asyncio.sleep(0.08)  # both reads fail with no caller left
        gc.collect()
        assert reports == []
    finally:
        loop.set_exception_handler(None)
