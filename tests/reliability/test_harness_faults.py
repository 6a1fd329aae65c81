"""Harness faults: a harness that crashes, hangs, exits 0 having done nothing, or floods the proxy.

Each such rollout ends as a counted failure with its stage and reason (`Runtime.failures`, the proxy's
`RolloutStats`), the rest of the batch goes on and succeeds, and every sandbox is destroyed (the
`sandbox_root` fixture asserts no folder and no process is left). Real processes throughout: the
misbehaving agent runs inside the real bubblewrap sandbox and talks HTTP to the real proxy; the
flooding and crashing cases are also shown with the real Claude Code CLI.
"""

from __future__ import annotations

import time

import pytest

from tests.reliability import doubles

FAULTS = ["ok", "crash", "hang", "idle", "flood", "ok"]


async def _batch(env, policy, tasks):
    from clawgym_env.vector_env import ClawGymVectorEnv

    venv = ClawGymVectorEnv(env, num_envs=len(tasks))
    return await venv.arollouts(policy, tasks)


def test_one_batch_with_every_harness_fault_counts_each_and_goes_on(make_env, tmp_path):
    env = make_env(max_calls=5)
    tasks = [doubles.fault_task(f, i, timeout_s=4 if f == "hang" else 60) for i, f in enumerate(FAULTS)]
    policy = doubles.scripted_policy()
    started = time.perf_counter()
    results = env.runtime.run(_batch(env, policy, tasks))
    elapsed = time.perf_counter() - started

    by_fault = {t.metadata["fault"] + str(i): r for i, (t, r) in enumerate(zip(tasks, results))}
    # the healthy rollouts of the same batch succeed in full
    for key in ("ok0", "ok5"):
        r = by_fault[key]
        assert (r.status, r.reward, len(r.calls)) == ("ok", 1.0, 2), r.failure
    # each fault is its own counted failure, with the stage and a reason that says what happened
    crash, hang, idle, flood = (by_fault[k] for k in ("crash1", "hang2", "idle3", "flood4"))
    assert crash.status == "failed" and crash.failure.stage == "harness"
    assert "exited with code -11" in crash.failure.reason or "code 139" in crash.failure.reason
    assert hang.status == "failed" and hang.failure.stage == "timeout" and "limit" in hang.failure.reason
    assert idle.status == "empty" and idle.failure.stage == "reconstruct" and "no model call" in idle.failure.reason
    assert (
        flood.status == "failed" and flood.failure.stage == "harness" and "cap of 5 model calls" in flood.failure.reason
    )
    assert elapsed < 40, "the hung harness held the batch past its limit"

    counts = env.runtime.failures.as_dict()
    assert env.runtime.failures.total() == 4
    assert {stage: sum(c.values()) for stage, c in counts.items()} == {"harness": 2, "timeout": 1, "reconstruct": 1}
    # forests: failed rollouts are marked, carry no reward, and keep the calls they made for inspection
    assert [r.forest.status for r in results] == ["ok", "failed", "failed", "empty", "failed", "ok"]
    assert all(r.forest.reward is None for r in (crash, hang, idle, flood))
    assert (len(crash.calls), len(hang.calls), len(idle.calls)) == (1, 1, 0)
    # the flood: 5 calls served, the 6th refused and recorded as such, nothing more reached the engine
    assert len(flood.calls) == 6 and flood.calls[-1].error.startswith("call_cap")
    assert sum(1 for c in flood.calls if c.error is None) == 5


def test_training_style_loop_goes_on_after_faulty_batches(make_env):
    """Two batches in a row, each with a crashing and a hung harness: every batch returns, the counts
    add up, the healthy rollouts of every batch get their reward."""
    env = make_env()
    policy = doubles.scripted_policy()
    rewards = []
    for step in range(2):
        tasks = [
            doubles.fault_task("crash", step),
            doubles.fault_task("hang", step, timeout_s=2),
            doubles.fault_task("ok", step),
        ]
        results = env.runtime.run(_batch(env, policy, tasks))
        rewards.append([r.reward for r in results])
        assert [r.status for r in results] == ["failed", "failed", "ok"]
    assert rewards == [[0.0, 0.0, 1.0]] * 2
    assert {s: sum(c.values()) for s, c in env.runtime.failures.as_dict().items()} == {"harness": 2, "timeout": 2}


