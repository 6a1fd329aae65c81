"""Local sandbox cost: create + seed + exec + destroy, against a bare subprocess in a temporary folder.

Run: .venv/bin/python -m benchmarks.sandbox_bench [--rounds 30] [--concurrency 8]
For each command and each backend set-up (C or Python init; started on demand, "cold", or taken from a warm
pool): the median of one cycle, its ratio to the bare cycle (mkdtemp + the same seeding + the same command
+ rmtree), and cycles per second with N concurrent. The machine is shared and its load moves, so the
single-cycle medians are measured interleaved: each round times one cycle of every variant in turn, and
background work (pool refills, folder removals) is let finish between them, outside the timing.
`destroy()` returns once the sandbox is killed and removes its folder in the background, so each cycle
gives two times: until `destroy()` returns (what a rollout waits for) and until the removal is done
(`wait_removed()`, the like of the bare cycle's rmtree). Sandboxes per second count all the work: the clock
stops only once every removal and pool refill is done. The load average is printed before and after.
Targets (docs/sandbox.md): ratio < 3x, >= 10 sandboxes/s on a 2-core machine.

`--views hardened,main` also runs every set-up with main's earlier argument set (the whole host root
read-only, no workspace tmpfs, the disk polled), in the same interleaved rounds, so one run shows what the
hardening costs per cycle; `restart` is the median of `end_agent_processes()` (kill everything, check the
cgroup empty, start a fresh init), which every verification adds once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.headline import emit
from clawgym_env.sandbox.bwrap_args import INIT_INSIDE
from clawgym_env.sandbox.local_backend import LocalSandbox, LocalSandboxBackend
from clawgym_env.sandbox.workspace import materialize_workspace
from clawgym_env.specs import TaskSpec

FILES = {"input.txt": "hello sandbox\n" * 50, "data/numbers.csv": "a,b\n1,2\n3,4\n", "blob.bin": bytes(range(256)) * 16}
COMMANDS = {
    # what a verifier typically runs: a small python check reading the workspace
    "python": [
        "/usr/bin/python3",
        "-c",
        "import pathlib; pathlib.Path('out.txt').write_text(pathlib.Path('input.txt').read_text().upper())",
    ],
    # the pure fixed cost: a one-line shell command
    "shell": ["sh", "-c", "wc -l input.txt > out.txt"],
}


class MainArgsSandbox(LocalSandbox):
    """A sandbox with the argument set of main before the hardening (for comparison only)."""

    def _prepare_workspace(self) -> None:
        self._quota = False  # no tmpfs: the disk limit is polled, as before

    def _bwrap_args(self, init_data_fd: int | None = None) -> list[str]:
        b = self._backend
        args = [
            "--ro-bind",
            "/",
            "/",
            "--unshare-all",
            "--unshare-user",
            "--uid",
            "0",
            "--gid",
            "0",
            "--disable-userns",
            "--cap-drop",
            "ALL",
            "--hostname",
            self.id,
            "--die-with-parent",
            "--new-session",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
        ]
        for private in ("/tmp", "/root", "/run"):
            args += ["--size", str(self.limits.workspace_mb * 1024 * 1024), "--tmpfs", private]
        for path in b.auto_binds:  # main bound back only what its private tmpfs hid
            if str(path).startswith(("/tmp/", "/root/", "/run/")):
                args += ["--ro-bind", str(path), str(path)]
        args += ["--tmpfs", str(b.root)]
        if b.init_binary is not None:
            args += ["--ro-bind", str(b.init_binary), INIT_INSIDE]
        return args + [
            "--bind",
            str(self.workspace_dir),
            self.workspace_path,
            "--chdir",
            self.workspace_path,
            "--clearenv",
        ]


class MainArgsBackend(LocalSandboxBackend):
    sandbox_class = MainArgsSandbox


async def restart_time(backend: LocalSandboxBackend, task: TaskSpec, argv: list[str]) -> float:
    async with await backend.create(task) as box:
        await box.exec(argv)
        start = time.perf_counter()
        await box.end_agent_processes()
        return time.perf_counter() - start


def make_task() -> TaskSpec:
    return TaskSpec(id="bench", instruction="bench", workspace=FILES, verifier=lambda d: 1.0)


async def bare_cycle(task: TaskSpec, argv: list[str]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="clawgym-bare-"))
    try:
        materialize_workspace(task.workspace, folder)
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=folder, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        await process.communicate()
        assert process.returncode == 0
    finally:
        shutil.rmtree(folder)


async def sandbox_cycle(backend: LocalSandboxBackend, task: TaskSpec, argv: list[str]) -> LocalSandbox:
    async with await backend.create(task) as box:
        result = await box.exec(argv)
        assert result.exit_code == 0, result.stderr
    return box


async def timed_bare(task: TaskSpec, argv: list[str]) -> float:
    start = time.perf_counter()
    await bare_cycle(task, argv)
    return time.perf_counter() - start


async def timed_sandbox(backend: LocalSandboxBackend, task: TaskSpec, argv: list[str]) -> tuple[float, float]:
    """(seconds until destroy() returned, seconds until the sandbox was removed too); then lets the
    backend's background work finish, untimed, so the next measured cycle does not pay for it."""
    start = time.perf_counter()
    box = await sandbox_cycle(backend, task, argv)
    returned = time.perf_counter() - start
    await box.wait_removed()
    removed = time.perf_counter() - start
    await backend.settle()
    return returned, removed


