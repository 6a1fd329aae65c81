"""Does training in one harness improve another? Train GRPO in each arm, evaluate every policy in every harness.

    .venv/bin/python -m benchmarks.transfer_matrix --out runs/matrix            # full size (hours; resumable)
    .venv/bin/python -m benchmarks.transfer_matrix --out runs/matrix --arms Pi --seeds 0   # one cell row, one seed
    .venv/bin/python -m benchmarks.transfer_matrix --out runs/matrix --plan     # what is done, what is left
    .venv/bin/python -m benchmarks.transfer_matrix --quick --out runs/matrix-quick   # tiny model, 1 step (plumbing)

Arms (how the policy is trained): the white-box loop, pi, Claude Code, and pi + Claude Code in one batch.
Every arm trains with the main job's learning recipe (`trainers.main_job`, the one the learning test
measured), from the same untrained policy, once per seed. Every trained policy and the untrained one are
then evaluated on the same held-out ClawGymBench tasks (one suite seed for all) through the white-box loop,
pi and Claude Code at the recipe's sampling temperature.

A cell (arm x evaluation harness) is before -> after over the seeds: `before` is the untrained policy's
held-out reward at that seed (the same measurement for every arm: evaluated once per seed and reused from
the evaluation cache), `after` the trained one's. Noise, as in the learning test
(`benchmarks.learning_curve.verdict`), is the larger of the standard deviations over seeds of `before` (the
spread of the measurement itself) and of the gain; a gain counts when it is positive and above the noise.

Resuming: a training run whose directory holds a finished summary with the same config is not run again
(an unfinished one continues from its newest checkpoint), and an evaluation whose key (policy, checkpoint,
tasks, seeds, harness) is in `<out>/eval-cache` is read back. So the matrix can be filled over several
sessions, arm by arm (`--arms`) and seed by seed (`--seeds`); cells not yet run show as "to run".
Output: <out>/matrix.json, matrix.txt (the table) and matrix.png (gains with noise per cell).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from benchmarks.learning_curve import finished_summary
from evaluation import EvalCache, EvalReport, cached_evaluation, evaluate

SUITE = "ClawGymBench"
ARMS: dict[str, list[str]] = {
    "WhiteBox": ["WhiteBox"],
    "Pi": ["Pi"],
    "ClaudeCode": ["ClaudeCode"],
    "Pi+ClaudeCode": ["Pi", "ClaudeCode"],
}
"""Training arms: the harnesses of one training batch."""
EVAL_HARNESSES = ["WhiteBox", "Pi", "ClaudeCode"]
UNTRAINED = "untrained"
QUICK = ["steps=1", "env.train_tasks=1", "env.eval_tasks=1", "eval.repeats=1", "env.options.max_new_tokens=8"]
"""On top of the main job's --quick preset (tiny random model): one step on one task, one held-out task."""


class MatrixSettings(BaseModel):
    arms: list[str] = Field(default_factory=lambda: list(ARMS))
    eval_harnesses: list[str] = Field(default_factory=lambda: list(EVAL_HARNESSES))
    seeds: list[int] = Field(default_factory=lambda: [0, 1])
    quick: bool = False
    overrides: list[str] = Field(default_factory=list)  # extra Hydra overrides for every arm


class SeedResult(BaseModel):
    seed: int
    reward: float  # held-out mean reward of the policy at this seed in this harness
    rollouts: int
    failed: int
    results: str  # the evaluation's results.json (or cache entry)


class Cell(BaseModel):
    """One arm evaluated in one harness: per-seed before/after and the aggregate."""

    arm: str
    harness: str
    before: list[SeedResult] = Field(default_factory=list)
    after: list[SeedResult] = Field(default_factory=list)
    before_mean: float | None = None
    after_mean: float | None = None
    gain_mean: float | None = None
    noise: float | None = None
    seeds: int = 0
    improved: bool | None = None  # gain > 0 and above the noise (None: not enough seeds to tell)

    def text(self) -> str:
        if self.arm == UNTRAINED:
            if self.before_mean is None:
                return "to run"
            return (
                f"{self.before_mean:.3f} ±{self.noise:.3f} (n={self.seeds})"
                if self.noise is not None
                else f"{self.before_mean:.3f} (n={self.seeds})"
            )
        if self.gain_mean is None:
            return "to run"
        noise = f"±{self.noise:.3f}" if self.noise is not None else "±?"
        return f"{self.before_mean:.3f}→{self.after_mean:.3f} ({self.gain_mean:+.3f} {noise}, n={self.seeds})"


