"""Evaluate a policy on environments (suite x harness): every held-out task, `repeats` times, in parallel.

    from benchmarks.evaluation import evaluate
    report = evaluate(policy, ["ClawGymBench-WhiteBox", "ClawGymBench-Pi"], split="test", level=0, count=8)
    report.console_print()                      # rich tables: per env, per category, per harness
    report.results_path, report.plot_path       # results.json (rows + aggregates) and eval.png

Command line: `clawgym evaluate ClawGymBench-WhiteBox --model qwen2.5-coder-0.5b --level 0 --count 8`.

Statistics (the same for every group: env, env x category, harness, suite):
- mean reward over rollouts; a failed rollout counts as reward 0 (as `env.step` returns it) unless
  `failed_as_zero=False`, which leaves failed rollouts out of the reward and success statistics;
- success rate: the share of rollouts with reward >= `success_threshold` (default 1.0);
- 95% confidence intervals by a **percentile bootstrap over tasks** (cluster bootstrap: tasks are drawn
  with replacement, each with all its repeats, 2000 resamples, fixed seed), so repeats of one task are not
  treated as independent samples. Fewer than two tasks in a group gives no interval (shown as "-");
- failures counted by the stage that failed (sandbox, route, harness, timeout, verifier, reconstruct, rollout).
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
from pydantic import BaseModel, Field
from rich.console import Console, Group
from rich.table import Table

from clawgym_env.interfaces import Policy
from clawgym_env.specs import TaskSpec, resolve_callable

CI_METHOD = "percentile bootstrap over tasks (tasks resampled with all their repeats), 2000 resamples, 95%"
N_RESAMPLES = 2000
CI_LEVEL = 0.95

PolicySource = Policy | Callable[[TaskSpec], Policy]
"""One policy for every rollout, or a factory giving each rollout its own (e.g. per-task scripted doubles)."""


# ---------------------------------------------------------------------------------------------- models
class EvalRow(BaseModel):
    """One rollout's outcome."""

    env_id: str
    suite: str
    harness: str
    task_id: str
    category: str = "-"
    level: int | None = None
    repeat: int = 0
    reward: float
    success: bool
    status: str = "ok"  # "ok" | "failed" | "empty"
    failure_stage: str | None = None
    failure_reason: str | None = None
    subscores: dict[str, float] = Field(default_factory=dict)
    num_calls: int = 0
    generated_tokens: int = 0
    wall_s: float = 0.0
    rollout_id: str = ""


class Interval(BaseModel):
    low: float
    high: float


class GroupStats(BaseModel):
    """Aggregates of one group of rows (an env, an env's category, a harness, a suite)."""

    rollouts: int
    tasks: int
    mean_reward: float
    reward_ci: Interval | None = None
    success_rate: float
    success_ci: Interval | None = None
    failed: int = 0
    failures: dict[str, int] = Field(default_factory=dict)  # stage -> count
    mean_calls: float = 0.0
    mean_wall_s: float = 0.0


class EvalConfig(BaseModel):
    model: str = "policy"
    env_ids: list[str]
    split: str = "test"
    repeats: int = 1
    concurrency: int = 2
    level: int | None = None
    count: int | None = None
    seed: int = 0
    success_threshold: float = 1.0
    failed_as_zero: bool = True
    ci_method: str = CI_METHOD


