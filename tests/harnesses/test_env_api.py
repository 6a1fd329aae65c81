"""The lead's env API end to end: a user suite registered, `make("<Suite>-ClaudeCode")`, reset, step(policy)."""

from __future__ import annotations

import clawgym_env
from clawgym_env import TaskSuite
from tests.harnesses.helpers import renderer, scripted_policy, write_call, write_task


def test_registered_suite_through_make_reset_step_with_claude_code(tmp_path) -> None:
    clawgym_env.register(TaskSuite(name="HarnessUserSuite", tasks=[write_task("u-write")]))
    env = clawgym_env.make(
        "HarnessUserSuite-ClaudeCode",
        run_dir=tmp_path / "run",
        harness_options={"tools": "Bash,Read,Edit,Write,Glob,Grep", "max_retries": 1},
    )
    try:
        obs, info = env.reset(seed=0)
        assert obs["task_id"] == "u-write"
        policy = scripted_policy([write_call("ClaudeCode", "42"), "Done."])
        assert policy.renderer is renderer()
        forest, reward, terminated, truncated, info = env.step(policy)
        assert info["status"] == "ok", info["failure"]
        assert reward == 1.0 and terminated and not truncated
        assert forest.stats.calls == 2 and forest.stats.leaves == 1
        assert info["num_calls"] == 2
        # the calls went to the run's durable log too
        assert (tmp_path / "run" / "calls.jsonl").read_text().count('"rollout_id"') == 2
    finally:
        env.close()


def test_whitebox_through_make(tmp_path) -> None:
    clawgym_env.register(TaskSuite(name="HarnessUserSuiteWB", tasks=[write_task("u-write")]))
    env = clawgym_env.make("HarnessUserSuiteWB-WhiteBox", run_dir=tmp_path / "run")
    try:
        env.reset(seed=0)
        forest, reward, _, truncated, info = env.step(scripted_policy([write_call("WhiteBox", "42"), "Done."]))
        assert info["status"] == "ok", info["failure"]
        assert reward == 1.0 and not truncated and forest.stats.calls == 2
        assert (tmp_path / "run" / "calls.jsonl").read_text().count('"in-process"') == 2
    finally:
        env.close()


def test_claude_code_and_whitebox_through_a_sharded_proxy(tmp_path) -> None:
    """`proxy_shards=2`: each rollout's sandbox is bound to its own shard's socket, Claude Code's calls and the
    white-box loop's in-process records land on that shard, and the env sees the same rewards and forests."""
    clawgym_env.register(TaskSuite(name="HarnessShardedSuite", tasks=[write_task("u-write")]))
    options = {"run_dir": tmp_path / "run", "proxy_shards": 2}
    claude = clawgym_env.make("HarnessShardedSuite-ClaudeCode", **options, harness_options={"max_retries": 1})
    whitebox = clawgym_env.make("HarnessShardedSuite-WhiteBox", **options)
    try:
        for env, harness in ((claude, "ClaudeCode"), (whitebox, "WhiteBox"), (claude, "ClaudeCode")):
            env.reset(seed=0)
            forest, reward, _, _, info = env.step(scripted_policy([write_call(harness, "42"), "Done."]))
            assert info["status"] == "ok", info["failure"]
            assert reward == 1.0 and forest.stats.calls == 2 and forest.stats.leaves == 1
        proxy = claude.runtime.run(claude.runtime.proxy())
        logged = [(s.log_path.read_text().count('"rollout_id"'), s.log_path.parent.name) for s in proxy.shards]
        assert sorted(n for n, _ in logged) == [2, 4]  # three rollouts of two calls over two shards
        assert proxy.table_sizes()["open"] == 0 and proxy.shard_failures == {}
    finally:
        claude.close()
        whitebox.close()