class TrainingRecord(BaseModel):
    arm: str
    seed: int
    run_dir: str
    trained_now: bool  # False: a finished run with the same config was reused
    wall_s: float
    checkpoint: str


class MatrixReport(BaseModel):
    settings: MatrixSettings
    model: str
    recipe: list[str]
    cells: dict[str, dict[str, Cell]]  # arm (or "untrained") -> evaluation harness -> cell
    mixed_vs_single: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    training: list[TrainingRecord] = Field(default_factory=list)
    evaluations_measured: int = 0  # evaluations run by this invocation (the rest came from the cache)
    evaluations_reused: int = 0
    wall_s: float = 0.0

    def table(self) -> Table:
        table = Table(
            title=f"{SUITE} transfer matrix: {self.model}, GRPO; held-out reward before→after (gain ±noise, seeds)"
        )
        table.add_column("trained in", no_wrap=True)
        for h in self.settings.eval_harnesses:
            table.add_column(f"evaluated in {h}", justify="right", no_wrap=True)
        for arm, row in self.cells.items():
            table.add_row(arm, *(row[h].text() for h in self.settings.eval_harnesses))
        return table

    def text(self, width: int = 200) -> str:
        console = Console(width=width, record=True, file=_Null())
        console.print(self.table())
        for h, d in self.mixed_vs_single.items():
            if d.get("difference") is not None:
                console.print(
                    f"mixed vs single in {h}: gain {d['mixed_gain']:+.3f} vs {d['single_gain']:+.3f} "
                    f"(difference {d['difference']:+.3f} ±{d['noise']:.3f})"
                )
        return console.export_text()


class _Null:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass


# ------------------------------------------------------------------------------------------- one arm
TRAINER_EVAL_OFF = ["env.eval_tasks=1", "eval.repeats=1", "eval.every=0"]
"""The trainer's own end-of-run evaluation, shrunk to one rollout: the matrix evaluates every policy itself."""


def arm_overrides(arm: str, seed: int, run_dir: Path, settings: MatrixSettings, *, training: bool = False) -> list[str]:
    """The main job's recipe for this arm and seed (later entries win); `training` adds TRAINER_EVAL_OFF."""
    from trainers.main_job import main_job_overrides

    harnesses = ARMS[arm]
    overrides = main_job_overrides(
        mix=len(harnesses) > 1, whitebox=harnesses == ["WhiteBox"], quick=settings.quick, run_dir=run_dir
    )
    if len(harnesses) == 1 and harnesses != ["WhiteBox"]:
        overrides.append(f"env.ids=[{SUITE}-{harnesses[0]}]")
    if settings.quick:
        overrides += QUICK
    return [
        *overrides,
        f"seed={seed}",
        "env.suite_seed=0",
        "eval.at_start=false",
        "checkpoint.resume=auto",
        "logging.progress=false",
        "logging.tensorboard=false",
        *settings.overrides,
        *(TRAINER_EVAL_OFF if training else []),
    ]


def train_arm(arm: str, seed: int, out: Path, settings: MatrixSettings) -> tuple[Any, TrainingRecord]:
    """Train one arm at one seed, or reuse a finished run with the same config."""
    from trainers.loop import train
    from trainers.main import compose

    run_dir = out / "train" / f"{_slug(arm)}-seed{seed}"
    cfg = compose(arm_overrides(arm, seed, run_dir, settings, training=True))
    if cfg.checkpoint.every == 0 or cfg.steps % cfg.checkpoint.every:  # the final weights must be saved
        cfg = cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(update={"every": cfg.steps})})
    start = time.perf_counter()
    done = finished_summary(run_dir, cfg) is not None and (run_dir / "checkpoints" / "latest.pt").is_file()
    if not done:
        train(cfg)
    checkpoint = run_dir / "checkpoints" / "latest.pt"
    if not checkpoint.is_file():
        raise RuntimeError(f"training {arm} (seed {seed}) wrote no checkpoint at {checkpoint}; see {run_dir}")
    record = TrainingRecord(
        arm=arm,
        seed=seed,
        run_dir=str(run_dir),
        trained_now=not done,
        wall_s=time.perf_counter() - start,
        checkpoint=str(checkpoint),
    )
    return compose(arm_overrides(arm, seed, run_dir, settings)), record


