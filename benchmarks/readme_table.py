"""The README's benchmark table: one current figure per row, each from a stored run of the row's command.

    .venv/bin/python -m benchmarks.readme_table --run all --publish docs/results     # every row, alone (~10 min here)
    .venv/bin/python -m benchmarks.readme_table --run sandbox stream --publish docs/results
    .venv/bin/python -m benchmarks.readme_table --list                               # the rows and what is stored

`--run` runs each row's command in its own process, alone and one after another, and keeps the figure the
benchmark printed for that row (`benchmarks.headline`); `--publish` merges one line per row into
`docs/results/readme_table.jsonl` (the command, the figure, the commit, the CPU and its flags, the load
before and after, the wall time, the date: a row run again replaces its line). `benchmarks.experiment_report`
writes the README's table from that file; a row not yet stored says so and shows no figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from benchmarks.headline import read
from trainers.engine_choice import cpu_summary

ROOT = Path(__file__).resolve().parents[1]
FILE = "readme_table.jsonl"


class Row(BaseModel):
    key: str  # the headline the command prints (`benchmarks.headline.emit`)
    what: str
    command: list[str]  # after `python`
    target: str
    doc: str | None = None  # a row whose figures are a stored table on another page (no headline of its own)


ROWS = [
    Row(
        key="sandbox",
        what="sandbox create+seed+exec+destroy vs a bare subprocess",
        command=["-m", "benchmarks.sandbox_bench", "--rounds", "30"],
        target="< 3x",
    ),
    Row(
        key="proxy_ab",
        what="proxy: before/after a change, side by side",
        command=["-m", "benchmarks.proxy_ab", "--before", "<checkout>"],
        target="within 10 %",
        doc="[docs/proxy.md](docs/proxy.md#performance)",
    ),
    Row(
        key="proxy_load",
        what="proxy under load, one process",
        command=["-m", "benchmarks.proxy_load", "--levels", "1000", "--rounds", "2"],
        target="0 errors, RSS flat across rounds",
    ),
    Row(
        key="proxy_shards",
        what="several proxy processes",
        command=["-m", "benchmarks.proxy_shards", "--shards", "1,3", "--levels", "1000"],
        target="≥ 3,000 calls/s with a core per process",
    ),
    Row(
        key="stream",
        what="streamed call: first byte / total",
        command=["-m", "benchmarks.stream_bench"],
        target="first byte with the first token",
    ),
    Row(
        key="forest_reconstruction",
        what="tree reconstruction",
        command=["-m", "benchmarks.forest_bench"],
        target="> 1 M/s",
    ),
    Row(
        key="forest_packed",
        what="forward+backward, packed tree vs per branch",
        command=["-m", "benchmarks.forest_bench"],
        target="≥ 1.4x",
    ),
    Row(
        key="harness",
        what="harness start-up, one short rollout",
        command=["benchmarks/harness_bench.py"],
        target="—",
    ),
    Row(
        key="engines",
        what="inference engines, same rollouts",
        command=["-m", "benchmarks.engine_bench", "--compare-engines", "--model", "qwen2.5-coder-0.5b"],
        target="vLLM ≥ 2x",
    ),
    Row(
        key="eval_concurrency",
        what="the main job's held-out evaluation: vLLM's threads on both cores and 16 rollouts at once vs its own binding and 8",
        command=["-m", "benchmarks.eval_concurrency", "--concurrency", "8", "16", "--omp-bind", "auto", "0-1"],
        target="faster",
    ),
    Row(
        key="async",
        what="asynchronous training and adapter sync",
        command=["-m", "benchmarks.async_training", "--publish", "docs/results"],
        target="held-out gain as large as synchronous",
        doc="[docs/trainers.md](docs/trainers.md)",
    ),
    Row(
        key="load_test",
        what="load: 64 concurrent rollouts",
        command=["-m", "benchmarks.load_test", "--concurrency", "64", "--duration-s", "120"],
        target="no errors, bounded memory",
    ),
]


def commit() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def run(commands: list[list[str]], timeout_s: float = 3600) -> list[dict[str, Any]]:
    """Run each command once (one after another) and return the headlines it printed, with where they came from."""
    stored = []
    for command in commands:
        load_before, start = os.getloadavg()[0], time.perf_counter()
        shown = " ".join(["python", *command])
        print(f"running {shown} (load {load_before:.2f})", flush=True)
        done = subprocess.run(
            [sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        headlines = read(done.stdout)
        if done.returncode != 0 or not headlines:
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
            raise RuntimeError(f"`{shown}` exited with {done.returncode} and printed {len(headlines)} headlines")
        for headline in headlines:
            stored.append(
                {
                    **headline,
                    "command": shown,
                    "commit": commit(),
                    "cpu": cpu_summary(),
                    "load_before": round(load_before, 2),
                    "load_after": round(os.getloadavg()[0], 2),
                    "wall_s": round(time.perf_counter() - start, 1),
                    "date": time.strftime("%Y-%m-%d"),
                }
            )
            print(f"  {headline['key']}: {headline['figure']}", flush=True)
    return stored


def read_stored(path: Path) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["key"]: r for r in rows}


def publish(path: Path, measured: list[dict[str, Any]]) -> None:
    """Merge: a row measured now replaces its stored line, the others stay."""
    stored = read_stored(path) | {r["key"]: r for r in measured}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(stored[r.key], sort_keys=True) + "\n" for r in ROWS if r.key in stored))


def table(stored: dict[str, dict[str, Any]]) -> str:
    """The README's table: every row with its command and target, and its stored figure (or that there is none)."""
    lines = ["| what | command | figure | target |", "|---|---|---|---|"]
    for row in ROWS:
        command = " ".join(["python", *row.command])
        if row.doc is not None:
            figure = f"*stored*: {row.doc}"
        elif row.key in stored:
            s = stored[row.key]
            figure = f"{s['figure']} ({s['date']}, load {s['load_before']:.1f}-{s['load_after']:.1f})"
        else:
            figure = "not stored yet"
        lines.append(f"| {row.what} | `{command}` | {figure} | {row.target} |")
    cpus = sorted({s["cpu"] for s in stored.values()})
    source = (
        f"Figures from `docs/results/{FILE}` (made by `python -m benchmarks.readme_table --run all --publish "
        f"docs/results`; CPU: {'; '.join(cpus) or 'none stored yet'}); earlier dated figures of the rows not "
        "stored yet are in [the results log](docs/results_log/2026-12-04.md#readme-benchmark-table-2026-12-04)."
    )
    return "\n".join(lines) + "\n\n" + source + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    keys = [r.key for r in ROWS if r.doc is None]
    parser.add_argument("--run", nargs="+", choices=["all", *keys], help="rows to measure now")
    parser.add_argument("--publish", type=Path, help=f"merge what was measured into DIR/{FILE}")
    parser.add_argument("--list", action="store_true", help="the rows and their stored figures")
    args = parser.parse_args(argv)
    if args.list or not args.run:
        print(table(read_stored(ROOT / "docs" / "results" / FILE)))
        return 0
    wanted = keys if "all" in args.run else args.run
    commands: list[list[str]] = []
    for row in ROWS:  # one run per command (forest_bench prints two rows' figures)
        if row.key in wanted and row.command not in commands:
            commands.append(row.command)
    measured = [h for h in run(commands) if h["key"] in keys]
    if args.publish:
        publish(args.publish / FILE, measured)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
