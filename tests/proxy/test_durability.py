"""Group commit (clawgym_env.proxy.durability): with fsync=True an answer waits for its record's fsync, and
calls in flight together share one fsync run off the event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import orjson
import pytest

from clawgym_env.interfaces import RolloutLimits
from clawgym_env.proxy import ServingProxy
from clawgym_env.proxy.durability import GroupCommit

from .conftest import WRITE_SCHEMA, tagged


class SlowDisk:
    """A sync callable that takes `delay_s` in the worker thread and records how many writes it covered."""

    def __init__(self, group_ref: list[GroupCommit], delay_s: float = 0.02, fail: int = 0) -> None:
        self.group_ref, self.delay_s, self.fail = group_ref, delay_s, fail
        self.covered: list[int] = []
        self.threads: set[str] = set()

    def __call__(self) -> None:
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay_s)
        if self.fail:
            self.fail -= 1
            raise OSError(5, "Input/output error")
        self.covered.append(self.group_ref[0].written)


async def test_concurrent_writers_share_fsyncs_and_each_returns_after_its_write_is_synced():
    ref: list[GroupCommit] = []
    disk = SlowDisk(ref)
    group = GroupCommit(disk)
    ref.append(group)

    async def writer(i: int) -> int:
        await asyncio.sleep(0.001 * (i % 7))
        group.wrote()
        mine = group.written
        await group.durable()
        assert group.synced >= mine  # returned only once an fsync covering this write finished
        return mine

    done = await asyncio.gather(*(writer(i) for i in range(60)))
    assert sorted(done) == list(range(1, 61))
    assert group.synced == 60
    assert 1 <= group.fsyncs <= 6 < 60  # batched: far fewer fsyncs than writes
    assert group.fsyncs == len(disk.covered)
    assert threading.main_thread().name not in disk.threads  # never on the event loop's thread
    await group.durable()  # nothing new written: returns without another fsync
    assert group.fsyncs == len(disk.covered)


async def test_a_failed_fsync_fails_every_waiter_of_its_batch_and_the_next_call_retries():
    ref: list[GroupCommit] = []
    group = GroupCommit(SlowDisk(ref, fail=1))
    ref.append(group)
    for _ in range(5):
        group.wrote()
    results = await asyncio.gather(*(group.durable() for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, OSError) for r in results), results
    assert group.synced == 0
    await group.durable()  # the disk recovered: the same writes are synced now
    assert group.synced == 5 and group.fsyncs == 1


async def test_a_cancelled_waiter_does_not_cancel_the_fsync_the_others_wait_for():
    ref: list[GroupCommit] = []
    group = GroupCommit(SlowDisk(ref, delay_s=0.05))
    ref.append(group)
    group.wrote()
    first = asyncio.ensure_future(group.durable())
    others = [asyncio.ensure_future(group.durable()) for _ in range(3)]
    await asyncio.sleep(0.01)
    first.cancel()
    await asyncio.gather(*others)
    assert first.cancelled() and group.synced == 1 and group.fsyncs == 1


TOOLS = [{"type": "function", "function": {"name": "write", "description": "write", "parameters": WRITE_SCHEMA}}]


@pytest.mark.parametrize("stream", [False, True])
async def test_proxy_with_fsync_answers_only_synced_calls_and_batches_them(tmp_path, scripted_policy, stream):
    """16 rollouts x 3 calls at once through a real fsync=True proxy: every answer's record was covered by
    an fsync before the answer arrived (its line number <= `synced` then), with fewer fsyncs than calls."""
    policy = scripted_policy(lambda _p: tagged("write", {"path": "a.txt", "content": "1"}))
    async with ServingProxy(tmp_path / "run", port=0, unix_socket=None, fsync=True) as proxy:
        assert proxy.recorder.group is not None
        routes = [proxy.open_rollout(f"f{i}", policy, RolloutLimits(max_calls=8)) for i in range(16)]
        checked = 0

        async def rollout(client: httpx.AsyncClient, route) -> None:
            nonlocal checked
            headers = {"authorization": f"Bearer {route.api_key}"}
            for i in range(3):
                body = {
                    "model": "p",
                    "stream": stream,
                    "tools": TOOLS,
                    "messages": [{"role": "user", "content": str(i)}],
                }
                reply = await client.post(f"{route.path_prefix}/v1/chat/completions", json=body, headers=headers)
                assert reply.status_code == 200, reply.text
                lines = proxy.log_path.read_bytes().splitlines()
                at = next(
                    n
                    for n, line in enumerate(lines, 1)
                    if (r := orjson.loads(line))["rollout_id"] == route.rollout_id and r["call_index"] == i
                )
                assert proxy.recorder.group.synced >= at
                checked += 1

        async with httpx.AsyncClient(base_url=proxy.origin, timeout=30) as client:
            await asyncio.gather(*(rollout(client, r) for r in routes))
        assert checked == 48
        assert proxy.recorder.group.synced == proxy.recorder.group.written == 48
        assert proxy.recorder.group.fsyncs < 48
