"""The aggregation math on hand-made rows: means, success, bootstrap-over-tasks CIs, failures, groups, files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from evaluation import EvalConfig, EvalReport, EvalRow, bootstrap_ci, build_report, summarize


def row(
    task: str,
    reward: float,
    *,
    env: str = "S-WhiteBox",
    category: str = "a",
    repeat: int = 0,
    status: str = "ok",
    stage: str | None = None,
    threshold: float = 1.0,
    calls: int = 2,
) -> EvalRow:
    suite, harness = env.split("-")
    return EvalRow(
        env_id=env,
        suite=suite,
        harness=harness,
        task_id=task,
        category=category,
        repeat=repeat,
        reward=reward,
        success=status == "ok" and reward >= threshold,
        status=status,
        failure_stage=stage,
        failure_reason=f"{stage} broke" if stage else None,
        num_calls=calls,
        wall_s=1.5,
    )


def config(*envs: str, **kw) -> EvalConfig:
    return EvalConfig(env_ids=list(envs) or ["S-WhiteBox"], **kw)


def test_mean_success_and_failures_by_stage() -> None:
    rows = [
        row("t1", 1.0),
        row("t2", 0.5),
        row("t3", 0.0),
        row("t4", 0.0, status="failed", stage="harness"),
        row("t5", 0.0, status="failed", stage="harness"),
        row("t6", 0.0, status="failed", stage="timeout"),
        row("t7", 0.0, status="empty", stage="reconstruct"),
    ]
    s = summarize(rows)
    assert s.rollouts == 7 and s.tasks == 7
    assert s.mean_reward == pytest.approx(1.5 / 7)  # failed rollouts count as 0 by default
    assert s.success_rate == pytest.approx(1 / 7)
    assert s.failed == 4 and s.failures == {"harness": 2, "reconstruct": 1, "timeout": 1}
    assert s.mean_calls == 2 and s.mean_wall_s == 1.5
    # leaving failed rollouts out of the scores keeps them in the failure counts
    s2 = summarize(rows, failed_as_zero=False)
    assert s2.mean_reward == pytest.approx(0.5) and s2.success_rate == pytest.approx(1 / 3)
    assert s2.failed == 4 and s2.rollouts == 7


def test_success_uses_the_threshold_given_per_row() -> None:
    rows = [row("t1", 0.8, threshold=0.75), row("t2", 0.7, threshold=0.75), row("t3", 1.0, threshold=0.75)]
    assert summarize(rows).success_rate == pytest.approx(2 / 3)


def test_bootstrap_resamples_tasks_not_rollouts() -> None:
    # two tasks, ten repeats each: one always solved, one never. Only 2 independent units, so the interval
    # must span (almost) everything; a rollout-level bootstrap would claim about +-0.22.
    rows = [row("good", 1.0, repeat=i) for i in range(10)] + [row("bad", 0.0, repeat=i) for i in range(10)]
    s = summarize(rows)
    assert s.mean_reward == 0.5 and s.tasks == 2
    assert s.reward_ci is not None and s.reward_ci.low == 0.0 and s.reward_ci.high == 1.0


def test_bootstrap_interval_matches_the_normal_interval_for_many_tasks() -> None:
    rng = np.random.default_rng(1)
    values = rng.uniform(0, 1, size=400)
    ci = bootstrap_ci([[v] for v in values], seed=3)
    assert ci is not None and ci.low < values.mean() < ci.high
    half = 1.96 * values.std(ddof=1) / math.sqrt(len(values))
    assert (ci.high - ci.low) / 2 == pytest.approx(half, rel=0.15)
    assert bootstrap_ci([[v] for v in values], seed=3) == ci  # deterministic for a seed


def test_no_interval_for_one_task_and_a_point_for_constant_rewards() -> None:
    assert bootstrap_ci([[1.0, 0.0, 1.0]]) is None
    assert summarize([row("only", 1.0, repeat=i) for i in range(3)]).reward_ci is None
    ci = bootstrap_ci([[1.0], [1.0], [1.0]])
    assert ci is not None and ci.low == ci.high == 1.0


def test_groups_per_env_category_harness_and_suite() -> None:
    rows = [
        row("t1", 1.0, env="A-WhiteBox", category="x"),
        row("t2", 0.0, env="A-WhiteBox", category="y"),
        row("t1", 1.0, env="A-Pi", category="x"),
        row("t2", 1.0, env="A-Pi", category="y"),
        row("u1", 0.0, env="B-Pi", category="z", status="failed", stage="sandbox"),
    ]
    report = build_report(rows, config("A-WhiteBox", "A-Pi", "B-Pi"))
    assert list(report.by_env) == ["A-WhiteBox", "A-Pi", "B-Pi"]  # the order asked for
    assert report.by_env["A-WhiteBox"].mean_reward == 0.5 and report.by_env["A-Pi"].mean_reward == 1.0
    assert report.by_env_category["A-WhiteBox"]["x"].mean_reward == 1.0
    assert report.by_env_category["A-WhiteBox"]["y"].mean_reward == 0.0
    assert set(report.by_env_category["B-Pi"]) == {"z"}
    # the same task id under two envs is two tasks of the harness / suite groups
    assert report.by_harness["Pi"].rollouts == 3 and report.by_harness["Pi"].tasks == 3
    assert report.by_harness["Pi"].mean_reward == pytest.approx(2 / 3)
    assert report.by_harness["Pi"].failures == {"sandbox": 1}
    assert report.by_suite["A"].tasks == 4 and report.by_suite["B"].failed == 1
    assert report.failure_reasons == {"sandbox": {"sandbox broke": 1}}


def test_empty_rows_are_an_error() -> None:
    with pytest.raises(ValueError, match="no rollouts"):
        build_report([], config())
    with pytest.raises(ValueError, match="empty group"):
        summarize([])


def test_save_writes_json_table_and_plot_and_loads_back(tmp_path) -> None:
    rows = [row(f"t{i}", float(i % 2), category="xy"[i % 2]) for i in range(6)]
    rows += [row(f"t{i}", 1.0, env="S-Pi", category="x") for i in range(3)]
    report = build_report(rows, config("S-WhiteBox", "S-Pi", model="m"))
    results = report.save(tmp_path)
    data = json.loads(results.read_text())
    assert len(data["rows"]) == 9 and data["by_env"]["S-Pi"]["mean_reward"] == 1.0
    assert "bootstrap" in data["config"]["ci_method"]
    png = (tmp_path / "eval.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    text = (tmp_path / "table.txt").read_text()
    assert "S-WhiteBox" in text and "S-Pi" in text and "per category" in text and "0.500" in text
    loaded = EvalReport.load(results)
    assert loaded.by_env == report.by_env and loaded.rows == report.rows
