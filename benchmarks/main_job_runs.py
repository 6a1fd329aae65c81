"""The main job's runs as stored evidence: what `clawgym main` reported, and every rollout it ran.

    .venv/bin/python -m benchmarks.main_job_runs runs/main-20261205-020440 [RUN ...] --publish docs/results

A run directory of `bash scripts/main.sh` (= `clawgym main`) holds `report.json` (the summary the run printed:
time per phase, peak RSS, the engine and the update's precision and why, the machine and its load) and one evidence row per rollout
(`eval_rollouts.jsonl`: the held-out evaluations before and after; `rollouts.jsonl`: training). Publishing
adds the run's report to `DIR/main_job_runs.jsonl` (a run published again replaces its line) and merges its
rows into `DIR/main_job.jsonl.gz` (each run's rows carry its directory's name as `experiment`).
`benchmarks.experiment_report` makes the README's main-job block from the two files: per run, the time,
the memory and the held-out gain with its 95 % interval (a bootstrap over the run's tasks and rollouts;
one run is one seed, so the interval says nothing about other seeds).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from evaluation.evidence import EvidenceRow, publish_rows, read_rows

ROWS = "main_job.jsonl.gz"
RUNS = "main_job_runs.jsonl"


class MainJobRun(BaseModel):
    """One run's report, as stored: enough to recompute the README's line for it."""

    run: str  # the run directory's name (the `experiment` of its evidence rows)
    command: str
    date: str
    cpu: str
    load_start: float
    load_end: float
    engine: str  # kind, dtype
    engine_reason: str
    update: str = "float32"  # the update's precision (runs before the choice was recorded updated in float32)
    commit: str
    steps: int
    wall_s: float
    rollouts_s: float
    updates_s: float
    evaluation_and_setup_s: float
    setup_s: float | None = None  # of evaluation_and_setup_s (runs before reports split it: None)
    evaluations_s: float | None = None
    peak_rss_main_mb: float
    file_backed_main_mb: float | None = None  # of the main process's peak, mapped files (runs before: None)
    peak_rss_tree_mb: float
    held_out: dict[str, dict[str, float | None]]  # harness -> before / after


def read_run(run_dir: Path, command: str) -> tuple[MainJobRun, list[EvidenceRow]]:
    """A finished run's report and its rollouts' rows (refuses a run without a report: it did not finish)."""
    report_path = run_dir / "report.json"
    if not report_path.is_file():
        raise FileNotFoundError(f"{run_dir} has no report.json: the run did not finish (nothing to publish)")
    report: dict[str, Any] = json.loads(report_path.read_text())
    machine = report.get("machine")
    if machine is None:
        raise ValueError(f"{report_path} names no machine (made before reports recorded it): not publishable")
    rows = [*read_rows(run_dir / "eval_rollouts.jsonl"), *read_rows(run_dir / "rollouts.jsonl")]
    commits = sorted({r.commit for r in rows})
    time_s, rss, engine = report["time_s"], report["peak_rss_mb"], report["engine"]
    run = MainJobRun(
        run=run_dir.name,
        command=command,
        date=machine["date"],
        cpu=machine["cpu"],
        load_start=machine["load_start"],
        load_end=machine["load_end"],
        engine=f"{engine['kind']}, {engine['dtype']}",
        engine_reason=engine["reason"],
        update=(report.get("update") or {}).get("autocast") or "float32",
        commit=",".join(commits) or "unknown",
        steps=report["steps"],
        wall_s=time_s["total"],
        rollouts_s=time_s["rollouts"],
        updates_s=time_s["updates"],
        evaluation_and_setup_s=time_s["evaluation_and_setup"],
        setup_s=time_s.get("setup"),
        evaluations_s=time_s.get("evaluations"),
        peak_rss_main_mb=rss["main_process"],
        file_backed_main_mb=rss.get("main_process_file_backed"),
        peak_rss_tree_mb=rss["process_tree"],
        held_out=report["held_out"],
    )
    return run, [r.model_copy(update={"experiment": run_dir.name}) for r in rows]


def read_runs(path: Path) -> list[MainJobRun]:
    if not path.is_file():
        return []
    return [MainJobRun.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


def publish(folder: Path, runs: list[tuple[MainJobRun, list[EvidenceRow]]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    new = {run.run for run, _ in runs}
    kept = [r for r in read_runs(folder / RUNS) if r.run not in new]
    (folder / RUNS).write_text("".join(r.model_dump_json() + "\n" for r in kept + [run for run, _ in runs]))
    publish_rows(folder / ROWS, [row for _, rows in runs for row in rows])


def main(argv: list[str] | None = None) -> list[MainJobRun]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of finished main jobs")
    parser.add_argument("--command", default="bash scripts/main.sh", help="the command that made the runs")
    parser.add_argument("--publish", type=Path, required=True, help="folder of the stored results (docs/results)")
    args = parser.parse_args(argv)
    runs = [read_run(d, args.command) for d in args.runs]
    publish(args.publish, runs)
    for run, rows in runs:
        print(f"{run.run}: {run.wall_s / 60:.1f} min, peak RSS {run.peak_rss_main_mb:.0f} MB, {len(rows)} rollouts")
    return [run for run, _ in runs]


if __name__ == "__main__":
    main()