class SavedReport(BaseModel):
    """A report shown as rich tables and saved as JSON + plain-text tables + a plot (eval and comparison).

    Subclasses say what to draw (`tables`, `_plot`) and the file names (`FILES`: json, text, plot).
    """

    FILES: ClassVar[tuple[str, str, str]] = ("results.json", "table.txt", "plot.png")
    results_path: str | None = None
    plot_path: str | None = None
    table_path: str | None = None

    def tables(self) -> list[Table]:
        raise NotImplementedError

    def _plot(self, path: Path) -> Path:
        raise NotImplementedError

    def console_print(self, console: Console | None = None) -> None:
        (console or Console()).print(Group(*self.tables()))

    def text(self, width: int = 140) -> str:
        """The tables as plain text (what the text file holds)."""
        console = Console(record=True, width=width, file=_NullFile())
        self.console_print(console)
        return console.export_text()

    def save(self, directory: str | Path) -> Path:
        """Write the JSON, the text tables and the plot into `directory`; returns the JSON's path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        json_name, text_name, plot_name = self.FILES
        self.results_path = str(directory / json_name)
        self.table_path = str(directory / text_name)
        self.plot_path = str(self._plot(directory / plot_name))
        Path(self.table_path).write_text(self.text())
        Path(self.results_path).write_text(self.model_dump_json(indent=1))
        return Path(self.results_path)

    @classmethod
    def load(cls, path: str | Path) -> Self:
        return cls.model_validate_json(Path(path).read_text())


class EvalReport(SavedReport):
    """Rows and aggregates of one evaluation; `results.json` is this model as JSON."""

    FILES: ClassVar[tuple[str, str, str]] = ("results.json", "table.txt", "eval.png")

    config: EvalConfig
    rows: list[EvalRow]
    by_env: dict[str, GroupStats]
    by_env_category: dict[str, dict[str, GroupStats]]
    by_harness: dict[str, GroupStats]
    by_suite: dict[str, GroupStats]
    failure_reasons: dict[str, dict[str, int]] = Field(default_factory=dict)  # stage -> reason -> count
    wall_s: float = 0.0
    run_dir: str | None = None

    def tables(self) -> list[Table]:
        return [env_table(self), category_table(self), harness_table(self)]

    def _plot(self, path: Path) -> Path:
        return plot_report(self, path)


class _NullFile:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------- statistics
def bootstrap_ci(
    clusters: Sequence[Sequence[float]], *, n_resamples: int = N_RESAMPLES, level: float = CI_LEVEL, seed: int = 0
) -> Interval | None:
    """Percentile bootstrap CI of the overall mean, resampling whole clusters (tasks) with replacement.

    Each cluster holds one task's values (its repeats). The statistic is sum / count over the drawn
    clusters, i.e. the mean over rollouts, which equals the mean of task means when repeats are equal.
    """
    clusters = [list(c) for c in clusters if len(c)]
    if len(clusters) < 2:
        return None
    sums = np.array([sum(c) for c in clusters], dtype=np.float64)
    counts = np.array([len(c) for c in clusters], dtype=np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(clusters), size=(n_resamples, len(clusters)))
    stats = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(stats, [tail, 100 - tail])
    return Interval(low=float(low), high=float(high))


def summarize(rows: Sequence[EvalRow], *, failed_as_zero: bool = True, seed: int = 0) -> GroupStats:
    """Aggregate rows: mean reward, success rate (each with a bootstrap-over-tasks CI), failures by stage."""
    if not rows:
        raise ValueError("cannot summarize an empty group of rows")
    scored = [r for r in rows if failed_as_zero or r.status == "ok"]
    by_task: dict[tuple[str, str], list[EvalRow]] = defaultdict(list)
    for r in scored:
        by_task[(r.env_id, r.task_id)].append(r)
    rewards = [[r.reward for r in rs] for rs in by_task.values()]
    successes = [[1.0 if r.success else 0.0 for r in rs] for rs in by_task.values()]
    failures = Counter(r.failure_stage or r.status for r in rows if r.status != "ok")
    n = len(scored)
    return GroupStats(
        rollouts=len(rows),
        tasks=len({(r.env_id, r.task_id) for r in rows}),
        mean_reward=sum(r.reward for r in scored) / n if n else math.nan,
        reward_ci=bootstrap_ci(rewards, seed=seed),
        success_rate=sum(r.success for r in scored) / n if n else math.nan,
        success_ci=bootstrap_ci(successes, seed=seed),
        failed=sum(failures.values()),
        failures=dict(sorted(failures.items())),
        mean_calls=sum(r.num_calls for r in rows) / len(rows),
        mean_wall_s=sum(r.wall_s for r in rows) / len(rows),
    )


def _grouped(rows: Iterable[EvalRow], key: Callable[[EvalRow], str]) -> dict[str, list[EvalRow]]:
    groups: dict[str, list[EvalRow]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    return dict(groups)


def build_report(rows: Sequence[EvalRow], config: EvalConfig) -> EvalReport:
    """All aggregates of the rows (pure: no files, no rollouts)."""
    if not rows:
        raise ValueError("no rollouts to report: the evaluation produced no rows")
    opts = {"failed_as_zero": config.failed_as_zero, "seed": config.seed}
    order = {env_id: i for i, env_id in enumerate(config.env_ids)}
    by_env_rows = dict(sorted(_grouped(rows, lambda r: r.env_id).items(), key=lambda kv: order.get(kv[0], len(order))))
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    for r in rows:
        if r.status != "ok":
            reasons[r.failure_stage or r.status][(r.failure_reason or "").split("\n", 1)[0][:160]] += 1
    return EvalReport(
        config=config,
        rows=list(rows),
        by_env={env: summarize(rs, **opts) for env, rs in by_env_rows.items()},
        by_env_category={
            env: {cat: summarize(cs, **opts) for cat, cs in sorted(_grouped(rs, lambda r: r.category).items())}
            for env, rs in by_env_rows.items()
        },
        by_harness={h: summarize(rs, **opts) for h, rs in sorted(_grouped(rows, lambda r: r.harness).items())},
        by_suite={s: summarize(rs, **opts) for s, rs in sorted(_grouped(rows, lambda r: r.suite).items())},
        failure_reasons={stage: dict(c.most_common()) for stage, c in sorted(reasons.items())},
    )


# ---------------------------------------------------------------------------------------------- tables and plot
def fmt_mean_ci(mean: float, ci: Interval | None) -> str:
    if math.isnan(mean):
        return "-"
    return f"{mean:.3f} [{ci.low:.2f}, {ci.high:.2f}]" if ci else f"{mean:.3f} [-]"


def _failures_text(stats: GroupStats) -> str:
    return ", ".join(f"{k} {v}" for k, v in stats.failures.items()) or "0"


def env_table(report: EvalReport) -> Table:
    c = report.config
    title = (
        f"{c.model} on split {c.split!r}: {len(report.rows)} rollouts, {c.repeats} repeat(s); "
        f"success = reward >= {c.success_threshold:g}; 95% CI: bootstrap over tasks"
    )
    table = Table(title=title)
    for col in ("env", "rollouts", "tasks", "mean reward [95% CI]", "success rate [95% CI]", "failed", "calls", "wall s"):
        table.add_column(col, justify="left" if col in ("env", "failed") else "right", no_wrap=col != "failed")
    for env, s in report.by_env.items():
        table.add_row(
            env, str(s.rollouts), str(s.tasks), fmt_mean_ci(s.mean_reward, s.reward_ci),
            fmt_mean_ci(s.success_rate, s.success_ci), _failures_text(s), f"{s.mean_calls:.1f}", f"{s.mean_wall_s:.1f}",
        )  # fmt: skip
    return table


def category_table(report: EvalReport) -> Table:
    table = Table(title="per category")
    for col in ("env", "category", "rollouts", "mean reward [95% CI]", "success rate", "failed"):
        table.add_column(col, justify="left" if col in ("env", "category", "failed") else "right", no_wrap=col != "failed")
    for env, cats in report.by_env_category.items():
        for cat, s in cats.items():
            table.add_row(
                env, cat, str(s.rollouts), fmt_mean_ci(s.mean_reward, s.reward_ci), f"{s.success_rate:.3f}", _failures_text(s)
            )
    return table


def harness_table(report: EvalReport) -> Table:
    table = Table(title="per harness (all suites)")
    for col in ("harness", "rollouts", "tasks", "mean reward [95% CI]", "success rate [95% CI]", "failed"):
        table.add_column(col, justify="left" if col in ("harness", "failed") else "right", no_wrap=col != "failed")
    for h, s in report.by_harness.items():
        table.add_row(
            h, str(s.rollouts), str(s.tasks), fmt_mean_ci(s.mean_reward, s.reward_ci),
            fmt_mean_ci(s.success_rate, s.success_ci), _failures_text(s),
        )  # fmt: skip
    return table


def _yerr(stats: Sequence[GroupStats]) -> np.ndarray:
    """Asymmetric error bars (2 x n) from the CIs; 0 where a group has no interval."""
    lows = [s.mean_reward - s.reward_ci.low if s.reward_ci else 0.0 for s in stats]
    highs = [s.reward_ci.high - s.mean_reward if s.reward_ci else 0.0 for s in stats]
    return np.clip(np.array([lows, highs]), 0.0, None)


def plot_report(report: EvalReport, path: str | Path) -> Path:
    """Mean reward with 95% CI bars per env (left) and per category, one bar per env (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(report.by_env)
    categories = sorted({cat for cats in report.by_env_category.values() for cat in cats})
    fig, (ax_env, ax_cat) = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(envs) + 1.2 * len(categories)), 4.2))
    stats = [report.by_env[e] for e in envs]
    x = np.arange(len(envs))
    ax_env.bar(x, [s.mean_reward for s in stats], yerr=_yerr(stats), capsize=4, color="tab:blue", label="mean reward")
    ax_env.plot(x, [s.success_rate for s in stats], "o", color="tab:orange", label="success rate")
    ax_env.set_xticks(x, envs, rotation=20, ha="right")
    ax_env.set_ylim(0, 1.12)
    ax_env.set_ylabel("reward")
    ax_env.set_title("per environment (95% CI)")
    ax_env.legend(loc="upper right", fontsize=8)

    width = 0.8 / max(1, len(envs))
    xc = np.arange(len(categories))
    for i, env in enumerate(envs):
        cats = report.by_env_category.get(env, {})
        means = [cats[c].mean_reward if c in cats else 0.0 for c in categories]
        cat_stats = [cats[c] for c in categories if c in cats]
        err = np.zeros((2, len(categories)))
        present = [j for j, c in enumerate(categories) if c in cats]
        err[:, present] = _yerr(cat_stats)
        ax_cat.bar(xc + i * width - 0.4 + width / 2, means, width, yerr=err, capsize=3, label=env)
    ax_cat.set_xticks(xc, categories, rotation=20, ha="right")
    ax_cat.set_ylim(0, 1.12)
    ax_cat.set_title("per category")
    ax_cat.legend(fontsize=7)
    fig.suptitle(f"{report.config.model}, split {report.config.split}")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- task selection