def _evaluation_arguments(cfg: Any, checkpoint: Path | None, seed: int) -> dict[str, Any]:
    """The held-out evaluation of a policy as the trainer's config describes it (tasks, repeats, sampling,
    per-call limits), and the policy's identity for the cache (model, weights, sampling seed, checkpoint)."""
    policy_key = {
        "model": cfg.model.name,
        "weights_seed": cfg.model.seed,
        "dtype": cfg.model.dtype,
        "engine": cfg.engine.model_dump(),  # where it is served: a vLLM evaluation (bf16 on CPU) is not a transformers one
        "engine_seed": seed,
        "checkpoint": _file_identity(checkpoint),
    }
    temperature = cfg.eval.temperature if cfg.eval.temperature is not None else cfg.algorithm.temperature
    options = {k: v for k, v in cfg.env.options.items() if k in ("max_new_tokens", "max_calls", "score_capped")}
    return dict(
        split=cfg.env.eval_split,
        repeats=cfg.eval.repeats,
        level=cfg.env.level,
        count=cfg.env.eval_tasks,
        seed=cfg.env.suite_seed,
        temperature=temperature,
        env_overrides=options,
        policy_key=policy_key,
    )


def evaluate_policy(
    cfg: Any,
    checkpoint: Path | None,
    seed: int,
    label: str,
    out: Path,
    settings: MatrixSettings,
    cache: EvalCache,
    plan_only: bool = False,
) -> dict[str, EvalReport | None]:
    """One policy (untrained, or a checkpoint) on the held-out tasks through each evaluation harness, one
    cached evaluation per harness (so cells fill independently); the model is loaded only if one is missing.
    With `plan_only`, only read back (None where missing)."""
    from clawgym_cli.compare import build_policy

    common = _evaluation_arguments(cfg, checkpoint, seed)
    reports: dict[str, EvalReport | None] = {}
    policy = LazyPolicy(lambda: build_policy(cfg.model_copy(update={"seed": seed}), checkpoint))
    try:
        for h in settings.eval_harnesses:
            env_ids = [f"{SUITE}-{h}"]
            if plan_only:
                reports[h] = cached_evaluation(env_ids, cache=cache, **common)
                continue
            run_dir = out / "eval" / f"{_slug(label)}-seed{seed}-{_slug(h)}"
            reports[h] = evaluate(
                policy,
                env_ids,
                run_dir=run_dir,
                model_name=f"{cfg.model.name}: {label}",
                progress=False,
                cache=cache,
                concurrency=cfg.eval.concurrency,
                **common,
            )
    finally:
        policy.close()
    return reports


class LazyPolicy:
    """A policy built on its first rollout: an evaluation read back from the cache never loads the model."""

    def __init__(self, build: Any) -> None:
        self._build = build
        self._policy: Any = None

    def __call__(self, _task: Any) -> Any:
        if self._policy is None:
            self._policy = self._build()
        return self._policy

    @property
    def built(self) -> bool:
        return self._policy is not None

    def close(self) -> None:
        close = getattr(getattr(self._policy, "engine", None), "close", None)
        if close is not None:
            close()


def _file_identity(path: Path | None) -> dict[str, Any] | None:
    """A checkpoint as a cache key: its path under the run root, size and modification time (hashing a
    2 GB file each time would cost more than it saves; a retrained checkpoint has a new time)."""
    if path is None:
        return None
    stat = path.stat()
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _slug(label: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in label).strip("-").lower()


