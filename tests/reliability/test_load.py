"""Load: 64 concurrent rollouts through the proxy and the local sandbox, no errors, no leaks, bounded memory.

The default tier runs one wave of 64 (a few seconds); the slow tier keeps 64 in flight for two minutes
(`benchmarks/load_test.py` runs the several-minutes version and prints the numbers).
"""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from benchmarks.load_test import run_load
from clawgym_env.runtime import FailureCounter


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_64_concurrent_rollouts_once(tmp_path, loop):
    if loop == "uvloop":  # a process that installed it (uvicorn does): its pipes once closed other rollouts' files
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # put back by tests/conftest.py
    report = run_load(concurrency=64, duration_s=120, max_rollouts=64, work_dir=tmp_path, keep_closed=16)
    outcome = (report["rollouts"], report["ok"], report["errors"], report["failures"])
    assert outcome == (64, 64, 0, {}), f"failures by stage and reason: {report['failures']}"  # the whole reason
    assert report["loop"] == loop
    assert report["calls"] == 128  # every rollout: the write tool call and the final answer
    assert report["leaked_sandbox_dirs"] == 0 and report["leaked_sandbox_processes"] == 0
    # what stays once all 64 are done (docs/reliability.md): no open route, closed stats only up to the bound, no task
    assert report["proxy_tables_end"] == {"open": 0, "closed_stats": 16}
    assert report["loop_tasks_left"] == 0


def test_failure_table_stays_bounded_when_reasons_name_rollouts():
    failures = FailureCounter(max_reasons=4)
    for i in range(100):
        failures.add("harness", f"HarnessError: rollout r{i} exited with code -11\ntraceback ...")
    failures.add("timeout", "harness ran past its 120 s limit")
    counts = failures.as_dict()
    assert len(counts["harness"]) == 5 and counts["harness"][FailureCounter.OTHER] == 96
    assert counts["harness"]["HarnessError: rollout r0 exited with code -11"] == 1
    assert failures.total() == 101 and counts["timeout"] == {"harness ran past its 120 s limit": 1}


@pytest.mark.slow
def test_64_concurrent_rollouts_for_two_minutes(tmp_path):
    report = run_load(concurrency=64, duration_s=120, work_dir=tmp_path)
    assert report["rollouts"] >= 640 and report["errors"] == 0 and report["failures"] == {}
    assert report["calls"] == 2 * report["rollouts"]
    assert report["leaked_sandbox_dirs"] == 0 and report["leaked_sandbox_processes"] == 0
    # bounded memory: after the first wave, thousands more rollouts add little (no per-rollout leak)
    growth = report["rss_end_mb"] - report["rss_after_first_wave_mb"]
    assert growth < 64, report


@pytest.mark.slow
def test_64_concurrent_real_codex_rollouts(tmp_path):
    report = run_load(concurrency=64, duration_s=300, max_rollouts=64, harness="Codex", work_dir=tmp_path)
    assert (report["rollouts"], report["errors"]) == (64, 0), report
    assert report["leaked_sandbox_dirs"] == 0 and report["leaked_sandbox_processes"] == 0