def select_tasks(env: Any, *, level: int | None = None, count: int | None = None, seed: int = 0) -> list[TaskSpec]:
    """The env's task instances of its split, at `level`, the first `count` of them.

    Bundled loaders take `level`, `count` and `seed` themselves; for a suite whose loader does not (or a
    suite given as a list of tasks) the level is filtered from `metadata["level"]` and `count` cut here.
    """
    suite = env.suite
    accepted: set[str] | None = set()
    if suite.loader is not None:
        params = inspect.signature(resolve_callable(suite.loader)).parameters
        has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        accepted = None if has_var_kw else set(params)
    wanted = {"level": level, "count": count, "seed": seed}
    kwargs = dict(env.options.suite_kwargs)
    for name, value in wanted.items():
        if value is not None and (accepted is None or name in accepted):
            kwargs[name] = value
    tasks = list(suite.load(env.options.split, **kwargs))
    if level is not None and "level" not in kwargs:
        tasks = [t for t in tasks if t.metadata.get("level") == level]
    if count is not None and "count" not in kwargs:
        tasks = tasks[:count]
    if not tasks:
        raise ValueError(
            f"{env.env_spec.id}: no tasks in split {env.options.split!r}"
            + (f" at level {level}" if level is not None else "")
            + f"; suite {suite.name} has splits {list(suite.splits)}"
        )
    return tasks