# ------------------------------------------------------------------------------------------- the matrix
def _seed_result(report: EvalReport, harness: str, seed: int) -> SeedResult:
    stats = report.by_harness[harness]
    return SeedResult(
        seed=seed,
        reward=stats.mean_reward,
        rollouts=stats.rollouts,
        failed=stats.failed,
        results=report.cached_from or str(report.results_path),
    )


def aggregate(cell: Cell) -> Cell:
    """before/after means over the seeds both have; noise as in the learning test."""
    before = {r.seed: r.reward for r in cell.before}
    if cell.arm == UNTRAINED:
        values = list(before.values())
        cell.seeds = len(values)
        cell.before_mean = float(np.mean(values)) if values else None
        cell.noise = float(np.std(values, ddof=1)) if len(values) > 1 else None
        return cell
    pairs = [(before[r.seed], r.reward) for r in cell.after if r.seed in before]
    cell.seeds = len(pairs)
    if not pairs:
        return cell
    starts = np.array([p[0] for p in pairs])
    ends = np.array([p[1] for p in pairs])
    gains = ends - starts
    cell.before_mean, cell.after_mean, cell.gain_mean = float(starts.mean()), float(ends.mean()), float(gains.mean())
    if len(pairs) > 1:
        cell.noise = float(max(starts.std(ddof=1), gains.std(ddof=1)))
        cell.improved = bool(cell.gain_mean > 0 and cell.gain_mean > cell.noise)
    return cell


def mixed_vs_single(cells: dict[str, dict[str, Cell]]) -> dict[str, dict[str, float | None]]:
    """Per harness of the mixed arm: its gain there against the single-harness arm's (noises added in quadrature)."""
    out: dict[str, dict[str, float | None]] = {}
    for mixed, harnesses in ARMS.items():
        if len(harnesses) < 2 or mixed not in cells:
            continue
        for h in harnesses:
            m, s = cells[mixed].get(h), cells.get(h, {}).get(h)
            if m is None or s is None or m.gain_mean is None or s.gain_mean is None:
                out[h] = {"mixed_gain": None, "single_gain": None, "difference": None, "noise": None}
                continue
            noise = float(np.hypot(m.noise or 0.0, s.noise or 0.0))
            out[h] = {
                "mixed_gain": m.gain_mean,
                "single_gain": s.gain_mean,
                "difference": m.gain_mean - s.gain_mean,
                "noise": noise,
            }
    return out


def run_matrix(settings: MatrixSettings, out: Path, *, plan_only: bool = False) -> MatrixReport:
    """Train what is missing, evaluate what is not cached, and write matrix.json / .txt / .png.

    With `plan_only` nothing runs: the report holds what is on disk and marks the rest "to run"."""
    unknown = [a for a in settings.arms if a not in ARMS] + [
        h for h in settings.eval_harnesses if h not in EVAL_HARNESSES
    ]
    if unknown:
        raise ValueError(f"unknown arm or harness {unknown}; arms: {list(ARMS)}, harnesses: {EVAL_HARNESSES}")
    if not settings.seeds:
        raise ValueError("at least one seed is needed (two or more for a noise estimate)")
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cache = EvalCache(out / "eval-cache")
    cells = {UNTRAINED: {h: Cell(arm=UNTRAINED, harness=h) for h in settings.eval_harnesses}}
    cells |= {arm: {h: Cell(arm=arm, harness=h) for h in settings.eval_harnesses} for arm in settings.arms}
    report = MatrixReport(settings=settings, model="", recipe=[], cells=cells)
    for seed in settings.seeds:
        base_cfg = None
        for arm in settings.arms:
            run_dir = out / "train" / f"{_slug(arm)}-seed{seed}"
            if plan_only and not (run_dir / "summary.json").is_file():
                continue
            if plan_only:
                from trainers.main import compose

                cfg = compose(arm_overrides(arm, seed, run_dir, settings))
            else:
                cfg, record = train_arm(arm, seed, out, settings)
                report.training.append(record)
            base_cfg = base_cfg or cfg
            checkpoint = run_dir / "checkpoints" / "latest.pt"
            trained = _evaluate(cfg, checkpoint, seed, f"trained in {arm}", out, settings, cache, report, plan_only)
            for h, result in trained.items():
                if result is not None:
                    cells[arm][h].after.append(_seed_result(result, h, seed))
        if base_cfg is None:
            from trainers.main import compose

            base_cfg = compose(arm_overrides(settings.arms[0], seed, out / "train" / "untrained", settings))
        untrained = _evaluate(base_cfg, None, seed, UNTRAINED, out, settings, cache, report, plan_only)
        for h, found in untrained.items():
            if found is not None:
                result = _seed_result(found, h, seed)
                cells[UNTRAINED][h].before.append(result)
                for arm in settings.arms:
                    cells[arm][h].before.append(result)
        report.model = base_cfg.model.name
        report.recipe = arm_overrides("Pi", seed, Path("<run_dir>"), settings)
    for row in cells.values():
        for cell in row.values():
            aggregate(cell)
    report.mixed_vs_single = mixed_vs_single(cells)
    report.wall_s = time.perf_counter() - start
    save(report, out)
    return report


