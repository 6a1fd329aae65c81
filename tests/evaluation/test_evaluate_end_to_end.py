"""evaluate() and `clawgym evaluate` on a bundled suite through the white-box loop and a real CLI harness.

The policy is the named test double ScriptedReferencePolicies: a ScriptedTestEngine per rollout that writes
the task's reference files through the harness's own write tool (reward 1.0) or wrong content (reward 0).
A real model (tiny-qwen3 through the transformers engine) runs the same path once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evaluation import EvalReport, ScriptedReferencePolicies, evaluate, select_tasks

REPO = Path(__file__).resolve().parents[2]
ENVS = ["ClawGymBench-WhiteBox", "ClawGymBench-Pi"]


@pytest.mark.harness
# the scripted "wrong" solution writes the asked-for file with wrong content: level 0 gives half credit
@pytest.mark.parametrize(("mode", "reward"), [("reference", 1.0), ("wrong", 0.5)])
def test_reference_and_wrong_solutions_through_whitebox_and_pi(tmp_path: Path, mode: str, reward: float) -> None:
    report = evaluate(
        ScriptedReferencePolicies(mode),
        ENVS,
        split="test",
        level=0,
        count=2,
        repeats=2,
        concurrency=3,
        run_dir=tmp_path,
        progress=False,
    )
    assert len(report.rows) == 2 * 2 * 2  # envs x tasks x repeats
    assert {(r.env_id, r.repeat) for r in report.rows} == {(e, i) for e in ENVS for i in (0, 1)}
    for r in report.rows:
        assert r.status == "ok", r.failure_reason
        assert r.reward == reward and r.success == (reward == 1.0)
        assert r.num_calls == 2 and r.generated_tokens > 0 and r.level == 0 and r.category != "-"
    for env in ENVS:
        stats = report.by_env[env]
        assert stats.mean_reward == reward and stats.success_rate == float(reward == 1.0) and stats.failed == 0
        assert stats.tasks == 2 and stats.reward_ci is not None
    assert set(report.by_harness) == {"WhiteBox", "Pi"}
    # the held-out tasks are the ones evaluated, and nothing of the train split
    assert all("-test-" in r.task_id for r in report.rows)
    saved = EvalReport.load(tmp_path / "results.json")
    assert saved.by_env == report.by_env
    assert (tmp_path / "eval.png").stat().st_size > 5000
    # every rollout's model calls were recorded by the proxy of the run directory
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert {c["rollout_id"] for c in calls} == {r.rollout_id for r in report.rows}


@pytest.mark.harness
def test_reference_solutions_through_a_sharded_proxy(tmp_path: Path) -> None:
    """`proxy_shards=2`: a policy per rollout (a scripted engine each, one renderer), the white-box loop and
    the real pi CLI through two proxy processes; every call in one of the shards' logs."""
    report = evaluate(
        ScriptedReferencePolicies("reference"),
        ENVS,
        level=0,
        count=2,
        concurrency=3,
        run_dir=tmp_path,
        progress=False,
        proxy_shards=2,
    )
    assert [(r.status, r.reward) for r in report.rows] == [("ok", 1.0)] * 4
    logged = {
        json.loads(line)["rollout_id"]
        for log in tmp_path.glob("shard-*/calls.jsonl")
        for line in log.read_text().splitlines()
    }
    assert logged == {r.rollout_id for r in report.rows}
    assert len(list(tmp_path.glob("shard-*/calls.jsonl"))) == 2


def test_a_policy_that_cannot_be_built_is_a_counted_failure(tmp_path: Path) -> None:
    def broken(task):
        raise RuntimeError(f"no policy for {task.id}")

    report = evaluate(broken, ["PinchBench-WhiteBox"], level=0, count=2, run_dir=tmp_path, progress=False)
    assert [r.status for r in report.rows] == ["failed", "failed"]
    assert report.by_env["PinchBench-WhiteBox"].failures == {"rollout": 2}
    assert report.by_env["PinchBench-WhiteBox"].mean_reward == 0.0
    reasons = report.failure_reasons["rollout"]
    assert sorted(reasons) == sorted(f"RuntimeError: no policy for {r.task_id}" for r in report.rows)


