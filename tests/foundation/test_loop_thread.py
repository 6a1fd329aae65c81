"""LoopThread: a loop on a thread of its own, reached from any loop or thread. Here it holds a test double of an
engine's loop-bound client; the real engines are covered in test_vllm_engine.py, test_vllm_server.py and
tests/evaluation/test_compare.py, the Runtime in test_env_api.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from clawgym_env.loop_thread import LoopThread


class OneLoopTestClient:
    """Test double of vLLM's client: it works on the first event loop that uses it and fails on any other."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed_on: list[threading.Thread] = []

    def _check(self) -> None:
        running = asyncio.get_running_loop()
        self.loop = self.loop or running
        if running is not self.loop:
            raise RuntimeError("used from a second event loop")

    async def generate(self, n: int) -> list[int]:
        self._check()
        await asyncio.sleep(0)
        return list(range(n))

    async def stream(self, n: int) -> AsyncIterator[int]:
        self._check()
        try:
            for i in range(n):
                await asyncio.sleep(0.001)
                if i == 3 and n == 4:
                    raise ValueError("the engine failed at token 3")
                yield i
        finally:
            self.closed_on.append(threading.current_thread())


@pytest.fixture
def engine_loop():
    loop = LoopThread("test-engine")
    yield loop
    loop.close()


def test_the_client_never_sees_another_loop(engine_loop: LoopThread) -> None:
    client = OneLoopTestClient()
    for _ in range(2):  # two event loops in turn, as two evaluations' Runtimes
        assert asyncio.run(engine_loop.call(client.generate(3))) == [0, 1, 2]

    async def streamed() -> list[int]:
        return [i async for i in engine_loop.stream(lambda: client.stream(5))]

    assert asyncio.run(streamed()) == [0, 1, 2, 3, 4]
    assert engine_loop.run(client.generate(2)) == [0, 1]  # from this (trainer) thread
    assert client.loop is engine_loop.loop
    with pytest.raises(RuntimeError, match="second event loop"):  # what it guards against
        asyncio.run(client.generate(1))


def test_a_stream_left_early_is_closed_on_the_engines_loop(engine_loop: LoopThread) -> None:
    client = OneLoopTestClient()

    async def first_two() -> list[int]:
        got = []
        async for i in engine_loop.stream(lambda: client.stream(1000)):
            got.append(i)
            if len(got) == 2:
                break
        for _ in range(100):  # the inner stream's clean-up (vLLM's abort) runs there, soon
            if client.closed_on:
                break
            await asyncio.sleep(0.01)
        return got

    assert asyncio.run(first_two()) == [0, 1]
    assert [t.name for t in client.closed_on] == ["test-engine"]


def test_errors_reach_the_caller_and_blocking_on_the_loop_is_refused(engine_loop: LoopThread) -> None:
    client = OneLoopTestClient()

    async def failing() -> list[int]:
        return [i async for i in engine_loop.stream(lambda: client.stream(4))]

    with pytest.raises(ValueError, match="at token 3"):
        asyncio.run(failing())

    async def blocks_itself() -> None:
        engine_loop.run(client.generate(1), "await it instead")

    with pytest.raises(RuntimeError, match="await it instead"):
        engine_loop.run(blocks_itself())


def test_a_wait_that_ends_early_cancels_the_coroutine_on_the_loop(engine_loop: LoopThread) -> None:
    """The Runtime relies on this: a rollout whose caller gives up (timeout, Ctrl-C) still runs its
    finally-blocks on the loop, which destroy its sandbox."""
    cleaned = threading.Event()

    async def long_rollout() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.set()

    with pytest.raises(TimeoutError):
        engine_loop.run(long_rollout(), timeout=0.1)
    assert cleaned.wait(5), "the coroutine was left running on the loop"


def test_close_stops_the_thread_and_closes_the_loop() -> None:
    loop = LoopThread("test-close")
    loop.close()
    assert loop.loop.is_closed() and not loop._thread.is_alive()
    loop.close()  # a second close is a no-op
