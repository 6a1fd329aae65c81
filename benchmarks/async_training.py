"""Synchronous vs bounded-staleness training on the main job's recipe, side by side in one run.

    .venv/bin/python -m benchmarks.async_training --out runs/async                     # k = 0, 1, 2; seeds 0, 1
    .venv/bin/python -m benchmarks.async_training --out runs/async --staleness 0 1 --seeds 0 --adapter
    .venv/bin/python -m benchmarks.async_training --out runs/async --staleness 0 --seeds 0 1 2 --bf16
    .venv/bin/python -m benchmarks.async_training --out runs/async --publish docs/results

For each seed and each `trainer.max_staleness` k, the main job's recipe (`trainers.main_job`, on the engine
the machine picks) trains the same number of updates from the same untrained policy, whose start evaluation
is measured once per seed and shared (`eval.cache_dir`). `--adapter` adds an arm with k = 0 and
`model.lora.sync=adapter` (in-process vLLM): the same recipe pushing the adapter alone. `--bf16` adds an arm
with k = 0 and `optim.autocast=bfloat16`: the same recipe with its forward and backward passes under bfloat16
autocast (faster updates on a CPU with AMX; does it learn as well?).

Per arm it prints: wall time per step, the share of it the trainer spent updating (trainer busy) and the share
the rollout side spent collecting (rollout side busy: above 1 - trainer busy only when the two overlap), held-out
reward before and after with the gain's 95 % interval (evaluation.gains, paired by seed and task) and the
difference to k = 0, the bytes and seconds of each weight push, and the checkpoint's size. Runs resume: an arm
whose run directory holds a summary is read back. `--publish DIR` merges the rows into
DIR/async_training.jsonl.gz (evidence rows) and DIR/async_training_steps.jsonl.gz (one line per step).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from evaluation.evidence import EvidenceRow, publish_rows, read_rows
from evaluation.gains import difference, gain

SUITE = "ClawGymBench"


class StepTiming(BaseModel):
    """One training step of one arm: where its time went and what its weight push cost."""

    arm: str
    seed: int
    step: int
    step_s: float
    update_s: float
    wait_s: float
    rollout_s: float
    producer_wait_s: float
    weight_sync_s: float
    weight_sync_bytes: float
    staleness_max: float
    rollouts_stale_dropped: float
    checkpoint_bytes: int | None = None  # the arm's final checkpoint (on its last step's line)
    cpu: str = "unknown"


VARIANTS = {  # an arm's change to the recipe, besides its staleness: its name suffix -> what it overrides
    "adapter": ["model.lora.sync=adapter"],
    "bf16": ["optim.autocast=bfloat16"],
}


def arm_name(k: int, variant: str | None = None) -> str:
    return f"staleness-{k}" + (f"+{variant}" if variant else "")


def arm_overrides(k: int, variant: str | None, seed: int, run_dir: Path, cache: Path, extra: list[str]) -> list[str]:
    """The main job's recipe on this machine's engine, with the arm's staleness and variant."""
    from trainers.main_job import main_job_overrides, pick_engine

    _, engine = pick_engine(False, extra)
    if variant == "adapter":  # adapters are pushed to the in-process vLLM engine
        engine = ["engine=vllm"] + [o for o in engine if o.startswith("+engine.options")]
    engine += VARIANTS[variant] if variant else []
    return main_job_overrides(run_dir=run_dir, extra=engine + extra) + [
        f"seed={seed}",
        f"trainer.max_staleness={k}",
        f"eval.cache_dir={cache}",
        "checkpoint.resume=auto",
        "logging.progress=false",
        "logging.tensorboard=false",
    ]


def run_arm(
    k: int, variant: str | None, seed: int, out: Path, extra: list[str]
) -> tuple[list[EvidenceRow], list[StepTiming]]:
    """Train one arm at one seed (or read it back) and return its evidence and step timings."""
    from trainers.engine_choice import cpu_facts
    from trainers.loop import train
    from trainers.main import compose

    arm = arm_name(k, variant)
    run_dir = out / "runs" / f"{arm}-seed{seed}"
    if not (run_dir / "summary.json").is_file():
        train(compose(arm_overrides(k, variant, seed, run_dir, out / "eval-cache", extra)))
    evidence = [
        r.model_copy(update={"experiment": "async_training", "arm": arm if r.arm != "untrained" else r.arm})
        for path in (run_dir / "eval_rollouts.jsonl", run_dir / "rollouts.jsonl")
        for r in read_rows(path)
    ]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r.get("kind") == "train"]
    ckpt = run_dir / "checkpoints" / "latest.pt"
    cpu = cpu_facts()[0]
    timings = [
        StepTiming(
            arm=arm,
            seed=seed,
            step=int(r["step"]),
            cpu=cpu,
            checkpoint_bytes=ckpt.stat().st_size if i == len(steps) - 1 and ckpt.is_file() else None,
            **{
                f: float(r.get(f, 0.0))
                for f in StepTiming.model_fields
                if f.endswith(("_s", "_bytes", "_max", "_dropped")) and f != "checkpoint_bytes"
            },
        )
        for i, r in enumerate(steps)
    ]
    return evidence, timings


