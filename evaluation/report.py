"""An evaluation's rows, their aggregates and the saved report (JSON, text tables, plot).

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

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import ClassVar, Self

import numpy as np
from pydantic import BaseModel, Field
from rich.console import Console, Group
from rich.table import Table

from evaluation.tables import category_table, env_table, harness_table, plot_report

CI_METHOD = "percentile bootstrap over tasks (tasks resampled with all their repeats), 2000 resamples, 95%"
N_RESAMPLES = 2000
CI_LEVEL = 0.95


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
    cached_from: str | None = None  # the cache entry this report was read from (None: measured by this call)
    evaluation: str | None = None  # its EvalKey's digest, when evaluated with a cache: equal digests, same measurement
    commit: str | None = None  # the checkout's commit when the rollouts ran (evaluation.evidence.current_commit)

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
