"""Per-rollout evidence: one JSON line per rollout of every training run and every held-out evaluation.

A reviewer asks for the data behind a number, not the number. Every experiment writes its rollouts as
`EvidenceRow`s (JSON lines, gzip-compressed when the name ends in .gz), and the published files under
docs/results/ are what the docs' tables are computed from (`benchmarks.experiment_report`). A cell can
be recomputed without ClawGym:

    import gzip, json
    rows = [json.loads(line) for line in gzip.open("docs/results/transfer_matrix.jsonl.gz", "rt")]
    after = [r["reward"] for r in rows if r["arm"] == "Pi" and r["eval_harness"] == "Pi" and r["phase"] == "after"]

Phases: "before" (the untrained policy, arm "untrained"), "after" (the policy trained in `arm`), "train"
(a rollout of a training step; `step` says which, `eval_harness` is the harness it ran through).
An evaluation measured more than once with identical settings (same `evaluation` digest) keeps every draw
(`draw` 0, 1, ...): the example above pools them, as `evaluation.gains` does.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel

from evaluation.report import EvalReport

UNTRAINED = "untrained"
Phase = Literal["before", "after", "train"]


class EvidenceRow(BaseModel):
    """One rollout: which policy (arm, seed, checkpoint), where (suite, harness, task), and its outcome."""

    experiment: str
    arm: str  # how the policy was trained: one harness, several joined by "+", or "untrained"
    phase: Phase
    seed: int  # the training seed (and the evaluation's sampling seed)
    eval_harness: str  # the harness the rollout ran through
    suite: str
    task_id: str
    repeat: int = 0
    step: int | None = None  # training rows: the step whose update used this rollout (1-based)
    extra_group: bool = False  # training rows: its group was drawn by dynamic sampling (env.extra_groups)
    stale_dropped: bool = False  # training rows: its group was past trainer.max_staleness and not trained on
    reward: float  # failed rollouts count 0, as env.step returns them
    status: str = "ok"
    num_calls: int = 0
    generated_tokens: int = 0
    wall_s: float | None = None  # the rollout's wall time (sandbox, harness, calls, verifier)
    checkpoint: str | None = None  # the policy's checkpoint, relative to the experiment's folder
    commit: str = "unknown"
    evaluation: str | None = None  # evaluation rows: the measurement's identity (evaluation.cache.EvalKey digest)
    draw: int = 0  # evaluation rows: which draw of that measurement (publish_rows keeps every draw)


def current_commit(repo: Path | None = None) -> str:
    """The checkout's commit (with "+dirty" when tracked files differ from it), or "unknown"."""
    repo = repo or Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=repo, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 1 else "")


def rows_from_report(report: EvalReport, **fields: Any) -> list[EvidenceRow]:
    """An evaluation's rollouts as evidence; `fields` gives experiment, arm, phase, seed, checkpoint, commit."""
    return [
        EvidenceRow(
            eval_harness=row.harness,
            suite=row.suite,
            task_id=row.task_id,
            repeat=row.repeat,
            reward=row.reward if row.status == "ok" else 0.0,
            status=row.status,
            num_calls=row.num_calls,
            generated_tokens=row.generated_tokens,
            evaluation=report.evaluation,
            **fields,
        )
        for row in report.rows
    ]


def rows_from_batch(batch: Any, step: int, **fields: Any) -> list[EvidenceRow]:
    """A training step's rollouts (a `trainers.rollout_batch.RolloutBatch`) as evidence rows of phase "train"."""
    rows = []
    infos = batch.infos or [{}] * len(batch.forests)
    for i, forest in enumerate(batch.forests):
        reward = float(batch.rewards[i])
        ok = batch.statuses[i] == "ok" and np.isfinite(reward)
        rows.append(
            EvidenceRow(
                phase="train",
                step=step,
                eval_harness=batch.harnesses[i],
                task_id=batch.task_ids[i],
                reward=reward if ok else 0.0,
                status=batch.statuses[i],
                num_calls=int(forest.stats.calls),
                generated_tokens=int(forest.stats.generated_tokens),
                extra_group="extra_group" in infos[i],
                stale_dropped=bool(infos[i].get("stale_dropped", False)),
                wall_s=infos[i].get("wall_s"),
                **fields,
            )
        )
    return rows


