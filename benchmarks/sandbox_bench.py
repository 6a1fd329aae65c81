"""Local sandbox cost: create + seed + exec + destroy, against a bare subprocess in a temporary folder.

Run: .venv/bin/python -m benchmarks.sandbox_bench [--rounds 30] [--concurrency 8]
Prints, for each command, the median of one full cycle for both, the ratio, and sandboxes per second with
N concurrent cycles. Targets (docs/sandbox.md): ratio < 3x, >= 10 sandboxes/s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from clawgym_env.sandbox.local import LocalSandboxBackend
from clawgym_env.sandbox.workspace import materialize_workspace
from clawgym_env.specs import TaskSpec

FILES = {"input.txt": "hello sandbox\n" * 50, "data/numbers.csv": "a,b\n1,2\n3,4\n", "blob.bin": bytes(range(256)) * 16}
COMMANDS = {
    # what a verifier typically runs: a small python check reading the workspace
    "python": ["/usr/bin/python3", "-c", "import pathlib; pathlib.Path('out.txt').write_text(pathlib.Path('input.txt').read_text().upper())"],
    # the pure fixed cost: a one-line shell command
    "shell": ["sh", "-c", "wc -l input.txt > out.txt"],
}


def make_task() -> TaskSpec:
    return TaskSpec(id="bench", instruction="bench", workspace=FILES, verifier=lambda d: 1.0)


async def bare_cycle(task: TaskSpec, argv: list[str]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="clawgym-bare-"))
    try:
        materialize_workspace(task.workspace, folder)
        process = await asyncio.create_subprocess_exec(*argv, cwd=folder, stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.PIPE)
        await process.communicate()
        assert process.returncode == 0
    finally:
        shutil.rmtree(folder)


async def sandbox_cycle(backend: LocalSandboxBackend, task: TaskSpec, argv: list[str]) -> None:
    async with await backend.create(task) as box:
        result = await box.exec(argv)
        assert result.exit_code == 0, result.stderr


async def measure(cycle, rounds: int, concurrency: int) -> tuple[float, float]:
    """(median seconds of one cycle run alone, cycles per second with `concurrency` at once)."""
    await cycle()  # warm up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        await cycle()
        times.append(time.perf_counter() - start)
    total = rounds * 2
    semaphore = asyncio.Semaphore(concurrency)

    async def limited() -> None:
        async with semaphore:
            await cycle()

    start = time.perf_counter()
    await asyncio.gather(*(limited() for _ in range(total)))
    return statistics.median(times), total / (time.perf_counter() - start)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--pool", type=int, default=2, help="warm sandboxes kept ahead by the pooled backend")
    args = parser.parse_args()
    task = make_task()
    async with LocalSandboxBackend() as cold, LocalSandboxBackend(pool_size=args.pool) as pooled:
        print(f"local sandbox benchmark: limits via {cold.limit_mode}, {args.rounds} rounds, {args.concurrency} concurrent; "
              f"'pooled' keeps {args.pool} sandboxes started ahead")
        print(f"{'command':8} {'backend':7} {'bare median':>12} {'sandbox median':>15} {'ratio':>6} {'bare/s':>8} {'sandboxes/s':>12}")
        for name, argv in COMMANDS.items():
            bare_median, bare_rate = await measure(lambda: bare_cycle(task, argv), args.rounds, args.concurrency)
            for label, backend in (("cold", cold), ("pooled", pooled)):
                box_median, box_rate = await measure(lambda: sandbox_cycle(backend, task, argv), args.rounds, args.concurrency)
                print(f"{name:8} {label:7} {bare_median * 1000:10.1f}ms {box_median * 1000:13.1f}ms "
                      f"{box_median / bare_median:5.2f}x {bare_rate:8.1f} {box_rate:12.1f}")


if __name__ == "__main__":
    asyncio.run(main())
