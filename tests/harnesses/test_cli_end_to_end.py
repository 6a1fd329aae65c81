"""Each real CLI inside the local sandbox, through the real proxy, driven by scripted native tool calls.

The scripted engine (a named test double) emits the harness's own write tool call in Qwen's `<tool_call>`
format, then a final text; the harness's tool must write the file, the verifier score it, the proxy record
both calls, and the forest be one branch holding exactly the scripted tokens.
"""

from __future__ import annotations

import pytest

from harness_adapters.claude_code import ClaudeCodeAdapter
from harness_adapters.codex import CodexAdapter
from harness_adapters.openclaw import OpenClawAdapter
from harness_adapters.pi import PiAdapter
from tests.harnesses.helpers import one_rollout, scripted_policy, tokenizer, write_call

FAST = {"ClaudeCode": ClaudeCodeAdapter, "Codex": CodexAdapter, "Pi": PiAdapter}
FINAL = "Done: the answer is written."


def scripted_tokens(completions: list[str]) -> int:
    tok = tokenizer()
    return sum(len(tok.encode(c, add_special_tokens=False)) + 1 for c in completions)  # + the stop token


async def check_rollout(harness: str, adapter, content: str, expected_reward: float) -> None:
    completions = [write_call(harness, content), FINAL]
    policy = scripted_policy(completions)
    result = await one_rollout(adapter, policy)
    assert result.status == "ok", result.failure
    assert result.harness_result is not None and result.harness_result.success
    assert result.harness_result.final_message == FINAL
    assert result.reward == expected_reward
    # the proxy recorded every call the engine served, and nothing failed
    assert len(result.calls) == policy.engine.calls == 2
    assert all(c.error is None for c in result.calls)
    assert [len(c.generated_ids) for c in result.calls] == [
        len(tokenizer().encode(c, add_special_tokens=False)) + 1 for c in completions
    ]
    # call 2 continues call 1 exactly: the first turn came back as its raw generated ids
    first, second = result.calls
    assert second.prompt_ids[: len(first.full_ids)] == first.full_ids
    assert second.spliced_spans and second.drift_events == 0
    stats = result.forest.stats
    assert stats.calls == 2 and stats.leaves == 1
    assert stats.generated_tokens == scripted_tokens(completions)
    assert result.forest.reward == expected_reward


@pytest.mark.parametrize("harness", sorted(FAST))
async def test_cli_writes_the_answer_and_scores_one(harness: str) -> None:
    await check_rollout(harness, FAST[harness](), "42", 1.0)


@pytest.mark.parametrize("harness", sorted(FAST))
async def test_cli_wrong_answer_scores_zero(harness: str) -> None:
    await check_rollout(harness, FAST[harness](), "41", 0.0)


async def test_openclaw_writes_the_answer_and_scores_one() -> None:
    """OpenClaw spends 10-25 s starting up: one run in the default set (Responses API, its default)."""
    await check_rollout("OpenClaw", OpenClawAdapter(), "42", 1.0)


@pytest.mark.slow
async def test_openclaw_wrong_answer_scores_zero() -> None:
    await check_rollout("OpenClaw", OpenClawAdapter(), "41", 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("style", ["openai-chat", "anthropic-messages"])
async def test_openclaw_other_api_styles(style: str) -> None:
    """Chat and Anthropic modes work too, but rewrite history (no exact prefix): the forest still rebuilds."""
    completions = [write_call("OpenClaw", "42"), FINAL]
    result = await one_rollout(OpenClawAdapter(api_style=style), scripted_policy(completions))
    assert result.status == "ok", result.failure
    assert result.reward == 1.0 and len(result.calls) == 2


async def test_claude_code_over_max_retries_fails_fast_and_reports_it() -> None:
    """A scripted engine out of completions makes the proxy answer 5xx; with max_retries=0 Claude Code gives up
    at once and the rollout fails at the harness stage (never a zero-reward success)."""
    result = await one_rollout(ClaudeCodeAdapter(max_retries=0), scripted_policy([]))
    assert result.status == "failed"
    assert result.failure is not None and result.failure.stage == "harness"
    assert result.harness_result is not None and not result.harness_result.success
    assert result.harness_result.wall_s < 30


async def test_pi_api_error_with_exit_code_zero_is_a_failure() -> None:
    """pi exits 0 after API errors; the adapter reads the failure from its agent_end event."""
    result = await one_rollout(PiAdapter(), scripted_policy([]))
    assert result.harness_result is not None
    assert result.harness_result.exit_code == 0
    assert not result.harness_result.success and result.status == "failed"
    assert "error" in (result.harness_result.error or "")
