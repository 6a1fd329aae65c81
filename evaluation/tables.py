"""The evaluation report drawn: rich tables (per env, per category, per harness) and a bar plot with CIs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.table import Table

if TYPE_CHECKING:
    from evaluation.report import EvalReport, GroupStats, Interval


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
    for col in (
        "env",
        "rollouts",
        "tasks",
        "mean reward [95% CI]",
        "success rate [95% CI]",
        "failed",
        "calls",
        "wall s",
    ):
        table.add_column(col, justify="left" if col in ("env", "failed") else "right", no_wrap=col != "failed")
    for env, s in report.by_env.items():
        table.add_row(
            env,
            str(s.rollouts),
            str(s.tasks),
            fmt_mean_ci(s.mean_reward, s.reward_ci),
            fmt_mean_ci(s.success_rate, s.success_ci),
            _failures_text(s),
            f"{s.mean_calls:.1f}",
            f"{s.mean_wall_s:.1f}",
        )
    return table


def category_table(report: EvalReport) -> Table:
    table = Table(title="per category")
    for col in ("env", "category", "rollouts", "mean reward [95% CI]", "success rate", "failed"):
        table.add_column(
            col, justify="left" if col in ("env", "category", "failed") else "right", no_wrap=col != "failed"
        )
    for env, cats in report.by_env_category.items():
        for cat, s in cats.items():
            table.add_row(
                env,
                cat,
                str(s.rollouts),
                fmt_mean_ci(s.mean_reward, s.reward_ci),
                f"{s.success_rate:.3f}",
                _failures_text(s),
            )
    return table


def harness_table(report: EvalReport) -> Table:
    table = Table(title="per harness (all suites)")
    for col in ("harness", "rollouts", "tasks", "mean reward [95% CI]", "success rate [95% CI]", "failed"):
        table.add_column(col, justify="left" if col in ("harness", "failed") else "right", no_wrap=col != "failed")
    for h, s in report.by_harness.items():
        table.add_row(
            h,
            str(s.rollouts),
            str(s.tasks),
            fmt_mean_ci(s.mean_reward, s.reward_ci),
            fmt_mean_ci(s.success_rate, s.success_ci),
            _failures_text(s),
        )
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
