"""The warm pool: sandboxes started ahead, seeded on `create`; isolation, wall clock and clean-up hold."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from clawgym_env.interfaces import SandboxLimits
from clawgym_env.sandbox.local_backend import LocalSandboxBackend
from tests.sandbox.conftest import make_task

pytestmark = pytest.mark.usefixtures("sandbox_init")  # every test with the C and the Python init


async def _wait_warm(backend: LocalSandboxBackend, count: int) -> None:
    for _ in range(200):
        if sum(len(v) for v in backend._pool.values()) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the pool never filled")


async def test_warm_sandboxes_are_seeded_isolated_and_cleaned_up(sandbox_root: Path) -> None:
    async with LocalSandboxBackend(root=sandbox_root, pool_size=2) as backend:
        first = await backend.create(make_task({"a.txt": "one"}))  # cold: starts the pool filling
        await _wait_warm(backend, 2)
        warm = await backend.create(make_task({"a.txt": "two"}))
        assert warm is not first and warm.id not in {first.id}
        assert (await warm.exec("cat a.txt")).stdout == "two"  # seeded after its start, seen inside
        await first.write_file("secret.txt", "mine")
        assert (await warm.exec("ls -A")).stdout.split() == ["a.txt"]  # nothing of the other sandbox
        assert (await first.exec("cat a.txt")).stdout == "one"
        await first.destroy()
        await warm.destroy()
        await backend.settle()  # refills and removals done: only the two warm sandboxes' folders are left
        (ready,) = backend._pool.values()
        assert len(ready) == 2 and sorted(p.name for p in sandbox_root.iterdir()) == sorted(b.id for b in ready)
    # aclose destroyed the warm ones too: no sandbox folder is left
    assert [p for p in sandbox_root.iterdir() if p.name.startswith("sbx-")] == []


async def test_a_warm_sandboxs_wall_clock_starts_when_a_task_takes_it(sandbox_root: Path) -> None:
    limits = SandboxLimits(wall_time_s=2.0)
    async with LocalSandboxBackend(root=sandbox_root, pool_size=1, limits=limits) as backend:
        async with await backend.create(make_task()):
            await _wait_warm(backend, 1)
        await asyncio.sleep(1.2)  # the warm one waits in the pool
        async with await backend.create(make_task()) as box:
            result = await box.exec("sleep 1.2 && echo done")  # 2.4 s after its start, 1.2 s after the take
            assert result.exit_code == 0 and result.stdout.strip() == "done", result


async def test_a_warm_sandbox_that_died_is_not_handed_out(sandbox_root: Path) -> None:
    async with LocalSandboxBackend(root=sandbox_root, pool_size=1) as backend:
        async with await backend.create(make_task()):
            await _wait_warm(backend, 1)
        (dead,) = next(iter(backend._pool.values()))
        dead._process.kill()
        await dead._process.wait()
        async with await backend.create(make_task({"x.txt": "x"})) as box:
            assert box is not dead and (await box.exec("cat x.txt")).stdout == "x"