# ---------------------------------------------------------------------------------------------- running
def _policy_for(source: PolicySource, task: TaskSpec) -> Policy:
    return source if isinstance(source, Policy) else source(task)


def _row(env: Any, task: TaskSpec, repeat: int, result: Any, threshold: float, wall_s: float) -> EvalRow:
    failure = result.failure
    verdict = result.verifier
    return EvalRow(
        env_id=env.env_spec.id,
        suite=env.suite.name,
        harness=env.harness.name,
        task_id=task.id,
        category=str(task.metadata.get("category", "-")),
        level=task.metadata.get("level"),
        repeat=repeat,
        reward=float(result.reward),
        success=result.status == "ok" and float(result.reward) >= threshold,
        status=result.status,
        failure_stage=failure.stage if failure else None,
        failure_reason=failure.reason if failure else None,
        subscores={k: float(v) for k, v in (verdict.subscores if verdict else {}).items()},
        num_calls=len(result.calls),
        generated_tokens=int(result.forest.stats.generated_tokens),
        wall_s=float(result.timings.get("total_s", wall_s)),
        rollout_id=result.rollout_id,
    )


async def _run_jobs(
    jobs: list[tuple[Any, TaskSpec, int]],
    source: PolicySource,
    concurrency: int,
    threshold: float,
    on_done: Callable[[EvalRow], None],
) -> list[EvalRow]:
    """All rollouts, at most `concurrency` at a time; a crash or hang becomes a failed row, never an exception."""
    from clawgym_env.rollout import RolloutFailure, RolloutResult, new_rollout_id
    from clawgym_env.trajectory import TrajectoryForest

    gate = asyncio.Semaphore(concurrency)

    async def one(env: Any, task: TaskSpec, repeat: int) -> EvalRow:
        rollout_id = new_rollout_id()
        async with gate:
            start = time.perf_counter()
            limit = (env.options.rollout_timeout_s or task.timeout_s) + 120  # the last guard; run_rollout has its own
            try:
                policy = _policy_for(source, task)
                result = await asyncio.wait_for(env.arollout(policy, task, rollout_id), timeout=limit)
            except Exception as exc:  # noqa: BLE001 - reported as the row's failure
                reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
                env.runtime.failures.add("rollout", reason)
                result = RolloutResult(
                    rollout_id=rollout_id, task_id=task.id, harness=env.harness.name, status="failed",
                    failure=RolloutFailure(stage="rollout", reason=reason),
                    forest=TrajectoryForest.failed(rollout_id, reason, task_id=task.id),
                )  # fmt: skip
            row = _row(env, task, repeat, result, threshold, time.perf_counter() - start)
        on_done(row)
        return row

    return list(await asyncio.gather(*(one(env, task, r) for env, task, r in jobs)))


