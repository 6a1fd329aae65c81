"""Does training in one harness improve another? Train GRPO in each arm, evaluate every policy in every harness.

    .venv/bin/python -m benchmarks.transfer_matrix --out runs/matrix            # full size (hours; resumable)
    .venv/bin/python -m benchmarks.transfer_matrix --out runs/matrix --arms OpenClaw --seeds 0   # one arm, one seed
    .venv/bin/python -m benchmarks.transfer_matrix --out runs/matrix --plan -- OVERRIDES   # what is done, what is left
    .venv/bin/python -m benchmarks.transfer_matrix --quick --out runs/matrix-quick   # tiny model, 1 step (plumbing)
    .venv/bin/python -m benchmarks.transfer_matrix --suite OfficeQAEasy --arms ClaudeCode --eval-harnesses ClaudeCode \
        --transfer-suites --out runs/matrix-officeqaeasy   # another suite: its own evidence file and table

Arms (how the policy is trained): the white-box loop, OpenClaw, Claude Code and OpenClaw + Claude Code in one
batch (the article's), with pi, pi + Claude Code and variants of one arm on request (`VARIANTS`: Claude Code
trained with PPO, `ClaudeCode-PPO`, the article's PPO against GRPO; `ClaudeCode-DS` / `OpenClaw-DS` with
dynamic sampling). Every arm trains with the main job's learning
recipe (`trainers.main_job`) from the same untrained policy, once per seed, on the same training budget: two
GRPO groups of 8 rollouts per step (a mixed arm: one group per harness). Every trained policy and the
untrained one are evaluated on the same held-out ClawGymBench tasks (one suite seed for all; 16 tasks x 4
rollouts) through each evaluation harness at the recipe's sampling temperature, and on a suite no arm
trains on (PinchBench level 0 by default, `--transfer-suites`).

Evidence: every rollout, of training and of evaluation, is one `evaluation.evidence.EvidenceRow` in
`<out>/evidence.jsonl.gz` (`--publish DIR` merges it into DIR/transfer_matrix.jsonl.gz, where
`benchmarks.experiment_report` reads it for the docs). A cell (arm x evaluation harness) is the gain from
the untrained policy to the trained one, paired by seed and task, with a 95 % interval from
`evaluation.gains` (a bootstrap over seeds, tasks and rollouts) and its Bonferroni interval for the number
of cells in the table.

Resuming: a training run whose directory holds a finished summary with the same config is not run again
(an unfinished one continues from its newest checkpoint, saved after every step), and an evaluation whose key
(policy, checkpoint, tasks, seeds, harness) is in `<out>/eval-cache` is read back. So the matrix can be filled
over several sessions, arm by arm (`--arms`) and seed by seed (`--seeds`); cells not yet run show as "to run".
Output: <out>/matrix.json, matrix.txt (the table), matrix.png (gains with intervals) and evidence.jsonl.gz.
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

from benchmarks.learning_curve import finished_summary, same_config
from evaluation import EvalCache, EvalReport, cached_evaluation, evaluate
from evaluation.evidence import UNTRAINED, EvidenceRow, publish_rows, read_rows, rows_from_report, write_rows
from evaluation.gains import Estimate, difference, gain

SUITE = "ClawGymBench"
EXPERIMENT = "transfer_matrix"
ARMS: dict[str, list[str]] = {
    "WhiteBox": ["WhiteBox"],
    "OpenClaw": ["OpenClaw"],
    "ClaudeCode": ["ClaudeCode"],
    "OpenClaw+ClaudeCode": ["OpenClaw", "ClaudeCode"],
    "Pi": ["Pi"],
    "Pi+ClaudeCode": ["Pi", "ClaudeCode"],
    "ClaudeCode-PPO": ["ClaudeCode"],
    "ClaudeCode-DS": ["ClaudeCode"],
    "OpenClaw-DS": ["OpenClaw"],
}
"""Training arms: the harnesses of one training batch."""


class Variant(BaseModel):
    """An arm that is another arm with one change, compared with it in the generated claims."""

    base: str
    overrides: list[str]
    claim: str  # the statement the comparison tests ({h}: the harness)
    name: str  # what the variant is called in the claim ("PPO")
    base_name: str  # and the arm it is compared with ("GRPO")


EXTRA_GROUPS = 4
VARIANTS: dict[str, Variant] = {
    # the article: PPO and GRPO through Claude Code both train stably and end close (same budget). The critic
    # is a value head on the frozen base model's features: training a second 0.5B trunk (and its optimizer
    # state) would about double the update, the longest part of a step on two cores.
    "ClaudeCode-PPO": Variant(
        base="ClaudeCode",
        overrides=["algorithm=ppo", "algorithm.train_critic_trunk=false"],
        claim="PPO and GRPO both train through {h} and end close",
        name="PPO",
        base_name="GRPO",
    ),
    # issue #32: where the start is low most groups score all alike; dynamic sampling draws up to
    # EXTRA_GROUPS more groups per step until one differs. More rollouts than the base arm: the signal table
    # shows how many, and how many of the extra groups had differing rewards.
    **{
        f"{h}-DS": Variant(
            base=h,
            overrides=[f"env.extra_groups={EXTRA_GROUPS}"],
            claim="Dynamic sampling gives {h} more to learn from",
            name="dynamic sampling",
            base_name="plain GRPO",
        )
        for h in ("ClaudeCode", "OpenClaw")
    },
}
DEFAULT_ARMS = ["WhiteBox", "OpenClaw", "ClaudeCode", "OpenClaw+ClaudeCode"]
EVAL_HARNESSES = ["WhiteBox", "OpenClaw", "ClaudeCode", "Pi"]
DEFAULT_EVAL_HARNESSES = ["WhiteBox", "OpenClaw", "ClaudeCode"]
DEFAULT_SEEDS = [0, 1, 2, 3]
TRANSFER_SUITES = ["PinchBench"]
"""Suites no arm trains on, evaluated like the training suite (level 0, 16 tasks x 4): transfer to a new
distribution, as the article measures it (its held-out benchmark was PinchBench)."""
GROUPS_PER_STEP = 2
"""GRPO groups per training step in every arm (a mixed arm of two harnesses: one each): equal budgets."""
EVAL_REPEATS = 4
"""Rollouts per held-out task: 16 tasks x 4 = 64 per evaluation."""
HARNESS_OPTIONS: dict[str, dict[str, str]] = {"OpenClaw": {"api_style": "openai-chat"}}
"""Adapter options of a harness wherever it runs: in the arms that train through it, in its evaluation column
and in the starting rewards (arms that do not train through it keep their configs). OpenClaw speaks the chat
completions API here: that transport moves the line with the run's session id out of the system prompt, so
a group's rollouts share ~7.6k of their ~7.8k prompt tokens (5k with the responses API), which the engine
can prefill and the trainer pack once per group (the sharing, and what a seed costs to train this way, are in
the results log)."""
QUICK = ["steps=1", "env.train_tasks=1", "env.eval_tasks=1", "eval.repeats=1", "env.options.max_new_tokens=8"]
"""On top of the main job's --quick preset (tiny random model): one step on one task, one held-out task."""


