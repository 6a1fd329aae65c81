"""The proxy before and after a change, side by side in one run: two checkouts, benchmarked alternately.

    git worktree add /tmp/before <commit>       # the code before the change
    .venv/bin/python -m benchmarks.proxy_ab --before /tmp/before --rounds 3 --change "what changed" --publish docs/results

Each round runs, for each checkout in turn (the order flips every round, so a drift of the machine's speed
falls on both), `benchmarks.proxy_load --levels 1,64` (HTTP, the client in its own process: calls per proxy
CPU-second and the latency the proxy adds) and `benchmarks.proxy_handler --calls 4,32` (no sockets: the
handler's own CPU per call, and `close_rollout`'s where the checkout's benchmark measures it), each from that
checkout's own code. The rows (one per change, checkout, round and figure, with the commit, the CPU and the
load) are merged into `proxy_ab.jsonl.gz` (a change measured again replaces its rows); `ab_table` gives each figure's
median per checkout and the ratio after / before, which docs/proxy.md shows (generated block "proxy-ab").
Medians of alternated runs, because this host's speed moves by tens of percent over minutes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FILE = "proxy_ab.jsonl.gz"
FIGURES = {  # figure -> (what it is, better when higher)
    "calls_per_cpu_s_n1": ("calls per proxy CPU-second, 1 rollout", True),
    "calls_per_cpu_s_n64": ("calls per proxy CPU-second, 64 rollouts", True),
    "added_median_ms_n1": ("added latency, median, 1 rollout (ms)", False),
    "added_median_ms_n64": ("added latency, median, 64 rollouts (ms)", False),
    "handler_us_4_calls": ("handler CPU per call, 4-call rollouts (µs)", False),
    "handler_us_32_calls": ("handler CPU per call, 32-call rollouts (µs)", False),
    "close_us_32_calls": ("close_rollout CPU per call handed back, 32-call rollouts (µs)", False),
}
FIRST_CHANGE = "the call pipeline (#34)"  # rows stored before changes were named


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def commit_of(checkout: Path) -> str:
    out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def _python(checkout: Path, code: str) -> Any:
    """Run `code` with `checkout`'s packages first on the path (its own benchmarks, its own proxy); the last
    stdout line is JSON."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=checkout, env=env, capture_output=True, text=True, check=True, timeout=1800
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(checkout: Path) -> dict[str, float]:
    """One round's figures for one checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "load.json"
        _python(
            checkout,
            "import json, sys; from benchmarks.proxy_load import main; "
            f"main(['--levels', '1,64', '--json', {str(report)!r}]); print(json.dumps(0))",
        )
        load = {row["n"]: row for row in json.loads(report.read_text())["rows"]}
    handler = _python(
        checkout,
        "import json; from benchmarks.proxy_handler import main; "
        "rows = main(['--calls', '4,32', '--runs', '1']); "
        "print(json.dumps([[r['handler_us_per_call'], r.get('close_us_per_call')] for r in rows]))",
    )
    close = {"close_us_32_calls": handler[1][1]} if handler[1][1] is not None else {}  # older benchmarks: none
    return {
        "calls_per_cpu_s_n1": load[1]["proxy_calls_per_cpu_s"],
        "calls_per_cpu_s_n64": load[64]["proxy_calls_per_cpu_s"],
        "added_median_ms_n1": load[1]["added_median_ms"],
        "added_median_ms_n64": load[64]["added_median_ms"],
        "handler_us_4_calls": handler[0][0],
        "handler_us_32_calls": handler[1][0],
        **close,
    }


def run(before: Path, after: Path, rounds: int, change: str) -> list[dict[str, Any]]:
    sides = {"before": (before, commit_of(before)), "after": (after, commit_of(after))}
    rows: list[dict[str, Any]] = []
    for round_ in range(rounds):
        order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
        for side in order:
            checkout, commit = sides[side]
            figures = measure(checkout)
            load = os.getloadavg()[0]
            for figure, value in figures.items():
                rows.append(
                    {
                        "change": change,
                        "side": side,
                        "commit": commit,
                        "round": round_,
                        "figure": figure,
                        "value": round(value, 3),
                        "load": round(load, 2),
                        "cpu": cpu_name(),
                    }
                )
            print(f"round {round_} {side} ({commit}, load {load:.2f}): {figures}", flush=True)
    return rows


def ab_table(rows: list[dict[str, Any]]) -> str:
    """Median per checkout and the ratio after / before, one row per figure."""
    lines = ["| figure | before | after | after / before |", "|---|---|---|---|"]
    for figure, (label, _) in FIGURES.items():
        values = {
            side: [r["value"] for r in rows if r["figure"] == figure and r["side"] == side]
            for side in ("before", "after")
        }
        if not values["before"] or not values["after"]:
            continue
        b, a = statistics.median(values["before"]), statistics.median(values["after"])
        lines.append(f"| {label} | {b:,.2f} | {a:,.2f} | {a / b:.2f} |")
    commits = {side: sorted({r["commit"] for r in rows if r["side"] == side}) for side in ("before", "after")}
    loads = [r["load"] for r in rows]
    rounds = len({r["round"] for r in rows})
    return (
        "\n".join(lines)
        + f"\n\nMedians of {rounds} alternated rounds per checkout (before {', '.join(commits['before'])}, after "
        f"{', '.join(commits['after'])}); load {min(loads):.1f}-{max(loads):.1f}; CPU: {rows[0]['cpu']}. From "
        f"`docs/results/{FILE}`, made by `python -m benchmarks.proxy_ab --before <checkout> --publish docs/results`.\n"
    )


def change_of(row: dict[str, Any]) -> str:
    return row.get("change", FIRST_CHANGE)


def by_change(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The stored rows per change, in the order first stored."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(change_of(row), []).append(row)
    return out


def read_rows(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the code before the change")
    parser.add_argument("--after", type=Path, default=ROOT, help="a checkout of the code after (default: this one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--change", default="change", help="what changed (the stored rows of one change go together)")
    parser.add_argument("--publish", type=Path, help=f"merge the rows into DIR/{FILE} (replacing this change's)")
    args = parser.parse_args(argv)
    rows = run(args.before.resolve(), args.after.resolve(), args.rounds, args.change)
    print(ab_table(rows))
    if args.publish:
        path = args.publish / FILE
        kept = [r for r in read_rows(path) if change_of(r) != args.change] if path.is_file() else []
        args.publish.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in kept + rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