def evaluate(
    policy: PolicySource,
    env_ids: Sequence[str],
    *,
    split: str = "test",
    repeats: int = 1,
    concurrency: int = 2,
    level: int | None = None,
    count: int | None = None,
    seed: int = 0,
    run_dir: str | Path | None = None,
    success_threshold: float = 1.0,
    failed_as_zero: bool = True,
    temperature: float | None = None,
    env_overrides: dict[str, Any] | None = None,
    model_name: str | None = None,
    save: bool = True,
    progress: bool = True,
) -> EvalReport:
    """Run every task instance of `split` (or `count` of them) under each env, `repeats` times.

    `policy` is one Policy or a function task -> Policy. `seed` is the suites' generation seed (for
    loaders that take one). `temperature` and `env_overrides` (any EnvOptions field: backend,
    max_calls, rollout_timeout_s, ...) apply to every env. Results go to `run_dir` (default
    `runs/eval-<time>`): results.json, table.txt, eval.png, and the proxy's call log.
    """
    import clawgym_env
    from clawgym_env.env import ClawGymEnv
    from clawgym_env.runtime import Runtime

    if not env_ids:
        raise ValueError("evaluate needs at least one environment id, e.g. ClawGymBench-WhiteBox")
    if repeats < 1 or concurrency < 1:
        raise ValueError(f"repeats and concurrency must be >= 1 (got repeats={repeats}, concurrency={concurrency})")
    if count is not None and count < 1:
        raise ValueError(f"count must be >= 1 or None for the whole split (got {count})")
    if not 0.0 <= success_threshold <= 1.0:
        raise ValueError(f"success_threshold must be in [0, 1] (got {success_threshold})")
    for env_id in env_ids:
        clawgym_env.registry.spec(env_id)  # UnknownEnvironmentError with close matches, before any work

    run_dir = Path(run_dir) if run_dir else Path.cwd() / "runs" / time.strftime("eval-%Y%m%d-%H%M%S")
    overrides: dict[str, Any] = {"split": split, **(env_overrides or {})}
    if temperature is not None:
        overrides["temperature"] = temperature
    runtime = Runtime(run_dir)
    start = time.perf_counter()
    try:
        jobs: list[tuple[Any, TaskSpec, int]] = []
        for env_id in env_ids:
            base = clawgym_env.make(env_id, **overrides)
            env = ClawGymEnv(base.env_spec, base.suite, base.harness, base.options, runtime=runtime)
            tasks = select_tasks(env, level=level, count=count, seed=seed)
            jobs += [(env, task, r) for task in tasks for r in range(repeats)]
        # Start the shared proxy once, before the rollouts race to start it (Runtime.proxy is not locked).
        runtime.run(runtime.proxy())
        rows = _run_with_progress(runtime, jobs, policy, concurrency, success_threshold, progress)
    finally:
        runtime.close()
    name = model_name or (policy.name if isinstance(policy, Policy) else getattr(policy, "name", "policy"))
    config = EvalConfig(
        model=name, env_ids=list(env_ids), split=split, repeats=repeats, concurrency=concurrency, level=level,
        count=count, seed=seed, success_threshold=success_threshold, failed_as_zero=failed_as_zero,
    )  # fmt: skip
    report = build_report(rows, config)
    report.wall_s = time.perf_counter() - start
    report.run_dir = str(run_dir)
    if save:
        report.save(run_dir)
    return report