def arm_summaries(rows: list[EvidenceRow], timings: list[StepTiming]) -> list[dict[str, Any]]:
    """Per arm: seconds per step, busy shares, push bytes and seconds, checkpoint bytes, gain and difference."""
    arms = sorted({t.arm for t in timings}, key=lambda a: ("+" in a, a))
    harness = next(r.eval_harness for r in rows if r.phase == "after")
    synchronous = "staleness-0" in arms  # a run of other arms alone is compared in the published table
    out = []
    for arm in arms:
        ts = [t for t in timings if t.arm == arm]
        wall = sum(t.step_s for t in ts)
        ckpt = [t.checkpoint_bytes for t in ts if t.checkpoint_bytes]
        out.append(
            {
                "arm": arm,
                "harness": harness,
                "steps": len(ts) // len({t.seed for t in ts}),  # per seed
                "step_s": wall / len(ts),
                "step_s_by_seed": [
                    float(np.mean([t.step_s for t in ts if t.seed == seed])) for seed in sorted({t.seed for t in ts})
                ],
                "trainer_busy": sum(t.update_s for t in ts) / wall,
                "rollouts_busy": sum(t.rollout_s for t in ts) / wall,
                "push_mb": float(np.mean([t.weight_sync_bytes for t in ts])) / 1e6,
                "push_s": float(np.mean([t.weight_sync_s for t in ts])),
                "checkpoint_mb": float(np.mean(ckpt)) / 1e6 if ckpt else None,
                "gain": gain(rows, arm, harness),
                "versus_sync": difference(rows, arm, "staleness-0", harness)
                if synchronous and arm != "staleness-0"
                else None,
                "cpu": ts[0].cpu,
            }
        )
    return out


def report(rows: list[EvidenceRow], timings: list[StepTiming]) -> str:
    """The side-by-side table (plain text), from the rows alone."""

    def interval(e: Any) -> str:
        return "" if e is None else f"{e.value:+.3f} [{e.low:+.3f}, {e.high:+.3f}]"

    lines = [
        f"{'arm':<22} {'s/step':>7} {'trainer busy':>12} {'rollouts busy':>13} {'push MB':>8} {'push s':>7} "
        f"{'ckpt MB':>8}  held-out gain [95 %]  vs staleness-0"
    ]
    for a in arm_summaries(rows, timings):
        ckpt = float("nan") if a["checkpoint_mb"] is None else a["checkpoint_mb"]
        lines.append(
            f"{a['arm']:<22} {a['step_s']:7.1f} {a['trainer_busy']:12.2f} {a['rollouts_busy']:13.2f} "
            f"{a['push_mb']:8.2f} {a['push_s']:7.2f} {ckpt:8.1f}  {interval(a['gain'])} (n={a['gain'].seeds})  "
            f"{interval(a['versus_sync'])}"
        )
    return "\n".join(lines)


def write_timings(path: Path, timings: list[StepTiming]) -> None:
    """Merge step timings into a gzip JSON-lines file (an arm and seed measured again replaces its lines)."""
    kept = read_timings(path) if path.is_file() else []
    new = {(t.arm, t.seed) for t in timings}
    merged = [t for t in kept if (t.arm, t.seed) not in new] + timings
    merged.sort(key=lambda t: (t.arm, t.seed, t.step))
    data = "".join(t.model_dump_json() + "\n" for t in merged).encode()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    os.replace(tmp, path)


def read_timings(path: Path) -> list[StepTiming]:
    return [StepTiming.model_validate_json(line) for line in gzip.decompress(path.read_bytes()).splitlines() if line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/async"))
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--adapter", action="store_true", help="also k = 0 with model.lora.sync=adapter")
    parser.add_argument("--bf16", action="store_true", help="also k = 0 with optim.autocast=bfloat16")
    parser.add_argument("--publish", type=Path, default=None, help="merge the rows into DIR/async_training*.jsonl.gz")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every arm (after --)")
    args = parser.parse_args(argv)
    arms = [(k, None) for k in args.staleness]
    arms += [(0, variant) for variant in VARIANTS if getattr(args, variant)]
    rows: list[EvidenceRow] = []
    timings: list[StepTiming] = []
    for seed in args.seeds:
        for k, variant in arms:
            r, t = run_arm(k, variant, seed, args.out, list(args.overrides))
            rows += r
            timings += t
    seen: set[tuple[Any, ...]] = set()  # the shared start evaluation appears once per seed
    unique = []
    for r in rows:
        key = (r.phase, r.arm, r.seed, r.task_id, r.repeat, r.step, r.eval_harness)
        if r.phase != "train" and key in seen:
            continue
        seen.add(key)
        unique.append(r)
    print(report(unique, timings))
    if args.publish is not None:
        publish_rows(args.publish / "async_training.jsonl.gz", unique)
        write_timings(args.publish / "async_training_steps.jsonl.gz", timings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