def _evaluate(
    cfg: Any,
    checkpoint: Path | None,
    seed: int,
    label: str,
    out: Path,
    settings: MatrixSettings,
    cache: EvalCache,
    report: MatrixReport,
    plan_only: bool,
) -> dict[str, EvalReport | None]:
    if plan_only and checkpoint is not None and not checkpoint.is_file():
        return {}
    results = evaluate_policy(cfg, checkpoint, seed, label, out, settings, cache, plan_only)
    for result in results.values():
        if result is not None and result.cached_from:
            report.evaluations_reused += 1
        elif result is not None:
            report.evaluations_measured += 1
    return results


def save(report: MatrixReport, out: Path) -> None:
    (out / "matrix.json").write_text(report.model_dump_json(indent=2))
    (out / "matrix.txt").write_text(report.text())
    plot_matrix(report, out / "matrix.png")


def plot_matrix(report: MatrixReport, path: Path) -> Path:
    """One panel per evaluation harness: each arm's gain (after - before) with its noise as the error bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    harnesses = report.settings.eval_harnesses
    arms = [a for a in report.cells if a != UNTRAINED]
    fig, axes = plt.subplots(1, len(harnesses), figsize=(4 * len(harnesses), 3.6), sharey=True, squeeze=False)
    for ax, h in zip(axes[0], harnesses):
        gains = [report.cells[a][h].gain_mean for a in arms]
        noise = [report.cells[a][h].noise or 0.0 for a in arms]
        x = np.arange(len(arms))
        ax.bar(
            x,
            [g if g is not None else 0.0 for g in gains],
            yerr=noise,
            capsize=4,
            color=["tab:blue" if a != h else "tab:orange" for a in arms],
        )
        for xi, g in zip(x, gains):
            if g is None:
                ax.text(xi, 0.0, "to run", ha="center", va="bottom", fontsize=7, rotation=90)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(x, arms, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"evaluated in {h}", fontsize=10)
    axes[0][0].set_ylabel("held-out reward gain (± noise)")
    fig.suptitle(f"{SUITE}: GRPO transfer ({report.model}); orange = trained in the same harness", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> MatrixReport:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs") / "transfer-matrix")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--eval-harnesses", nargs="+", default=EVAL_HARNESSES, choices=EVAL_HARNESSES)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--quick", action="store_true", help="tiny random model, 1 step, 1 task (plumbing check)")
    parser.add_argument("--plan", action="store_true", help="run nothing: show what is done and what is left")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every arm (after --)")
    args = parser.parse_args(argv)
    settings = MatrixSettings(
        arms=args.arms, eval_harnesses=args.eval_harnesses, seeds=args.seeds, quick=args.quick, overrides=args.overrides
    )
    report = run_matrix(settings, args.out, plan_only=args.plan)
    print(report.text())
    print(
        f"evaluations measured {report.evaluations_measured}, reused {report.evaluations_reused}; "
        f"trained {sum(r.trained_now for r in report.training)}, reused {sum(not r.trained_now for r in report.training)}"
    )
    print(f"matrix: {args.out / 'matrix.json'}  table: {args.out / 'matrix.txt'}  plot: {args.out / 'matrix.png'}")
    return report


if __name__ == "__main__":
    main()