def test_real_tiny_model_through_the_whitebox_loop(tmp_path: Path) -> None:
    from clawgym_env.policies import make_policy

    policy = make_policy("tiny-qwen3", name="tiny-qwen3")
    report = evaluate(
        policy,
        ["ClawGymBench-WhiteBox"],
        level=0,
        count=1,
        run_dir=tmp_path,
        progress=False,
        env_overrides={"max_new_tokens": 12, "max_calls": 2},
    )
    (r,) = report.rows
    assert report.config.model == "tiny-qwen3"
    assert r.num_calls >= 1 and r.generated_tokens >= 1  # the random model really generated through the loop
    assert r.status in ("ok", "failed") and 0.0 <= r.reward <= 1.0


def test_bad_arguments_say_what_is_wrong(tmp_path: Path) -> None:
    import clawgym_env

    with pytest.raises(clawgym_env.UnknownEnvironmentError, match="ClawGymBench-WhiteBox"):
        evaluate(ScriptedReferencePolicies(), ["ClawGymBench-WhiteBx"], run_dir=tmp_path)
    with pytest.raises(ValueError, match="repeats and concurrency must be >= 1"):
        evaluate(ScriptedReferencePolicies(), ENVS, repeats=0, run_dir=tmp_path)
    with pytest.raises(ValueError, match="mode must be one of"):
        ScriptedReferencePolicies("perfect")
    env = clawgym_env.make("PinchBench-WhiteBox", split="test")
    with pytest.raises(ValueError, match="unknown level 7"):
        select_tasks(env, level=7)


def test_select_tasks_filters_a_list_suite_by_level_and_count() -> None:
    import clawgym_env
    from clawgym_env.specs import TaskSpec, TaskSuite

    tasks = [
        TaskSpec(id=f"t{i}", instruction="x", verifier=lambda ws: 1.0, metadata={"split": "test", "level": i % 2})
        for i in range(6)
    ]
    clawgym_env.register(TaskSuite(name="EvalListSuite", tasks=tasks))
    env = clawgym_env.make("EvalListSuite-WhiteBox", split="test")
    assert [t.id for t in select_tasks(env, level=1, count=2)] == ["t1", "t3"]
    assert len(select_tasks(env)) == 6
    with pytest.raises(ValueError, match="no tasks in split 'test' at level 5"):
        select_tasks(env, level=5)


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "160"}
    return subprocess.run(
        [sys.executable, "-m", "clawgym_cli", "evaluate", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.harness
def test_documented_evaluation_command_runs_a_bundled_suite_through_a_harness(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(
        "ClawGymBench-WhiteBox",
        "ClawGymBench-ClaudeCode",
        "--model",
        "scripted:reference",
        "--level",
        "0",
        "--count",
        "2",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for text in ("ClawGymBench-WhiteBox", "ClawGymBench-ClaudeCode", "mean reward [95% CI]", "per category"):
        assert text in proc.stdout
    assert f"results: {out / 'results.json'}" in proc.stdout
    report = EvalReport.load(out / "results.json")
    assert report.by_env["ClawGymBench-ClaudeCode"].mean_reward == 1.0
    assert report.by_env["ClawGymBench-WhiteBox"].success_rate == 1.0
    assert report.config.model == "scripted:reference" and report.config.level == 0
    assert "ClawGymBench-ClaudeCode" in (out / "table.txt").read_text()
    assert (out / "eval.png").exists()


@pytest.mark.harness
def test_evaluation_command_wrong_solution_gets_only_half_credit_and_unknown_env_fails(tmp_path: Path) -> None:
    proc = run_cli(
        "ClawGymBench-Codex",
        "--model",
        "scripted:wrong",
        "--level",
        "0",
        "--count",
        "2",
        "--out",
        str(tmp_path / "w"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = EvalReport.load(tmp_path / "w" / "results.json").by_env["ClawGymBench-Codex"]
    assert report.mean_reward == 0.5 and report.success_rate == 0.0  # the right file, the wrong content
    bad = run_cli("PinchBench-Pie", "--model", "scripted:wrong", cwd=tmp_path)
    assert bad.returncode != 0 and "PinchBench-Pi" in bad.stdout + bad.stderr
