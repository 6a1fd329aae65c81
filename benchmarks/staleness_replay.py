"""What asynchronous steps would buy at GPU scale: replay measured rollout durations, synchronous vs bounded staleness.

    .venv/bin/python -m benchmarks.staleness_replay                      # every stored file with rollout wall times
    .venv/bin/python -m benchmarks.staleness_replay --concurrency 64 256 1024 --staleness 0 1 2 --update-s 30

On two cores the trainer and the engine share the CPU, so overlapping them cannot show what it does on a GPU
machine, where rollouts wait on harnesses and sandboxes while the accelerator idles. This simulation draws
rollout durations (with replacement) from the wall times stored per harness in `docs/results/*.jsonl.gz`
(`EvidenceRow.wall_s`) and replays the loop as `trainers.rollout_producer` runs it: a step's batch of
`concurrency` rollouts starts together and is done when its slowest rollout is; batch b may start once the
trainer finished step b - k; update b starts when batch b is done and update b - 1 is. It reports, per
harness and concurrency, the wall time per step and the share of it the trainer and the rollout slots sit
idle. The update time is an input (`--update-s`, a GPU trainer's step on the batch), not a measurement.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from evaluation.evidence import read_rows

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def durations_by_harness(paths: list[Path]) -> dict[str, np.ndarray]:
    """Stored rollout wall times per harness (rows without one are skipped)."""
    out: dict[str, list[float]] = defaultdict(list)
    for path in paths:
        for row in read_rows(path):
            if row.wall_s is not None and row.wall_s > 0:
                out[row.eval_harness].append(row.wall_s)
    return {h: np.asarray(v) for h, v in out.items()}


def replay(
    durations: np.ndarray, concurrency: int, update_s: float, max_staleness: int, steps: int = 50, seed: int = 0
) -> dict[str, float]:
    """Wall time per step, trainer idle share and rollout-slot idle share of `steps` steps."""
    rng = np.random.default_rng(seed)
    drawn = rng.choice(durations, (steps, concurrency))  # one row per step's batch
    batch_s, busy_slots = drawn.max(axis=1), drawn.sum(axis=1)
    released = np.zeros(steps + 1)  # released[j]: the trainer finished step j (j = 0: the start)
    collected = 0.0
    for b in range(steps):
        start = max(collected, released[max(0, b - max_staleness)])
        collected = start + batch_s[b]
        released[b + 1] = max(collected, released[b]) + update_s
    wall = released[-1]
    return {
        "step_s": wall / steps,
        "trainer_idle": 1.0 - steps * update_s / wall,
        "slots_idle": 1.0 - busy_slots.sum() / (concurrency * wall),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, nargs="*", default=None, help="evidence files (default: docs/results)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--update-s", type=float, default=30.0, help="the trainer's time per step (an assumption)")
    args = parser.parse_args(argv)
    paths = args.results if args.results else sorted(RESULTS.glob("*.jsonl.gz"))
    by_harness = durations_by_harness(paths)
    if not by_harness:
        raise SystemExit(f"no stored rollout has a wall time (EvidenceRow.wall_s) in {[str(p) for p in paths]}")
    print(f"update time per step: {args.update_s:.0f} s (assumed); rollout wall times from {len(paths)} files")
    print(
        f"{'harness':<12} {'rollouts':>8} {'median s':>8} {'p95 s':>7} {'N':>5} "
        + " ".join(f"{'k=' + str(k) + ' s/step':>12} {'idle T/R':>9}" for k in args.staleness)
    )
    for harness, d in sorted(by_harness.items()):
        for n in args.concurrency:
            cells = []
            for k in args.staleness:
                r = replay(d, n, args.update_s, k)
                cells.append(f"{r['step_s']:12.1f} {r['trainer_idle']:4.2f}/{r['slots_idle']:4.2f}")
            print(
                f"{harness:<12} {len(d):8d} {np.median(d):8.1f} {np.percentile(d, 95):7.1f} {n:5d} " + " ".join(cells)
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
