"""LoopBoundWeights: weights pushed before any event loop has used an engine go in on the loop of its first
call, before that call generates (vLLM's client binds to the first loop that runs it; the real engine is
covered by tests/evaluation/test_compare.py's vLLM test)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from clawgym_env.engines.blocking import LoopBoundWeights


class LoopRecordingTestEngine(LoopBoundWeights):
    """Test double: records the loop each weight update ran on and the weights each call was served by."""

    def __init__(self) -> None:
        self._loop = None
        self.policy_version = 0
        self.weights: Mapping[str, Any] = {"w": 0}
        self.update_loops: list[asyncio.AbstractEventLoop] = []

    async def aupdate_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        await asyncio.sleep(0)
        self.update_loops.append(asyncio.get_running_loop())
        self.weights, self.policy_version = state_dict, version

    async def generate(self) -> tuple[Any, int]:
        await self._bind_loop()
        return self.weights["w"], self.policy_version


def test_weights_pushed_before_any_loop_go_in_on_the_first_calls_loop() -> None:
    engine = LoopRecordingTestEngine()
    engine.update_weights({"w": 1}, version=1)
    engine.update_weights({"w": 2}, version=2)  # the newest wins; nothing ran yet
    assert engine.update_loops == [] and engine.policy_version == 2

    async def first_calls() -> list[tuple[Any, int]]:
        return list(await asyncio.gather(engine.generate(), engine.generate()))

    assert asyncio.run(first_calls()) == [(2, 2), (2, 2)]
    assert len(engine.update_loops) == 1  # applied once, by the first call


def test_once_bound_a_blocking_update_runs_on_the_engines_loop() -> None:
    engine = LoopRecordingTestEngine()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(engine.generate(), loop).result(5)
        engine.update_weights({"w": 3}, version=3)  # from this (trainer) thread
        assert engine.update_loops == [loop]
        assert asyncio.run_coroutine_threadsafe(engine.generate(), loop).result(5) == (3, 3)

        async def on_the_loop() -> None:
            engine.update_weights({"w": 4}, version=4)

        with pytest.raises(RuntimeError, match="aupdate_weights"):  # it would wait for itself forever
            asyncio.run_coroutine_threadsafe(on_the_loop(), loop).result(5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
