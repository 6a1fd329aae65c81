"""Load test: N concurrent rollouts through the serving proxy and the local sandbox, for a while.

    .venv/bin/python -m benchmarks.load_test --concurrency 64 --duration-s 300

Each rollout is a real process inside its own bubblewrap sandbox (the reliability suite's
`FaultyHarnessTestDouble` in its healthy mode: a small HTTP agent that calls the proxy, writes the
answer file with the model's tool call, and answers), served by a ScriptedTestEngine (a fast engine, so
the proxy, sandboxes and harness processes are what is loaded). `--harness Codex` (or ClaudeCode, Pi)
runs the real CLI instead. Rollouts are kept `--concurrency` in flight until `--duration-s` is up.

Prints, and returns as a dict: rollouts, errors, failure counts, calls, rollouts/s, RSS of this process
after the first wave and at the end (and the peak), sandbox folders and processes left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from benchmarks.headline import emit


def rss_mb() -> float:
    """Resident memory of this process now (VmRSS), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def processes_naming(text: str) -> int:
    count = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if text in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    count += 1
            except OSError:
                pass
    return count


def forget_test_engine_history(engine: Any) -> None:
    """Drop what the ScriptedTestEngine double records for tests to assert on (every prompt, ids and text).

    A load run never reads it, and it is the double's memory, not the framework's: kept, it grew ~6 kB per
    rollout and was most of the growth the first load runs showed (docs/reliability.md).
    """
    for name in ("prompts", "prompt_texts"):
        history = getattr(engine, name, None)
        if isinstance(history, list):
            history.clear()


def memory_growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, top: int) -> list[str]:
    """The allocation sites (3 frames deep) that grew most between two snapshots, as printable lines."""
    lines = []
    for stat in after.compare_to(before, "traceback")[:top]:
        where = " <- ".join(
            f"{f.filename.rsplit('/site-packages/', 1)[-1]}:{f.lineno}" for f in reversed(stat.traceback)
        )
        lines.append(f"{stat.size_diff / 1024:+.1f} KiB {stat.count_diff:+d} blocks at {where}")
    return lines