def test_env_step_reports_a_crash_as_truncated_failure(make_env):
    """The gymnasium view of the same thing: `step` returns, truncated, reward 0, the reason in info."""
    env = make_env(harness_options={"fault": "crash"})
    env.reset(seed=0)
    forest, reward, terminated, truncated, info = env.step(doubles.scripted_policy())
    assert (reward, terminated, truncated, info["status"]) == (0.0, True, True, "failed")
    assert info["failure"]["stage"] == "harness" and forest.status == "failed"
    assert info["num_calls"] == 1 and env.runtime.failures.total() == 1


# ------------------------------------------------------------------------------ real CLI: Claude Code
@pytest.fixture
def claude_installed():
    from harness_adapters.base import HarnessInstall

    if not HarnessInstall.default().binary("claude").exists():
        pytest.fail("the harness CLIs are not installed: run `bash scripts/setup.sh` first")


def _ls_forever(prompt_text: str) -> str:
    """A policy stuck in a tool loop: it lists the folder again and again."""
    return '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls", "description": "list"}}\n</tool_call>'


def test_real_claude_code_flooding_the_proxy_hits_the_call_cap(make_env, claude_installed):
    env = make_env(harness="ClaudeCode", max_calls=4)
    env.reset(seed=0)
    _, reward, _, truncated, info = env.step(doubles.scripted_policy(_ls_forever))
    assert truncated and reward == 0.0 and info["status"] == "failed"
    assert info["failure"]["stage"] == "harness"
    stats = env.last_result.calls
    assert sum(1 for c in stats if c.error is None) == 4  # the engine served exactly the cap
    assert any((c.error or "").startswith("call_cap") for c in stats)
    assert env.runtime.failures.total() == 1


def test_real_claude_code_crashing_on_a_bad_option_is_counted(make_env, claude_installed):
    env = make_env(harness="ClaudeCode", harness_options={"extra_args": ["--no-such-option"]})
    env.reset(seed=0)
    _, reward, _, truncated, info = env.step(doubles.scripted_policy())
    assert truncated and reward == 0.0 and info["failure"]["stage"] == "harness"
    assert "no-such-option" in info["failure"]["reason"] or "unknown option" in info["failure"]["reason"]
    assert info["num_calls"] == 0 and env.runtime.failures.total() == 1


def test_score_capped_verifies_a_rollout_cut_at_its_call_cap(make_env):
    """With score_capped, the call cap truncates instead of failing: the workspace is still verified."""
    env = make_env(max_calls=3, score_capped=True)
    done = {"notes.md": "The answer is 42.\n", doubles.ANSWER_FILE: f"{doubles.ANSWER}\n"}
    tasks = [
        doubles.fault_task("flood", 0, workspace=done),
        doubles.fault_task("flood", 1),
        doubles.fault_task("crash", 2),
    ]
    flood_done, flood_empty, crash = env.runtime.run(_batch(env, doubles.scripted_policy(), tasks))
    assert (flood_done.status, flood_done.truncated_by, flood_done.reward) == ("ok", "call_cap", 1.0)
    assert (flood_empty.status, flood_empty.truncated_by, flood_empty.reward) == ("ok", "call_cap", 0.0)
    assert flood_done.forest.ok and flood_done.forest.reward == 1.0  # trainable, with its reward
    assert sum(1 for c in flood_done.calls if c.error is None) == 3
    # other faults still fail
    assert crash.status == "failed" and crash.truncated_by is None and crash.failure.stage == "harness"
    assert env.runtime.failures.total() == 1