class MatrixSettings(BaseModel):
    suite: str = SUITE  # trained on, and held out from (level 0)
    arms: list[str] = Field(default_factory=lambda: list(DEFAULT_ARMS))
    eval_harnesses: list[str] = Field(default_factory=lambda: list(DEFAULT_EVAL_HARNESSES))
    seeds: list[int] = Field(default_factory=lambda: list(DEFAULT_SEEDS))
    transfer_suites: list[str] = Field(default_factory=lambda: list(TRANSFER_SUITES))  # never trained on
    quick: bool = False
    skip_untrained: bool = False  # evaluate trained policies only; untrained ones are read back from the cache
    overrides: list[str] = Field(default_factory=list)  # extra Hydra overrides for every arm

    @property
    def experiment(self) -> str:
        """The evidence's experiment name (and published file): the matrix's own, or one per other suite."""
        return EXPERIMENT if self.suite == SUITE else f"{EXPERIMENT}_{self.suite}"


class SeedResult(BaseModel):
    seed: int
    reward: float  # held-out mean reward of the policy at this seed in this harness
    rollouts: int
    failed: int
    results: str  # the evaluation's results.json (or cache entry)


class Cell(BaseModel):
    """One arm evaluated in one harness: per-seed before/after and the paired gain with its interval."""

    arm: str
    harness: str
    before: list[SeedResult] = Field(default_factory=list)
    after: list[SeedResult] = Field(default_factory=list)
    before_mean: float | None = None
    after_mean: float | None = None
    gain: Estimate | None = None  # None: no seed has both before and after yet

    @property
    def seeds(self) -> int:
        return self.gain.seeds if self.gain is not None else len(self.before if self.arm == UNTRAINED else self.after)

    def text(self) -> str:
        if self.arm == UNTRAINED:
            return "to run" if self.before_mean is None else f"{self.before_mean:.3f} (n={len(self.before)})"
        if self.gain is None and self.after:  # the trained policy measured, its untrained pair not (yet)
            return f"after {np.mean([r.reward for r in self.after]):.3f} (n={len(self.after)}); untrained to run"
        if self.gain is None:
            return "to run"
        g = self.gain
        verdict = "shown" if g.shown else "not shown"
        return (
            f"{self.before_mean:.3f}→{self.after_mean:.3f} ({g.value:+.3f} [{g.low:+.3f}, {g.high:+.3f}] "
            f"{verdict}, n={g.seeds})"
        )


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
    comparisons: int = 0  # gain cells with data: the Bonferroni intervals are for this many claims
    mixed_vs_single: dict[str, dict[str, Estimate]] = Field(default_factory=dict)  # mixed arm -> harness -> diff
    training: list[TrainingRecord] = Field(default_factory=list)
    evaluations_measured: int = 0  # evaluations run by this invocation (the rest came from the cache)
    evaluations_reused: int = 0
    evidence: str | None = None  # the per-rollout file every number here is computed from
    wall_s: float = 0.0

    def table(self) -> Table:
        table = Table(
            title=f"{self.settings.suite} transfer matrix: {self.model}, GRPO (PPO where the arm says so); held-out reward before→after "
            f"(gain [95 % interval], n=seeds; {self.comparisons} comparisons)"
        )
        table.add_column("trained in", no_wrap=True)
        for h in self.settings.eval_harnesses:
            table.add_column(f"evaluated in {h}", justify="right", no_wrap=True)
        for arm, row in self.cells.items():
            table.add_row(arm, *(row[h].text() for h in self.settings.eval_harnesses))
        return table

    def text(self, width: int = 220) -> str:
        console = Console(width=width, record=True, file=_Null())
        console.print(self.table())
        for mixed, by_harness in self.mixed_vs_single.items():
            for h, d in by_harness.items():
                console.print(
                    f"{mixed} vs {h} alone, in {h}: difference of gains {d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
                    f" ({'shown' if d.shown else 'no difference detectable'}, n={d.seeds})"
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
    overrides.append("env.ids=[" + ",".join(f"{settings.suite}-{h}" for h in harnesses) + "]")
    overrides += [f"env.tasks_per_step={GROUPS_PER_STEP // len(harnesses)}", f"eval.repeats={EVAL_REPEATS}"]
    if arm in VARIANTS:
        overrides += VARIANTS[arm].overrides
    if settings.quick:
        overrides += QUICK
    return [
        *overrides,
        *(f"++env.harness_options.{h}.{k}={v}" for h in harnesses for k, v in HARNESS_OPTIONS.get(h, {}).items()),
        f"seed={seed}",
        "env.suite_seed=0",
        "eval.at_start=false",
        "checkpoint.resume=auto",
        "checkpoint.every=1",  # a step can take 17 min here and an adapter checkpoint is 13 MB: a stop loses one step
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
    if not done and (run_dir / "config.json").is_file() and not same_config(run_dir, cfg):
        raise RuntimeError(
            f"{run_dir} holds a run of {arm} (seed {seed}) started with another config; continuing it would mix "
            "two recipes in one run: move it away to train this arm afresh"
        )
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


def evaluation_env_overrides(cfg: Any, env_id: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """An evaluation's env options with its harness's adapter options: `HARNESS_OPTIONS`, then what the arm's
    `env.harness_options` says (the experiment's overrides, the same in every arm's config), so a column is
    evaluated alike for every arm, whether or not the arm trained through that harness."""
    adapter = {
        **HARNESS_OPTIONS.get(env_id.rsplit("-", 1)[-1], {}),
        **cfg.env.options_for(env_id).get("harness_options", {}),
    }
    return overrides | ({"harness_options": adapter} if adapter else {})


def evaluate_policy(
    cfg: Any,
    checkpoint: Path | None,
    seed: int,
    label: str,
    out: Path,
    settings: MatrixSettings,
    cache: EvalCache,
    plan_only: bool = False,
) -> dict[tuple[str, str], EvalReport | None]:
    """One policy (untrained, or a checkpoint) on the held-out tasks of the training suite and of each
    transfer suite, through each evaluation harness: one cached evaluation per (suite, harness), so cells
    fill independently; the model is loaded only if one is missing. With `plan_only`, only read back
    (None where missing)."""
    from clawgym_cli.compare import build_policy

    common = _evaluation_arguments(cfg, checkpoint, seed)
    reports: dict[tuple[str, str], EvalReport | None] = {}
    policy = LazyPolicy(lambda: build_policy(cfg.model_copy(update={"seed": seed}), checkpoint))
    try:
        for suite, h in ((s, h) for s in [settings.suite, *settings.transfer_suites] for h in settings.eval_harnesses):
            env_ids = [f"{suite}-{h}"]
            args = dict(common, env_overrides=evaluation_env_overrides(cfg, env_ids[0], common["env_overrides"]))
            if plan_only:
                reports[suite, h] = cached_evaluation(env_ids, cache=cache, **args)
                continue
            name = f"{_slug(label)}-seed{seed}-{_slug(h)}" + ("" if suite == settings.suite else f"-{_slug(suite)}")
            run_dir = out / "eval" / name
            reports[suite, h] = evaluate(
                policy,
                env_ids,
                run_dir=run_dir,
                model_name=f"{cfg.model.name}: {label}",
                progress=False,
                cache=cache,
                concurrency=cfg.eval.concurrency,
                **args,
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


def aggregate(cell: Cell, rows: list[EvidenceRow], comparisons: int, suite: str = SUITE) -> Cell:
    """Means over the seeds measured; the paired gain and its intervals from the evidence rows."""
    if cell.arm == UNTRAINED:
        cell.before_mean = float(np.mean([r.reward for r in cell.before])) if cell.before else None
        return cell
    paired = {r.seed for r in cell.before} & {r.seed for r in cell.after}
    if not paired:
        return cell
    cell.before_mean = float(np.mean([r.reward for r in cell.before if r.seed in paired]))
    cell.after_mean = float(np.mean([r.reward for r in cell.after if r.seed in paired]))
    cell.gain = gain(rows, cell.arm, cell.harness, comparisons=comparisons, suite=suite)
    return cell


def mixed_vs_single(
    cells: dict[str, dict[str, Cell]], rows: list[EvidenceRow], comparisons: int, suite: str = SUITE
) -> dict[str, dict[str, Estimate]]:
    """Per mixed arm and each of its harnesses: its gain there minus the single-harness arm's (paired)."""
    out: dict[str, dict[str, Estimate]] = {}
    for mixed, harnesses in ARMS.items():
        if len(harnesses) < 2 or mixed not in cells:
            continue
        for h in harnesses:
            m, single = cells[mixed].get(h), cells.get(h, {}).get(h)
            if m is None or single is None or m.gain is None or single.gain is None:
                continue
            out.setdefault(mixed, {})[h] = difference(rows, mixed, h, h, comparisons=comparisons, suite=suite)
    return out


def run_matrix(
    settings: MatrixSettings, out: Path, *, plan_only: bool = False, publish: Path | None = None
) -> MatrixReport:
    """Train what is missing, evaluate what is not cached, and write matrix.json / .txt / .png and the
    evidence file (also to `publish`/transfer_matrix.jsonl.gz when given).

    With `plan_only` nothing runs: the report holds what is on disk and marks the rest "to run"."""
    unknown = [a for a in settings.arms if a not in ARMS] + [
        h for h in settings.eval_harnesses if h not in EVAL_HARNESSES
    ]
    if unknown:
        raise ValueError(f"unknown arm or harness {unknown}; arms: {list(ARMS)}, harnesses: {EVAL_HARNESSES}")
    from clawgym_env import registry

    if settings.suite not in registry.suites:
        raise ValueError(f"unknown suite {settings.suite!r}; registered suites: {sorted(registry.suites)}")
    if not settings.seeds:
        raise ValueError("at least one seed is needed (four or more for an interval over seeds)")
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cache = EvalCache(out / "eval-cache")
    cells = {UNTRAINED: {h: Cell(arm=UNTRAINED, harness=h) for h in settings.eval_harnesses}}
    cells |= {arm: {h: Cell(arm=arm, harness=h) for h in settings.eval_harnesses} for arm in settings.arms}
    report = MatrixReport(settings=settings, model="", recipe=[], cells=cells)
    evidence: list[EvidenceRow] = []
    for seed in settings.seeds:
        base_cfg = None
        for arm in settings.arms:
            run_dir = out / "train" / f"{_slug(arm)}-seed{seed}"
            if plan_only and not (run_dir / "summary.json").is_file():
                # an unfinished run: its steps so far, no evaluation
                evidence += training_rows(run_dir, arm, settings.experiment)
                continue
            if plan_only:
                from trainers.main import compose

                cfg = compose(arm_overrides(arm, seed, run_dir, settings))
            else:
                cfg, record = train_arm(arm, seed, out, settings)
                report.training.append(record)
            evidence += training_rows(run_dir, arm, settings.experiment)
            base_cfg = base_cfg or cfg
            checkpoint = run_dir / "checkpoints" / "latest.pt"
            trained = _evaluate(cfg, checkpoint, seed, f"trained in {arm}", out, settings, cache, report, plan_only)
            for (suite, h), result in trained.items():
                if result is not None:
                    evidence += _rows(result, settings.experiment, arm, "after", seed, checkpoint, out)
                    if suite == settings.suite:
                        cells[arm][h].after.append(_seed_result(result, h, seed))
        if base_cfg is None:
            from trainers.main import compose

            base_cfg = compose(arm_overrides(settings.arms[0], seed, out / "train" / "untrained", settings))
        untrained = _evaluate(
            base_cfg, None, seed, UNTRAINED, out, settings, cache, report, plan_only or settings.skip_untrained
        )
        for (suite, h), found in untrained.items():
            if found is not None:
                evidence += _rows(found, settings.experiment, UNTRAINED, "before", seed, None, out)
                if suite != settings.suite:
                    continue
                result = _seed_result(found, h, seed)
                cells[UNTRAINED][h].before.append(result)
                for arm in settings.arms:
                    cells[arm][h].before.append(result)
        report.model = base_cfg.model.name
        report.recipe = arm_overrides(settings.arms[0], seed, Path("<run_dir>"), settings, training=True)
    report.comparisons = sum(
        1 for arm in settings.arms for h in settings.eval_harnesses if cells[arm][h].before and cells[arm][h].after
    )
    for row in cells.values():
        for cell in row.values():
            aggregate(cell, evidence, max(1, report.comparisons), settings.suite)
    report.mixed_vs_single = mixed_vs_single(cells, evidence, max(1, report.comparisons), settings.suite)
    report.evidence = str(write_rows(out / "evidence.jsonl.gz", evidence))
    if publish is not None:
        publish_rows(publish / f"{settings.experiment}.jsonl.gz", evidence)  # merged: earlier sessions' rows stay
    report.wall_s = time.perf_counter() - start
    save(report, out)
    return report


def _rows(
    report: EvalReport, experiment: str, arm: str, phase: str, seed: int, checkpoint: Path | None, out: Path
) -> list[EvidenceRow]:
    where = str(checkpoint.relative_to(out)) if checkpoint is not None else None
    return rows_from_report(
        report,
        experiment=experiment,
        arm=arm,
        phase=phase,
        seed=seed,
        checkpoint=where,
        commit=report.commit or "unknown",
    )


def training_rows(run_dir: Path, arm: str, experiment: str = EXPERIMENT) -> list[EvidenceRow]:
    """The arm's training rollouts at one seed (the trainer's rollouts.jsonl), named as the matrix names them."""
    log = run_dir / "rollouts.jsonl"
    if not log.is_file():
        return []
    return [r.model_copy(update={"experiment": experiment, "arm": arm}) for r in read_rows(log)]


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
) -> dict[tuple[str, str], EvalReport | None]:
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
    """One panel per evaluation harness: each arm's gain with its 95 % interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    harnesses = report.settings.eval_harnesses
    arms = [a for a in report.cells if a != UNTRAINED]
    fig, axes = plt.subplots(1, len(harnesses), figsize=(4 * len(harnesses), 3.6), sharey=True, squeeze=False)
    for ax, h in zip(axes[0], harnesses):
        gains = [report.cells[a][h].gain for a in arms]
        values = np.array([g.value if g else 0.0 for g in gains])
        spans = np.array([[g.value - g.low, g.high - g.value] if g else [0.0, 0.0] for g in gains]).T
        x = np.arange(len(arms))
        colours = ["tab:orange" if h in ARMS[a] else "tab:blue" for a in arms]
        ax.bar(x, values, yerr=spans, capsize=4, color=colours)
        for xi, g in zip(x, gains):
            if g is None:
                ax.text(xi, 0.0, "to run", ha="center", va="bottom", fontsize=7, rotation=90)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(x, arms, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"evaluated in {h}", fontsize=10)
    axes[0][0].set_ylabel("held-out reward gain (95 % interval)")
    fig.suptitle(
        f"{report.settings.suite}: GRPO transfer ({report.model}); orange = trained in that harness", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> MatrixReport:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs") / "transfer-matrix")
    parser.add_argument(
        "--suite",
        default=SUITE,
        help="the suite every arm trains on and is held out from (level 0); another than "
        f"{SUITE} publishes to DIR/{EXPERIMENT}_<suite>.jsonl.gz",
    )
    parser.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS))
    parser.add_argument("--eval-harnesses", nargs="+", default=DEFAULT_EVAL_HARNESSES, choices=EVAL_HARNESSES)
    parser.add_argument("--seeds", nargs="+", type=int, default=DEFAULT_SEEDS)
    parser.add_argument(
        "--transfer-suites", nargs="*", default=TRANSFER_SUITES, help="suites no arm trains on (none: give no value)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny random model, 1 step, 1 task (plumbing check)")
    parser.add_argument("--plan", action="store_true", help="run nothing: show what is done and what is left")
    parser.add_argument(
        "--skip-untrained",
        action="store_true",
        help="evaluate the trained policies only: with --publish they pair by seed with the untrained rows "
        "already published (untrained evaluations in the cache are still read back)",
    )
    parser.add_argument("--publish", type=Path, help="merge the evidence into DIR/transfer_matrix.jsonl.gz")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every arm (after --)")
    args = parser.parse_args(argv)
    settings = MatrixSettings(
        suite=args.suite,
        arms=args.arms,
        eval_harnesses=args.eval_harnesses,
        seeds=args.seeds,
        transfer_suites=args.transfer_suites,
        quick=args.quick,
        skip_untrained=args.skip_untrained,
        overrides=args.overrides,
    )
    report = run_matrix(settings, args.out, plan_only=args.plan, publish=args.publish)
    print(report.text())
    print(
        f"evaluations measured {report.evaluations_measured}, reused {report.evaluations_reused}; "
        f"trained {sum(r.trained_now for r in report.training)}, reused {sum(not r.trained_now for r in report.training)}"
    )
    print(f"matrix: {args.out / 'matrix.json'}  table: {args.out / 'matrix.txt'}  evidence: {report.evidence}")
    if args.plan and not report.evaluations_reused and any((args.out / "eval-cache").glob("*.json")):
        print(
            f"none of the evaluations in {args.out / 'eval-cache'} match this plan: pass --out and the overrides "
            "exactly as the run did (the engine's options and the checkpoints' paths key the cache)"
        )
    return report


if __name__ == "__main__":
    main()