def run_load(
    concurrency: int = 64,
    duration_s: float = 300.0,
    harness: str = "FaultyHarnessTestDouble",
    max_rollouts: int | None = None,
    work_dir: Path | None = None,
    trace_top: int = 0,
    keep_closed: int | None = None,
) -> dict[str, Any]:
    """Keep `concurrency` rollouts in flight for `duration_s` (or until `max_rollouts`); return the numbers.

    keep_closed sets the proxy's table of closed rollouts' stats (default 1024) to see it stay bounded.
    trace_top > 0 runs under tracemalloc (slower) and reports the allocation sites that grew most between the
    end of the first wave and the end of the run (after gc): what the process keeps per finished rollout.
    """
    if trace_top:
        tracemalloc.start(3)
    snapshots: list[tracemalloc.Snapshot] = []
    import clawgym_env
    from clawgym_env import TaskSuite
    from clawgym_env.registry import registry
    from tests.reliability import doubles

    if doubles.HARNESS_NAME not in registry.harnesses:
        clawgym_env.register(doubles.harness_spec())
    if doubles.SUITE_NAME not in registry.suites:
        clawgym_env.register(TaskSuite(name=doubles.SUITE_NAME, tasks=[doubles.fault_task("ok", i) for i in range(4)]))
    work = Path(work_dir or tempfile.mkdtemp(prefix="clawgym-load-"))
    sandbox_root = work / "sandboxes"
    env = clawgym_env.make(
        f"{doubles.SUITE_NAME}-{harness}",
        run_dir=work / "run",
        backend_options={"root": str(sandbox_root)},
        max_calls=8,
        rollout_timeout_s=120,
    )
    if harness == doubles.HARNESS_NAME:
        policy = doubles.scripted_policy()
    else:
        from tests.harnesses.helpers import scripted_policy, write_call

        done = "Done: the answer is written."
        policy = scripted_policy(
            lambda prompt: done if prompt.count("<tool_response>") else write_call(harness, doubles.ANSWER)
        )  # noqa: E501
    task = doubles.fault_task("ok", 0)
    statuses: dict[str, int] = {}
    calls = 0
    rss_after_first_wave = None
    rollouts_at_first_wave = 0
    held: dict[str, Any] = {}  # what the proxy and the loop still hold once every rollout is done (before close)
    started = time.perf_counter()
    rss_start = rss_mb()

    async def drive() -> None:
        nonlocal calls, rss_after_first_wave, rollouts_at_first_wave
        held["loop"] = type(asyncio.get_running_loop()).__module__.split(".")[0]  # asyncio or uvloop
        if keep_closed is not None:
            (await env.runtime.proxy()).keep_closed = keep_closed
        in_flight: set[asyncio.Task[Any]] = set()
        launched = finished = 0

        def more() -> bool:
            return time.perf_counter() - started < duration_s and (max_rollouts is None or launched < max_rollouts)

        while more() or in_flight:
            while more() and len(in_flight) < concurrency:
                in_flight.add(asyncio.create_task(env.arollout(policy, task)))
                launched += 1
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                result = t.result()
                statuses[result.status] = statuses.get(result.status, 0) + 1
                calls += len(result.calls)
                finished += 1
                forget_test_engine_history(policy.engine)
                if finished == concurrency:
                    rss_after_first_wave = rss_mb()
                    rollouts_at_first_wave = finished
                    if trace_top:
                        gc.collect()
                        snapshots.append(tracemalloc.take_snapshot())
        if trace_top:
            gc.collect()
            snapshots.append(tracemalloc.take_snapshot())
        proxy = await env.runtime.proxy()
        # tasks left besides this one and the proxy's server: the sandboxes' background folder removals
        # finish within seconds; whatever is still pending after 10 s stays per rollout
        others = asyncio.all_tasks() - {asyncio.current_task(), proxy._serve_task}
        if others:
            await asyncio.wait(others, timeout=10)
        held.update(proxy_tables=proxy.table_sizes(), loop_tasks=sum(not t.done() for t in others))

    try:
        env.runtime.run(drive())
        elapsed = time.perf_counter() - started
        failures = env.runtime.failures.as_dict()
    finally:
        env.close()
    leaked_dirs = sorted(p.name for p in sandbox_root.iterdir()) if sandbox_root.exists() else []
    rollouts = sum(statuses.values())
    rss_end = rss_mb()
    later = rollouts - rollouts_at_first_wave
    growth_kb = (rss_end - rss_after_first_wave) * 1024 / later if rss_after_first_wave and later else float("nan")
    report = {
        "harness": harness,
        "loop": held.get("loop"),
        "concurrency": concurrency,
        "duration_s": round(elapsed, 1),
        "rollouts": rollouts,
        "ok": statuses.get("ok", 0),
        "errors": rollouts - statuses.get("ok", 0),
        "failures": failures,
        "calls": calls,
        "rollouts_per_s": round(rollouts / elapsed, 2),
        "calls_per_s": round(calls / elapsed, 2),
        "rss_start_mb": round(rss_start, 1),
        "rss_after_first_wave_mb": round(rss_after_first_wave or float("nan"), 1),
        "rss_end_mb": round(rss_end, 1),
        "rss_growth_kb_per_rollout_after_first_wave": round(growth_kb, 2),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "proxy_tables_end": held.get("proxy_tables"),
        "loop_tasks_left": held.get("loop_tasks"),
        "leaked_sandbox_dirs": len(leaked_dirs),
        "leaked_sandbox_processes": processes_naming(str(sandbox_root)),
        "calls_log_mb": round((work / "run" / "calls.jsonl").stat().st_size / 2**20, 1)
        if (work / "run" / "calls.jsonl").exists()
        else 0.0,
    }
    if len(snapshots) == 2:
        report["traced_growth_kb_per_rollout"] = round(
            sum(s.size_diff for s in snapshots[1].compare_to(snapshots[0], "filename")) / 1024 / max(later, 1), 2
        )
        report["traced_growth_top"] = memory_growth(snapshots[0], snapshots[1], trace_top)
        tracemalloc.stop()
    if work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load_test", description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=300.0)
    parser.add_argument("--max-rollouts", type=int, default=None)
    parser.add_argument(
        "--harness", default="FaultyHarnessTestDouble", help="FaultyHarnessTestDouble | Codex | ClaudeCode | Pi"
    )
    parser.add_argument(
        "--trace-top", type=int, default=0, help="run under tracemalloc; list the N sites that grew most"
    )
    args = parser.parse_args(argv)
    report = run_load(args.concurrency, args.duration_s, args.harness, args.max_rollouts, trace_top=args.trace_top)
    print(json.dumps(report, indent=2))
    emit(
        "load_test",
        report["errors"],
        f"{report['rollouts']:,} rollouts in {args.duration_s:.0f} s at {args.concurrency} concurrent, {report['errors']} "
        f"errors, {report['leaked_sandbox_dirs'] + report['leaked_sandbox_processes']} leaked sandboxes or processes, "
        f"RSS {report['rss_after_first_wave_mb']:.0f} → {report['rss_end_mb']:.0f} MB after the first wave",
    )
    return report


if __name__ == "__main__":
    main()
