"""Evaluation: run a policy on environments (suite x harness) and report rewards with confidence intervals.

    from evaluation import evaluate, make_eval_policy
    report = evaluate(make_eval_policy("tiny-qwen3"), ["ClawGymBench-WhiteBox"], split="test", count=8)
    report.console_print()

Modules, one job each: `run` (the rollouts), `cache` (reusing a start evaluation across arms; how many
rollouts at once by default), `task_selection` (which task instances), `report` (rows,
aggregates, bootstrap CIs, saving), `tables` (rich tables and the plot), `scripted` (reference-playing test
doubles). This layer sits above the task suites and below the trainers, which select tasks and warm-start
with it.
"""

from evaluation.cache import EvalCache, EvalKey, default_concurrency, harness_identity, task_digest
from evaluation.report import (
    CI_METHOD,
    EvalConfig,
    EvalReport,
    EvalRow,
    GroupStats,
    Interval,
    SavedReport,
    bootstrap_ci,
    build_report,
    summarize,
)
from evaluation.run import PolicySource, cached_evaluation, evaluate
from evaluation.scripted import FINAL_MESSAGE, WRONG_CONTENT, ScriptedReferencePolicies, make_eval_policy
from evaluation.tables import category_table, env_table, fmt_mean_ci, harness_table, plot_report
from evaluation.task_selection import select_tasks

__all__ = [
    "CI_METHOD",
    "FINAL_MESSAGE",
    "WRONG_CONTENT",
    "EvalCache",
    "EvalConfig",
    "EvalKey",
    "EvalReport",
    "EvalRow",
    "GroupStats",
    "Interval",
    "PolicySource",
    "SavedReport",
    "ScriptedReferencePolicies",
    "bootstrap_ci",
    "cached_evaluation",
    "build_report",
    "category_table",
    "default_concurrency",
    "env_table",
    "evaluate",
    "fmt_mean_ci",
    "harness_identity",
    "harness_table",
    "make_eval_policy",
    "plot_report",
    "select_tasks",
    "summarize",
    "task_digest",
]
