"""A user's own task (instruction + workspace + verifier), registered and run end to end through `make`.

Real parts: the local bubblewrap sandbox, the serving proxy, the harness (the white-box loop and the real
pi CLI), the verifier and reconstruction. The only test double is the named ScriptedTestEngine, which
emits the tool calls a model would, tokenized by the real Qwen tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import clawgym_env
from clawgym_env import Policy, TaskSpec, TaskSuite
from clawgym_env.chat import ChatMLRenderer
from clawgym_env.checker import check_env
from clawgym_env.engines import ScriptedTestEngine, load_qwen_tokenizer

WS = "/root/.openclaw/workspace"


def sum_check(workspace: Path) -> dict[str, float]:
    answer = workspace / "answer.txt"
    return {
        "exists": float(answer.is_file()),
        "correct": float(answer.is_file() and answer.read_text().strip() == "42"),
    }


def user_tasks() -> list[TaskSpec]:
    return [
        TaskSpec(
            id=f"sum-{i}",
            instruction="Add the numbers in nums.txt and write the sum to answer.txt.",
            workspace={"nums.txt": "40\n2\n"},
            verifier=sum_check,
            timeout_s=120,
            metadata={"split": "train"},
        )
        for i in range(3)
    ]


def call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def renderer() -> ChatMLRenderer:
    return ChatMLRenderer(load_qwen_tokenizer())


def policy_writing(renderer: ChatMLRenderer, answer: str, tool: str = "write", path: str = "answer.txt") -> Policy:
    """Per prompt: write the answer first; once a tool result is in the prompt, finish with text."""

    def script(prompt: str) -> str:
        if "<tool_response>" in prompt or "<|im_start|>tool" in prompt or "tool_result" in prompt:
            return "Done."
        return call(tool, {"path": path, "content": answer})

    return Policy(engine=ScriptedTestEngine(renderer.tokenizer, script), renderer=renderer)


@pytest.fixture(scope="module")
def suite_name() -> str:
    clawgym_env.register(TaskSuite(name="UserSum", tasks=user_tasks()))
    return "UserSum"


def test_user_task_through_make_whitebox(tmp_path, renderer, suite_name):
    env = clawgym_env.make(f"{suite_name}-WhiteBox", run_dir=tmp_path / "run")
    try:
        obs, _ = env.reset(seed=1)
        assert obs["instruction"].startswith("Add the numbers")
        forest, reward, terminated, truncated, info = env.step(policy_writing(renderer, "42"))
        assert info["status"] == "ok", info["failure"]
        assert reward == 1.0 and terminated and not truncated
        assert info["subscores"] == {"exists": 1.0, "correct": 1.0}
        assert forest.num_branches == 1 and forest.stats.calls == 2
        assert int(forest.generated.sum()) == forest.stats.generated_tokens > 0
        # a wrong answer scores lower, through the same path
        env.reset(seed=1)
        _, wrong, _, _, info = env.step(policy_writing(renderer, "41"))
        assert info["status"] == "ok" and wrong == 0.5
    finally:
        env.close()


def test_user_task_through_make_with_a_real_cli_harness(tmp_path, renderer, suite_name):
    env = clawgym_env.make(f"{suite_name}-Pi", run_dir=tmp_path / "run")
    try:
        env.reset(seed=0)
        forest, reward, _, truncated, info = env.step(policy_writing(renderer, "42", path=f"{WS}/answer.txt"))
        assert info["status"] == "ok", info["failure"]
        assert reward == 1.0 and not truncated
        assert info["num_calls"] == forest.stats.calls == 2
        log = (tmp_path / "run" / "calls.jsonl").read_text().splitlines()
        assert len(log) == 2 and all(json.loads(line)["rollout_id"] == info["rollout_id"] for line in log)
    finally:
        env.close()


def test_vector_env_runs_a_group_and_returns_failures(tmp_path, renderer, suite_name):
    venv = clawgym_env.make_vec(f"{suite_name}-WhiteBox", num_envs=4, max_concurrency=2, run_dir=tmp_path / "run")
    try:
        obs, info = venv.reset(seed=3)
        assert len({o["task_id"] for o in obs}) == 1  # one group: the same task for all
        forests, rewards, terminated, truncated, info = venv.step(policy_writing(renderer, "42"))
        assert list(info["status"]) == ["ok"] * 4 and np.all(rewards == 1.0) and terminated.all()
        assert len({f.rollout_id for f in forests}) == 4

        # An engine that crashes mid-rollout: every rollout comes back as a counted failure, nothing raises.
        def broken(prompt: str) -> str:
            raise RuntimeError("engine exploded")

        bad = Policy(engine=ScriptedTestEngine(renderer.tokenizer, broken), renderer=renderer)
        venv.reset(seed=3)
        forests, rewards, _, truncated, info = venv.step(bad)
        assert truncated.all() and np.all(rewards == 0.0)
        assert all(f["stage"] == "harness" for f in info["failure"])
        assert all(f.status == "failed" and f.reward is None for f in forests)
        assert venv.env.runtime.failures.total() >= 4
    finally:
        venv.close()


def test_verifier_crash_is_an_error_not_a_zero(tmp_path, renderer):
    def crashing(workspace: Path) -> float:
        raise ValueError("checker bug")

    task = TaskSpec(id="crash", instruction="write answer.txt", verifier=crashing, timeout_s=60)
    clawgym_env.register(TaskSuite(name="UserCrash", tasks=[task]))
    env = clawgym_env.make("UserCrash-WhiteBox", run_dir=tmp_path / "run")
    try:
        env.reset(seed=0)
        forest, reward, _, truncated, info = env.step(policy_writing(renderer, "42"))
        assert truncated and info["status"] == "failed" and info["failure"]["stage"] == "verifier"
        assert "checker bug" in info["failure"]["reason"] and forest.status == "failed"
    finally:
        env.close()


def test_check_env_with_a_real_step(tmp_path, renderer, suite_name):
    env = clawgym_env.make(f"{suite_name}-WhiteBox", run_dir=tmp_path / "run")
    try:
        info = check_env(env, policy_writing(renderer, "42"))
        assert info["status"] == "ok"
    finally:
        env.close()


def test_check_env_accepts_a_capped_and_scored_rollout(tmp_path, renderer, suite_name):
    """score_capped: cut at the call cap, verified and scored, so truncated with status ok is correct."""
    env = clawgym_env.make(f"{suite_name}-Pi", run_dir=tmp_path / "run", max_calls=1, score_capped=True)
    try:
        # the real pi CLI: its first call writes the answer, its second is refused by the proxy's cap
        info = check_env(env, policy_writing(renderer, "42", path=f"{WS}/answer.txt"))
        assert info["status"] == "ok" and info["truncated_by"] == "call_cap", info["failure"]
    finally:
        env.close()