class EvidenceLog:
    """A run's training rows, appended step by step to `<run_dir>/rollouts.jsonl`; a resume from step N
    drops the rows of later steps (they run again), as the metrics log does."""

    def __init__(self, path: str | Path, *, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled

    def append(self, rows: Sequence[EvidenceRow]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.writelines(row.model_dump_json() + "\n" for row in rows)

    def truncate_after(self, step: int) -> int:
        if not self.enabled or not self.path.is_file():
            return 0
        rows = read_rows(self.path)
        kept = [r for r in rows if (r.step or 0) <= step]
        write_rows(self.path, kept)
        return len(rows) - len(kept)


def write_rows(path: str | Path, rows: Iterable[EvidenceRow]) -> Path:
    """Write rows as JSON lines (gzip when the name ends in .gz; reproducible bytes), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(row.model_dump_json() + "\n" for row in rows).encode()
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".gz":
        data = gzip.compress(data, compresslevel=9, mtime=0)
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def publish_rows(path: str | Path, rows: Sequence[EvidenceRow]) -> Path:
    """Merge `rows` into a published file.

    Rows are grouped by (experiment, phase, arm, seed, harness, suite). A group measured now replaces its
    earlier rows (a retrained policy, an evaluation under other settings), except that every draw of the
    same evaluation is kept: when the earlier rows carry the same `evaluation` digest (same policy,
    checkpoint, tasks, seeds, harness code and settings) and the new rows are another draw, they are added
    as the next `draw`. So an experiment filled over sessions (a fresh output folder each time) never drops
    what was published before, a re-measured untrained policy adds to its baseline instead of moving every
    cell to whichever draw came last, republishing the same draw changes nothing, and runs named apart (the
    main job's, by their directories) never replace each other."""

    def key(r: EvidenceRow) -> tuple[str, str, str, int, str, str]:
        return (r.experiment, r.phase, r.arm, r.seed, r.eval_harness, r.suite)

    path = Path(path)
    earlier: dict[tuple[str, str, str, int, str, str], list[EvidenceRow]] = {}
    for r in read_rows(path) if path.is_file() else []:
        earlier.setdefault(key(r), []).append(r)
    now: dict[tuple[str, str, str, int, str, str], list[EvidenceRow]] = {}
    for r in rows:
        now.setdefault(key(r), []).append(r)
    merged = [r for k, group in earlier.items() if k not in now for r in group]
    for k, group in now.items():
        merged += _merge_draws(earlier.get(k, []), group)
    return write_rows(path, merged)


def _merge_draws(earlier: list[EvidenceRow], new: list[EvidenceRow]) -> list[EvidenceRow]:
    """One group's rows after publishing `new`: the earlier draws of the same evaluation, then `new` as the
    draw it repeats or the next one; or `new` alone when it measured something else."""
    digests = {r.evaluation for r in new}
    if len(digests) != 1 or None in digests or {r.evaluation for r in earlier} != digests:
        return list(new)
    draws: dict[int, list[EvidenceRow]] = {}
    for r in earlier:
        draws.setdefault(r.draw, []).append(r)

    def outcome(group: list[EvidenceRow]) -> list[tuple[Any, ...]]:
        fields = ("task_id", "repeat", "reward", "status", "num_calls", "generated_tokens")
        return sorted(tuple(getattr(r, f) for f in fields) for r in group)

    same = next((d for d, group in draws.items() if outcome(group) == outcome(new)), None)
    number = same if same is not None else max(draws) + 1
    draws[number] = [r.model_copy(update={"draw": number}) for r in new]
    return [r for _, group in sorted(draws.items()) for r in group]


def read_rows(path: str | Path) -> list[EvidenceRow]:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [EvidenceRow.model_validate(json.loads(line)) for line in f if line.strip()]


def groups_with_signal(rewards_by_task: dict[str, list[float]]) -> int:
    """How many tasks' groups have rewards that differ: the only groups GRPO's advantages are non-zero for."""
    return sum(max(rs) != min(rs) for rs in rewards_by_task.values() if len(rs) > 1)


def degenerate_groups(rows: Iterable[EvidenceRow]) -> dict[str, tuple[int, int]]:
    """Per arm: (GRPO groups whose rewards were all equal, all groups) over its training rows.
    A group is one (seed, step, harness, task) of phase "train"."""
    groups: dict[tuple[str, int, int | None, str, str], list[float]] = {}
    for r in rows:
        if r.phase == "train":
            groups.setdefault((r.arm, r.seed, r.step, r.eval_harness, r.task_id), []).append(r.reward)
    out: dict[str, tuple[int, int]] = {}
    for (arm, *_), rewards in groups.items():
        flat, total = out.get(arm, (0, 0))
        out[arm] = (flat + (max(rewards) == min(rewards)), total + 1)
    return out
