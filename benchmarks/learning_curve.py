"""Does training raise held-out reward? GRPO and PPO, several seeds, one table with 95 % intervals.

    .venv/bin/python -m benchmarks.learning_curve --algorithms grpo ppo --seeds 0 1 2 -- \
        env=clawgym_pi model=qwen2.5-coder-0.5b model.lora.enabled=true steps=8
    (everything after `--` is a Hydra override of trainers/conf, as for `clawgym train`)

For each algorithm and seed it trains from scratch (`trainers.loop.train`), reading the held-out reward
(the env's eval split, per harness) at the start (after the warm start if enabled) and at the end. The
start evaluation without warm start is measured once per seed and reused by the other algorithm
(<out>/eval-cache, `evaluation.EvalCache`). Every held-out and training rollout is an evidence row (each
run's eval_rollouts.jsonl and rollouts.jsonl, gathered in <out>/evidence.jsonl.gz; `--publish FILE`
writes them there too). An algorithm "learned" when the 95 % interval of its paired gain
(`evaluation.gains`: bootstrap over seeds, tasks and rollouts) lies above zero. Results go to
<out>/learning_curve.json and the per-run folders.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.evidence import UNTRAINED, EvidenceRow, read_rows, write_rows
from evaluation.gains import gain
from trainers.loop import train
from trainers.main import compose


def finished_summary(run_dir: Path, cfg: Any) -> dict[str, Any] | None:
    """The summary of an earlier run in `run_dir` with the same config (`same_config`), if any: a benchmark of
    hours is resumable run by run."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if same_config(run_dir, cfg) and summary.get("eval_end") else None


SET_ASIDE = {"logging": ("progress",), "eval": ("concurrency", "cache_dir"), "checkpoint": ("every", "keep")}
"""Config fields that change how a run is shown, how fast it measures or how much a stop loses, not what it trains."""


def same_config(run_dir: Path, cfg: Any) -> bool:
    """Whether the run in `run_dir` was started with `cfg`, its run dir and SET_ASIDE apart."""
    try:
        done = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    want = json.loads(cfg.model_dump_json())
    for c in (done, want):
        c.pop("run_dir", None)
        for section, fields in SET_ASIDE.items():
            for field in fields:
                c.get(section, {}).pop(field, None)
    return done == want


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


def evidence(algorithm: str, rows: list[dict[str, Any]]) -> list[EvidenceRow]:
    """The runs' held-out and training rollouts, the trained ones under arm `algorithm`."""
    out = []
    for r in rows:
        run_dir = Path(r["run_dir"])
        for name in ("eval_rollouts.jsonl", "rollouts.jsonl"):
            if (run_dir / name).is_file():
                out += [
                    e.model_copy(
                        update={"experiment": "learning_curve", "arm": e.arm if e.arm == UNTRAINED else algorithm}
                    )
                    for e in read_rows(run_dir / name)
                ]
    return out


def verdict(algorithm: str, rows: list[dict[str, Any]], stored: list[EvidenceRow]) -> dict[str, Any]:
    """Means over seeds, and the paired gain over every harness evaluated with its 95 % interval."""
    starts = np.array([r["start"] for r in rows])
    gains = np.array([r["gain"] for r in rows])
    out: dict[str, Any] = {
        "start_mean": float(starts.mean()),
        "end_mean": float(np.mean([r["end"] for r in rows])),
        "gain_mean": float(gains.mean()),
    }
    harnesses = sorted({e.eval_harness for e in stored if e.phase == "after" and e.arm == algorithm})
    estimates = {h: gain(stored, algorithm, h) for h in harnesses}
    out["gains"] = {h: e.model_dump() for h, e in estimates.items()}
    out["learned"] = bool(estimates) and all(e.shown and e.value > 0 for e in estimates.values())
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", nargs="+", default=["grpo", "ppo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs") / f"learning-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--publish", type=Path, help="also write every rollout to FILE (e.g. docs/results/x.jsonl.gz)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"overrides": args.overrides, "algorithms": {}}
    stored: list[EvidenceRow] = []
    for algorithm in args.algorithms:
        rows = [run(algorithm, seed, args.overrides, args.out) for seed in args.seeds]
        rows_of_algorithm = evidence(algorithm, rows)
        stored += [e for e in rows_of_algorithm if e not in stored]  # the shared start evaluation once
        report["algorithms"][algorithm] = {"runs": rows, **verdict(algorithm, rows, rows_of_algorithm)}
        (args.out / "learning_curve.json").write_text(json.dumps(report, indent=2, default=str))
    write_rows(args.out / "evidence.jsonl.gz", stored)
    if args.publish is not None:
        write_rows(args.publish, stored)
    print(f"{'algorithm':<10}{'harness':<12}{'start':>8}{'end':>8}{'gain':>8}  95 % interval     learned")
    for algorithm, r in report["algorithms"].items():
        for h, e in r["gains"].items():
            print(
                f"{algorithm:<10}{h:<12}{r['start_mean']:>8.3f}{r['end_mean']:>8.3f}{e['value']:>+8.3f}  "
                f"[{e['low']:+.3f}, {e['high']:+.3f}]  {r['learned']}"
            )
    print(f"details: {args.out / 'learning_curve.json'}; rollouts: {args.out / 'evidence.jsonl.gz'}")
    return report


if __name__ == "__main__":
    main()