def _run_with_progress(
    runtime: Any, jobs: list, policy: PolicySource, concurrency: int, threshold: float, show: bool
) -> list[EvalRow]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not show:
        return runtime.run(_run_jobs(jobs, policy, concurrency, threshold, lambda _: None))
    with Progress(
        TextColumn("evaluating"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[last]}"),
        TimeElapsedColumn(), transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("rollouts", total=len(jobs), last="")

        def done(row: EvalRow) -> None:
            bar.update(task, advance=1, last=f"{row.env_id} {row.task_id}: {row.reward:.2f} {row.status}")

        return runtime.run(_run_jobs(jobs, policy, concurrency, threshold, done))


# ---------------------------------------------------------------------------------------------- scripted doubles
_TOOL_NAME = re.compile(r'"name":\s*"([A-Za-z_][\w.-]*)"')
FINAL_MESSAGE = "Done."
WRONG_CONTENT = "this is not the answer\n"


class ScriptedReferencePolicies:
    """A test double standing in for a model: per task, a ScriptedTestEngine that plays a fixed solution.

    `mode="reference"` writes the task's reference files (`metadata["reference"]["files"]`) through the
    harness's own write tool, one call per file, then ends with a final message: reward 1.0 on bundled
    suites. `mode="wrong"` writes the same files with wrong content; `mode="idle"` only answers. The harness
    is recognised from the tool names in the prompt (Write -> Claude Code, exec_command -> Codex, write ->
    pi / OpenClaw / white-box loop), so one factory serves every env. Use: `evaluate(ScriptedReferencePolicies(), ...)`
    or `clawgym evaluate ... --model scripted:reference`.
    """

    MODES = ("reference", "wrong", "idle")

    def __init__(self, mode: str = "reference") -> None:
        if mode not in self.MODES:
            raise ValueError(f"ScriptedReferencePolicies mode must be one of {self.MODES}, got {mode!r}")
        from clawgym_env.engines import load_qwen_tokenizer
        from clawgym_env.proxy import ChatMLRenderer

        self.mode = mode
        self.name = f"scripted:{mode}"
        self.tokenizer = load_qwen_tokenizer()
        self.renderer = ChatMLRenderer(self.tokenizer)

    def files_for(self, task: TaskSpec) -> dict[str, str]:
        from benchmarks.suites import reference_files

        if self.mode == "idle":
            return {}
        files = reference_files(task)
        return files if self.mode == "reference" else {path: WRONG_CONTENT for path in files}

    def __call__(self, task: TaskSpec) -> Policy:
        from clawgym_env.engines import ScriptedTestEngine

        files = list(self.files_for(task).items())
        mount = task.mount_path.rstrip("/")
        state = {"next": 0}

        def script(prompt_text: str) -> str:
            i = state["next"]
            state["next"] += 1
            if i >= len(files):
                return FINAL_MESSAGE
            path, content = files[i]
            return write_tool_call(set(_TOOL_NAME.findall(prompt_text)), f"{mount}/{path}", content, mount)

        engine = ScriptedTestEngine(self.tokenizer, script)
        return Policy(engine=engine, renderer=self.renderer, name=self.name)


def write_tool_call(tool_names: set[str], path: str, content: str, workdir: str) -> str:
    """A Qwen-format tool call writing `content` to `path` with the write tool among `tool_names`."""

    def call(name: str, arguments: dict[str, Any]) -> str:
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"

    if "Write" in tool_names:  # Claude Code
        return call("Write", {"file_path": path, "content": content})
    if "write" in tool_names:  # pi, OpenClaw, the white-box loop
        return call("write", {"path": path, "content": content})
    encoded = base64.b64encode(content.encode()).decode()
    shell = f"mkdir -p \"$(dirname '{path}')\" && printf '%s' '{encoded}' | base64 -d > '{path}'"
    if "exec_command" in tool_names:  # Codex
        return call("exec_command", {"cmd": shell, "workdir": workdir})
    for name in ("bash", "Bash", "exec", "shell"):
        if name in tool_names:
            return call(name, {"command": shell})
    raise ValueError(f"no write or shell tool among the harness's tools {sorted(tool_names)}")


def make_eval_policy(model: str, *, engine: str = "transformers", **engine_options: Any) -> PolicySource:
    """A policy from a model name: a zoo name or path, or `scripted:reference|wrong|idle` (test doubles)."""
    if model.startswith("scripted:"):
        return ScriptedReferencePolicies(model.split(":", 1)[1])
    from clawgym_env.policies import make_policy

    return make_policy(model, engine=engine, name=Path(model).name if "/" in model else model, **engine_options)


# ---------------------------------------------------------------------------------------------- command
def evaluate_cli(
    env_ids: Sequence[str],
    model: str = "tiny-qwen3",
    repeats: int = 1,
    split: str = "test",
    level: int | None = None,
    count: int | None = None,
    concurrency: int = 2,
    out: str | Path | None = None,
    seed: int = 0,
    threshold: float = 1.0,
    engine: str = "transformers",
    temperature: float | None = None,
    console: Console | None = None,
) -> EvalReport:
    """`clawgym evaluate`: run, print the tables and where results.json / eval.png went."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: wide enough that the tables do not wrap
            console = Console(width=140)
    policy = make_eval_policy(model, engine=engine)
    report = evaluate(
        policy, list(env_ids), split=split, repeats=repeats, concurrency=concurrency, level=level, count=count,
        seed=seed, run_dir=out, success_threshold=threshold, temperature=temperature, model_name=model,
    )  # fmt: skip
    report.console_print(console)
    for stage, reasons in report.failure_reasons.items():
        for reason, n in list(reasons.items())[:3]:
            console.print(f"[yellow]failed at {stage} x{n}:[/yellow] {reason}")
    console.print(f"results: {report.results_path}\ntable: {report.table_path}\nplot: {report.plot_path}")
    return report
