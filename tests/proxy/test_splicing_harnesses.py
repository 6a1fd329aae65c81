"""Splicing under the real harness CLIs (in the local sandbox, through the real proxy).

The scripted engine (a named test double) makes the same write call twice with different raw text (bare
JSON, then `<tool_call>` tags): each harness echoes both turns with one structure, and each must be spliced
from its own generation, so every prompt extends the previous call's full ids and the tree has one leaf.
Claude Code's own rewrite of an echoed Bash call (`cd <workspace> && ` dropped) is spliced, not drift.
"""

from __future__ import annotations

import json

import pytest

from clawgym_env.proxy.rollout_state import RolloutStats
from clawgym_env.specs import DEFAULT_MOUNT_PATH
from harness_adapters.base import HarnessInstall
from harness_adapters.claude_code import ClaudeCodeAdapter
from harness_adapters.codex import CodexAdapter
from harness_adapters.openclaw import OpenClawAdapter
from harness_adapters.pi import PiAdapter
from tests.harnesses.helpers import one_rollout, scripted_policy, write_call

ADAPTERS = {"ClaudeCode": ClaudeCodeAdapter, "Codex": CodexAdapter, "Pi": PiAdapter, "OpenClaw": OpenClawAdapter}
SLOW = {"OpenClaw"}  # 10-25 s of start-up
FINAL = "Done: the answer is written."


@pytest.fixture(autouse=True)
def _harnesses_installed():
    if not HarnessInstall.default().binary("claude").exists():
        pytest.fail("the harness CLIs are not installed: run `bash scripts/setup.sh` first")


def bare(tagged: str) -> str:
    """The same call without the tags, as Qwen2.5-Coder often writes it."""
    return json.dumps(json.loads(tagged.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")))


def assert_one_branch(result, sources: list[int]) -> None:
    calls = result.calls
    assert all(c.error is None for c in calls)
    for previous, current in zip(calls, calls[1:]):
        assert current.prompt_ids[: len(previous.full_ids)] == previous.full_ids, (
            f"call {current.call_index} does not extend call {previous.call_index}: {current.prefix}"
        )
        assert current.prefix is not None and current.prefix.extended and current.drift_events == 0
    assert [s.source_call for s in calls[-1].segments if s.kind == "assistant_spliced"] == sources
    assert result.forest.stats.leaves == 1 and result.forest.stats.prefix_breaks == 0


@pytest.mark.parametrize(
    "harness", [pytest.param(h, marks=pytest.mark.slow) if h in SLOW else h for h in sorted(ADAPTERS)]
)
async def test_repeated_call_in_two_raw_formats_through_the_cli(harness):
    tagged = write_call(harness, "42")
    policy = scripted_policy([bare(tagged), tagged, FINAL])
    stats: list[RolloutStats] = []
    result = await one_rollout(ADAPTERS[harness](), policy, proxy_stats=stats)
    assert result.status == "ok", result.failure
    assert result.reward == 1.0 and len(result.calls) == 3
    assert result.calls[0].generated_ids != result.calls[1].generated_ids
    assert_one_branch(result, [0, 1])
    # calls 1 and 2 were rendered from where the call before left off: what the harness resent was seen as
    # the same messages (a render from scratch would give the same ids: tests/proxy/test_render_resume.py)
    assert stats[0].resumed_renders == 2


async def test_claude_code_cd_rewrite_through_the_cli():
    command = f"cd {DEFAULT_MOUNT_PATH} && printf 42 > answer.txt"
    bash = (
        "<tool_call>\n"
        + json.dumps({"name": "Bash", "arguments": {"command": command, "description": "Write it"}})
        + "\n</tool_call>"
    )
    result = await one_rollout(ClaudeCodeAdapter(), scripted_policy([bash, FINAL]))
    assert result.status == "ok", result.failure
    assert result.reward == 1.0 and len(result.calls) == 2
    echoed = next(
        block["input"]["command"]
        for m in result.calls[1].request["messages"]
        if m["role"] == "assistant" and isinstance(m["content"], list)
        for block in m["content"]
        if block.get("type") == "tool_use"
    )
    assert echoed == "printf 42 > answer.txt"  # Claude Code 2.1.197 dropped `cd <workspace> && `
    assert result.calls[1].rewritten_turns == 1 and result.forest.stats.rewritten_turns == 1
    assert_one_branch(result, [0])
