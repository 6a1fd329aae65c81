"""The prefix check: did each prompt extend the previous call of its agent, and if not, where and why.

Harness-shaped recordings (clawgym_env.trajectory.synthetic_recordings, rendered ChatML-style on integer ids with the
segments a proxy records) go through reconstruction, which checks calls recorded without a check; single
breaks of each kind are built directly with the same renderer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clawgym_env.prefix import check_prefix, common_prefix_length
from clawgym_env.records import CallLog, ModelCall, PromptSegment
from clawgym_env.specs import ApiStyle
from clawgym_env.trajectory import build_forest
from clawgym_env.trajectory.inspect import inspect_run, recording_stats
from clawgym_env.trajectory.synthetic_recordings import Message, render, synthetic_rollout


def make_call(index: int, messages: list[Message], generated: list[int]) -> ModelCall:
    prompt, segments = render(messages)
    return ModelCall(
        rollout_id="r",
        call_index=index,
        api_style=ApiStyle.OPENAI_CHAT,
        request={},
        prompt_ids=prompt,
        generated_ids=generated,
        logprobs=[0.0] * len(generated),
        segments=segments,
    )


SYSTEM = [Message("system", list(range(100, 130)), "system"), Message("system", list(range(200, 220)), "tools")]
USER = Message("user", list(range(300, 312)), "user")
GEN0 = [500, 501, 502, 2]


def first_call() -> ModelCall:
    return make_call(0, [*SYSTEM, USER], GEN0)


def echoed(source: int | None, ids: list[int] = GEN0) -> Message:
    return Message("assistant", ids, "assistant_rendered", source)


def second(history: list[Message]) -> tuple[list[int], list[PromptSegment]]:
    return render([*SYSTEM, *history])


def test_append_only_extends():
    ids, segments = second([USER, echoed(0), Message("tool", [700, 701], "tool")])
    check = check_prefix(first_call(), ids, segments)
    assert check.extended and check.previous_call == 0 and check.shared == check.previous_length


def test_edited_user_message_is_located():
    edited = Message("user", [*range(300, 305), 999, *range(306, 312)], "user")
    ids, segments = second([edited, echoed(0), Message("tool", [700], "tool")])
    previous = first_call()
    check = check_prefix(previous, ids, segments)
    assert (check.extended, check.reason) == (False, "edited_history")
    assert check.shared == common_prefix_length(ids, previous.full_ids)
    assert previous.prompt_ids[check.shared] == 305 and ids[check.shared] == 999  # the edited token itself
    assert "at token" in check.detail


def test_inserted_message_is_edited_history():
    ids, segments = second([USER, Message("user", [800, 801], "user"), echoed(0), Message("tool", [700], "tool")])
    assert check_prefix(first_call(), ids, segments).reason == "edited_history"


def test_re_tokenized_echo_is_drift():
    ids, segments = second(
        [USER, Message("assistant", [500, 777, 2], "assistant_rendered"), Message("tool", [700], "tool")]
    )
    check = check_prefix(first_call(), ids, segments)
    assert (check.extended, check.reason) == (False, "drift")
    assert check.shared == len(first_call().prompt_ids) + 1  # broke inside the echoed generation


def test_changed_mid_conversation_system_message_is_a_harness_rewrite():
    note = Message("system", [900, 901, 902], "system")
    before = make_call(0, [*SYSTEM, USER, note], GEN0)
    ids, segments = second(
        [USER, Message("system", [900, 955, 902], "system"), echoed(0), Message("tool", [7], "tool")]
    )
    assert check_prefix(before, ids, segments).reason == "harness_rewrite"


def test_unechoed_generation_and_resent_prompt_are_retries():
    previous = first_call()
    assert check_prefix(previous, previous.prompt_ids, previous.segments).reason == "retry"  # the same prompt again
    ids, segments = second([USER, Message("user", [800], "user")])  # the generation was dropped
    check = check_prefix(previous, ids, segments)
    assert check.reason == "retry" and "not echoed" in check.detail


def test_short_restart_is_compaction():
    long_history = [USER] + [
        m for k in range(6) for m in (echoed(k, [500 + k] * 20), Message("tool", [700 + k] * 30, "tool"))
    ]
    previous = make_call(6, [*SYSTEM, *long_history], [600, 2])
    ids, segments = second([Message("user", [880] * 10, "user")])
    assert check_prefix(previous, ids, segments).reason == "compaction"


def test_first_call_and_new_root():
    ids, segments = render([Message("system", [1000, 1001], "system"), USER])
    assert check_prefix(None, ids, segments) == check_prefix(None, ids, segments, first_of_rollout=True)
    assert check_prefix(None, ids, segments).reason is None
    assert check_prefix(None, ids, segments, first_of_rollout=False).reason == "new_root"


@pytest.mark.parametrize("seed", range(4))
def test_forest_counts_harness_shaped_breaks(seed):
    """Append-only with retries, a subagent and a compaction; OpenClaw's moved context message."""
    rollout = synthetic_rollout(seed, mode="append", turns=6, retry_prob=0.5, subagent_at=2, compaction_at=4)
    forest = build_forest(rollout.calls, rollout_id=rollout.rollout_id)
    s = forest.stats
    retries = sum(1 for v in rollout.expected.values() if v == "dead_leaf")
    compactions = int(any(v == "compaction" for v in rollout.expected.values()))
    assert s.breaks_retry >= retries  # each continued sibling re-sends its dead sibling's prompt
    assert s.breaks_compaction == compactions
    assert s.breaks_drift == s.breaks_edited_history == s.breaks_harness_rewrite == 0
    assert s.new_roots == 1  # the subagent's first call
    assert s.prefix_extended + s.prefix_breaks + s.new_roots == s.calls - s.failed_calls - 1  # all but the first
    chat = synthetic_rollout(seed, mode="openclaw_chat", turns=5)
    cs = build_forest(chat.calls, rollout_id=chat.rollout_id).stats
    assert (cs.breaks_edited_history, cs.prefix_extended) == (4, 0)  # the context message moved every call


def test_recorded_checks_are_used_and_shown_by_inspect(tmp_path: Path):
    first = first_call()
    edited = Message("user", [*range(300, 305), 999, *range(306, 312)], "user")
    later = make_call(1, [*SYSTEM, edited, echoed(0), Message("tool", [700], "tool")], [510, 2])
    later.prefix = check_prefix(first, later.prompt_ids, later.segments)
    with CallLog(tmp_path / "calls.jsonl") as log:
        log.append(first)
        log.append(later)
    text, html_path = inspect_run(tmp_path, "r")
    assert "prefix extended 0, broke 1 (edited_history 1)" in text
    assert f"edited_history @{later.prefix.shared}/{len(first.full_ids)}" in text
    assert "call 1 vs call 0: edited_history, broke at token" in text
    assert "Prefix breaks" in html_path.read_text()
    (row,) = recording_stats(tmp_path)
    assert (row["prefix extended"], row["prefix breaks"]) == (0, 1)