async def rate_of(cycle, total: int, concurrency: int, settle=None) -> float:
    """Cycles per second with `concurrency` at once; `settle` (awaited inside the timing) finishes late work."""
    semaphore = asyncio.Semaphore(concurrency)

    async def limited() -> None:
        async with semaphore:
            await cycle()

    start = time.perf_counter()
    await asyncio.gather(*(limited() for _ in range(total)))
    if settle is not None:
        await settle()
    return total / (time.perf_counter() - start)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--pool", type=int, default=2, help="warm sandboxes kept ahead by the pooled backends")
    parser.add_argument("--inits", default="c,python", help="sandbox inits to compare (c, python)")
    parser.add_argument("--views", default="hardened", help="argument sets to compare: hardened, main")
    args = parser.parse_args()
    task = make_task()
    kinds = {"hardened": LocalSandboxBackend, "main": MainArgsBackend}
    setups = [
        (
            f"{init} {'pooled' if pool else 'cold'}{' main' if view == 'main' else ''}",
            kinds[view],
            {"init": init, "pool_size": pool},
        )
        for view in args.views.split(",")
        for init in args.inits.split(",")
        for pool in (0, args.pool)
    ]
    backends = [(label, kind(**options)) for label, kind, options in setups]
    print(
        f"local sandbox benchmark: limits via {backends[0][1].limit_mode}, {args.rounds} interleaved rounds, "
        f"{args.concurrency} concurrent, pools of {args.pool}; load average before: {load()}"
    )
    print(
        f"{'command':8} {'sandbox':18} {'bare':>7} {'sandbox':>8} {'ratio':>6} {'+removal':>9} {'ratio':>6} "
        f"{'bare/s':>7} {'sandboxes/s':>11}"
    )
    headline: float | None = None  # the README's figure: one-line shell, C init, warm pool, until destroy returns
    try:
        for name, argv in COMMANDS.items():
            bare_times: list[float] = []
            box_times: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in backends}
            await bare_cycle(task, argv)  # warm up (and start the pools)
            for _, backend in backends:
                await sandbox_cycle(backend, task, argv)
                await backend.settle()
            for _ in range(args.rounds):
                bare_times.append(await timed_bare(task, argv))
                for label, backend in backends:
                    box_times[label].append(await timed_sandbox(backend, task, argv))
            bare = statistics.median(bare_times)
            bare_rate = await rate_of(lambda argv=argv: bare_cycle(task, argv), args.rounds * 2, args.concurrency)
            for label, backend in backends:
                returned = statistics.median(t for t, _ in box_times[label])
                removed = statistics.median(t for _, t in box_times[label])
                box_rate = await rate_of(
                    lambda b=backend, a=argv: sandbox_cycle(b, task, a),
                    args.rounds * 2,
                    args.concurrency,
                    settle=backend.settle,
                )
                if name == "shell" and label == "c pooled":  # "pooled" only when --pool > 0
                    headline = returned / bare
                print(
                    f"{name:8} {label:18} {ms(bare)} {ms(returned, 8)} {returned / bare:5.2f}x "
                    f"{ms(removed, 9)} {removed / bare:5.2f}x {bare_rate:7.1f} {box_rate:11.1f}"
                )
        for label, backend in backends:
            if not backend.pool_size:
                restarts = [await restart_time(backend, task, COMMANDS["shell"]) for _ in range(args.rounds)]
                print(f"restart  {label:18} end_agent_processes median {ms(statistics.median(restarts))}")
    finally:
        for _, backend in backends:
            await backend.aclose()
    print(f"load average after: {load()}")
    if headline is not None:
        emit("sandbox", headline, f"one-line shell {headline:.2f}x (warm pool, C init)")


def ms(seconds: float, width: int = 7) -> str:
    return f"{seconds * 1000:{width - 2}.1f}ms"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    asyncio.run(main())
