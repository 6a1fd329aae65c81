"""Does training raise held-out reward by more than the noise? GRPO and PPO, several seeds, one table.

    .venv/bin/python -m benchmarks.learning_curve --algorithms grpo ppo --seeds 0 1 2 -- \
        env=clawgym_pi model=qwen2.5-coder-0.5b model.lora.enabled=true steps=8
    (everything after `--` is a Hydra override of trainers/conf, as for `clawgym train`)

For each algorithm and seed it trains from scratch (`trainers.loop.train`), reading the held-out reward
(the env's eval split, per harness) at the start (after the warm start if enabled) and at the end. The
start evaluation without warm start is measured once per seed and reused by the other algorithm
(<out>/eval-cache, `evaluation.EvalCache`).
Noise is the standard deviation over seeds of the start reward (the spread of the measurement itself);
the run passes when the mean gain (end - start) exceeds max(noise, std of the gain over seeds) and is
positive. Results go to <out>/learning_curve.json and the per-run folders.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from trainers.loop import train
from trainers.main import compose


def finished_summary(run_dir: Path, cfg: Any) -> dict[str, Any] | None:
    """The summary of an earlier run in `run_dir` with the same config (run dir, display, evaluation
    concurrency and cache aside: they change how fast a run measures, not what), if any: a benchmark of
    hours is resumable run by run."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        done = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    want = json.loads(cfg.model_dump_json())
    for c in (done, want):
        c.pop("run_dir", None)
        c.get("logging", {}).pop("progress", None)
        for speed_only in ("concurrency", "cache_dir"):
            c.get("eval", {}).pop(speed_only, None)
    return summary if done == want and summary.get("eval_end") else None


def run(algorithm: str, seed: int, overrides: list[str], out: Path) -> dict[str, Any]:
    """One algorithm at one seed; the untrained policy's start evaluation is shared through <out>/eval-cache
    (the other algorithm at the same seed starts from the same policy, tasks and sampling seed)."""
    run_dir = out / f"{algorithm}-seed{seed}"
    cfg = compose(
        [
            f"algorithm={algorithm}",
            f"seed={seed}",
            f"run_dir={run_dir}",
            "logging.progress=false",
            f"eval.cache_dir={out / 'eval-cache'}",
            *overrides,
        ]
    )
    start = time.perf_counter()
    summary = finished_summary(run_dir, cfg)
    if summary is not None:
        print(f"{run_dir}: finished earlier with this config, reusing its summary")
    else:
        summary = train(cfg)
    start_reward = (summary.get("eval_start") or {}).get("eval_reward_mean", float("nan"))
    end_reward = (summary.get("eval_end") or {}).get("eval_reward_mean", float("nan"))
    return {
        "algorithm": algorithm,
        "seed": seed,
        "start": start_reward,
        "end": end_reward,
        "gain": end_reward - start_reward,
        "wall_s": time.perf_counter() - start,
        "run_dir": str(run_dir),
        "warm_start": summary["stages"].get("warm_start"),
    }


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    starts = np.array([r["start"] for r in rows])
    gains = np.array([r["gain"] for r in rows])
    noise = float(max(starts.std(ddof=1) if len(rows) > 1 else 0.0, gains.std(ddof=1) if len(rows) > 1 else 0.0))
    mean_gain = float(gains.mean())
    return {
        "start_mean": float(starts.mean()),
        "end_mean": float(np.mean([r["end"] for r in rows])),
        "gain_mean": mean_gain,
        "noise": noise,
        "learned": bool(mean_gain > 0 and mean_gain > noise),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", nargs="+", default=["grpo", "ppo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs") / f"learning-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"overrides": args.overrides, "algorithms": {}}
    for algorithm in args.algorithms:
        rows = [run(algorithm, seed, args.overrides, args.out) for seed in args.seeds]
        report["algorithms"][algorithm] = {"runs": rows, **verdict(rows)}
        (args.out / "learning_curve.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"{'algorithm':<8}{'start':>8}{'end':>8}{'gain':>8}{'noise':>8}  learned")
    for algorithm, r in report["algorithms"].items():
        print(
            f"{algorithm:<8}{r['start_mean']:>8.3f}{r['end_mean']:>8.3f}{r['gain_mean']:>8.3f}{r['noise']:>8.3f}  {r['learned']}"
        )
    print(f"details: {args.out / 'learning_curve.json'}")
    return report


if __name__ == "__main__":
    main()
