"""The white-box loop: in-process calls recorded into the proxy's rollout, the same forest; and skyrl-gym."""

from __future__ import annotations

import pytest

from harness_adapters.skyrl_env import WhiteBoxTextEnv
from harness_adapters.whitebox import WhiteBoxAdapter
from tests.harnesses.helpers import (
    ANSWER_FILE,
    one_rollout,
    scripted_policy,
    tokenizer,
    tool_call,
    write_call,
    write_task,
)

FINAL = "Done."


@pytest.mark.parametrize(("content", "reward"), [("42", 1.0), ("41", 0.0)])
async def test_whitebox_rollout_scores_and_rebuilds_the_same_forest_type(content: str, reward: float) -> None:
    completions = [tool_call("bash", {"command": "cat notes.md"}), write_call("WhiteBox", content), FINAL]
    policy = scripted_policy(completions)
    result = await one_rollout(WhiteBoxAdapter(), policy)
    assert result.status == "ok", result.failure
    assert result.reward == reward
    assert result.harness_result is not None and result.harness_result.final_message == FINAL
    # the bash tool really ran in the sandbox: its output is in the next prompt the engine saw
    assert "The answer is 42." in policy.engine.prompt_texts[1]
    # every in-process call was recorded into the proxy's rollout and came back from close_rollout
    assert [c.call_index for c in result.calls] == [0, 1, 2]
    assert all(c.api_style.value == "in-process" for c in result.calls)
    # token-in, token-out: each prompt extends the previous call's prompt + raw generated ids exactly
    for before, after in zip(result.calls, result.calls[1:]):
        assert after.prompt_ids[: len(before.full_ids)] == before.full_ids
        assert after.drift_events == 0 and after.spliced_spans
    tok = tokenizer()
    stats = result.forest.stats
    assert stats.calls == 3 and stats.leaves == 1
    assert stats.generated_tokens == sum(len(tok.encode(c, add_special_tokens=False)) + 1 for c in completions)


async def test_whitebox_turn_cap_is_a_failure_not_a_success() -> None:
    looping = [tool_call("bash", {"command": "true"})] * 3
    result = await one_rollout(WhiteBoxAdapter(max_turns=3), scripted_policy(looping))
    assert result.status == "failed" and result.failure is not None
    assert "turn cap" in result.failure.reason


@pytest.mark.parametrize("score_capped", [False, True])
async def test_whitebox_stopped_at_the_call_cap_is_scored_like_a_cli_harness(score_capped: bool) -> None:
    """The loop stops at the rollout's call cap instead of asking past it; with score_capped that is the same
    truncation a CLI harness gets from the proxy's refusal (verified and scored), without it a failure."""
    calls = [write_call("WhiteBox", "42"), tool_call("bash", {"command": "true"})]
    result = await one_rollout(WhiteBoxAdapter(), scripted_policy(calls), max_calls=2, score_capped=score_capped)
    if score_capped:
        assert (result.status, result.truncated_by, result.reward) == ("ok", "call_cap", 1.0), result.failure
    else:
        assert result.status == "failed" and result.truncated_by is None and "turn cap (2)" in result.failure.reason


async def test_whitebox_calls_spend_the_rollout_token_budget_as_http_calls_do() -> None:
    """The white-box loop's calls go through the proxy's call pipeline: each spends its new prompt tokens (beyond
    the previous call's full ids) plus its generated tokens of the rollout's budget, as a harness's HTTP call."""
    completions = [tool_call("bash", {"command": "cat notes.md"}), write_call("WhiteBox", "42"), FINAL]
    stats: list = []
    result = await one_rollout(WhiteBoxAdapter(), scripted_policy(completions), proxy_stats=stats)
    assert result.status == "ok", result.failure
    expected, previous = 0, []
    for call in result.calls:
        shared = next(
            (i for i, (a, b) in enumerate(zip(call.prompt_ids, previous)) if a != b),
            min(len(previous), len(call.prompt_ids)),
        )
        expected += len(call.prompt_ids) - shared + len(call.generated_ids)
        previous = call.full_ids
    (rollout,) = stats
    assert rollout.new_tokens == expected > 0
    assert rollout.completed_calls == 3 and rollout.prefix_extended == 2


@pytest.mark.parametrize("score_capped", [False, True])
async def test_whitebox_stops_at_the_rollout_token_budget_like_a_cli_harness(score_capped: bool) -> None:
    """With a budget the first call alone nearly spends, the proxy refuses the second call before it is
    generated (recorded as token_cap, as over HTTP), and the rollout is scored like a CLI harness's."""
    calls = [write_call("WhiteBox", "42"), tool_call("bash", {"command": "true"}), FINAL]
    probe = await one_rollout(WhiteBoxAdapter(), scripted_policy(calls[:1] + [FINAL]))
    budget = len(probe.calls[0].full_ids) + 1  # the first call fits; the second call's new prompt does not
    stats: list = []
    result = await one_rollout(
        WhiteBoxAdapter(),
        scripted_policy(calls),
        max_rollout_tokens=budget,
        score_capped=score_capped,
        proxy_stats=stats,
    )
    assert stats[0].error_kinds == {"token_cap": 1} and stats[0].completed_calls == 1
    refused = result.calls[-1]
    assert refused.error is not None and refused.error.startswith("token_cap") and not refused.generated_ids
    if score_capped:
        assert (result.status, result.truncated_by, result.reward) == ("ok", "token_cap", 1.0), result.failure
    else:
        assert result.status == "failed" and "refused its next call (token_cap" in result.failure.reason


async def test_whitebox_bad_tool_calls_come_back_as_error_text() -> None:
    completions = [
        tool_call("read", {"path": "missing.txt"}),
        tool_call("edit", {"path": "notes.md", "old": "absent", "new": "x"}),
        tool_call("nosuchtool", {}),
        FINAL,
    ]
    policy = scripted_policy(completions)
    result = await one_rollout(WhiteBoxAdapter(), policy)
    assert result.status == "ok" and result.reward == 0.0
    assert "No such file" in policy.engine.prompt_texts[1]
    assert "occurs 0 times" in policy.engine.prompt_texts[2]
    assert "unknown tool 'nosuchtool'" in policy.engine.prompt_texts[3]


@pytest.mark.parametrize(("content", "reward"), [("42", 1.0), ("41", 0.0)])
def test_skyrl_text_env_one_model_turn_per_step(content: str, reward: float) -> None:
    env = WhiteBoxTextEnv(extras={"task": write_task(), "max_turns": 8})
    try:
        messages, info = env.init([])
        assert [m["role"] for m in messages] == ["system", "user"]
        assert {"read", "write", "edit", "bash"} <= {t["function"]["name"] for t in info["tools"]}
        out = env.step(tool_call("bash", {"command": "cat notes.md"}))
        assert not out["done"] and out["reward"] == 0.0
        assert out["observations"][0]["role"] == "tool" and "The answer is 42." in out["observations"][0]["content"]
        out = env.step(tool_call("write", {"path": ANSWER_FILE, "content": content}))
        assert not out["done"]
        out = env.step(FINAL)
        assert out["done"] and out["reward"] == reward
        assert out["metadata"]["turns"] == 3
        with pytest.raises(RuntimeError, match="episode is over"):
            env.step(FINAL)
    finally:
        env.close()


def test_skyrl_text_env_needs_a_task() -> None:
    with pytest.raises(ValueError, match="extras=\\{'task'"):
        WhiteBoxTextEnv(extras={})
