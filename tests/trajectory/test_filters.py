"""Unit tests of reconstruction and of each filter on small hand-made call sets."""

from __future__ import annotations

import numpy as np
import pytest

from clawgym_env.records import ModelCall, PromptSegment
from clawgym_env.specs import ApiStyle, ForestOptions
from clawgym_env.trajectory.forest import SOURCE_CODE
from clawgym_env.trajectory.reconstruct import build_forest
from clawgym_env.trajectory.synthetic_recordings import synthetic_rollout

SYS = [1, 4, 3, 11, 12, 13, 2, 3]  # <|im_start|>system\n ... <|im_end|>\n
USER = [1, 5, 3, 21, 22, 2, 3, 1, 6, 3]  # user message, then the generation prompt


def seg(start: int, end: int, kind: str, source_call: int | None = None) -> PromptSegment:
    return PromptSegment(start=start, end=end, kind=kind, source_call=source_call)


def call(index: int, prompt: list[int], gen: list[int], segments: list[PromptSegment] | None = None, **kw) -> ModelCall:
    return ModelCall(
        rollout_id="r",
        call_index=index,
        api_style=ApiStyle.OPENAI_CHAT,
        request={},
        prompt_ids=prompt,
        generated_ids=gen,
        logprobs=[-(index + 1) / 10 - k / 100 for k in range(len(gen))],
        segments=segments if segments is not None else [seg(0, 8, "system"), seg(8, len(prompt), "user")],
        **kw,
    )


def test_spliced_generation_stays_generated_with_its_original_logprob() -> None:
    first = call(0, SYS + USER, [50, 51, 2])
    prompt2 = SYS + USER + [50, 51, 2] + [3, 1, 7, 3, 60, 2, 3, 1, 6, 3]
    segs2 = [seg(0, 8, "system"), seg(8, 18, "user"), seg(18, 21, "assistant_spliced", 0), seg(21, 28, "tool")]
    second = call(1, prompt2, [70, 2], segs2)
    forest = build_forest([second, first], rollout_id="r")
    assert forest.branch_tokens() == [prompt2 + [70, 2]]
    gen = np.flatnonzero(forest.generated)
    assert forest.tokens[gen].tolist() == [50, 51, 2, 70, 2]
    # the recorded float log-probs stored as float32: within half an ulp (3e-8 relative) of the float64 literals
    np.testing.assert_allclose(forest.logprobs[gen], [-0.1, -0.11, -0.12, -0.2, -0.21], rtol=1e-6)
    assert forest.call_index[gen].tolist() == [0, 0, 0, 1, 1]
    assert forest.source[21] == SOURCE_CODE["tool"] and forest.source[0] == SOURCE_CODE["system"]
    assert forest.stats.relocated_splice_tokens == 0


def test_spliced_tokens_of_a_missing_call_are_context_marked_as_spliced() -> None:
    prompt2 = SYS + USER + [50, 51, 2, 3]
    segs2 = [seg(0, 8, "system"), seg(8, 18, "user"), seg(18, 21, "assistant_spliced", 0), seg(21, 22, "template")]
    forest = build_forest([call(5, prompt2, [70, 2], segs2)], rollout_id="r")  # call 0 was never recorded
    assert not forest.generated[18:21].any()
    assert (forest.source[18:21] == SOURCE_CODE["assistant_spliced"]).all()
    assert forest.stats.relocated_splice_tokens == 3


def test_retry_loser_is_a_dead_leaf_and_removed() -> None:
    loser, winner = call(0, SYS + USER, [40, 2]), call(1, SYS + USER, [50, 2])
    next_call = call(2, SYS + USER + [50, 2, 3, 1, 7, 3, 9, 2, 3], [60, 2])
    forest = build_forest([loser, winner, next_call], rollout_id="r")
    assert forest.stats.dead_leaves_removed == 1
    assert 40 not in forest.tokens.tolist()
    assert forest.num_branches == 1
    assert {"call_index": 0, "filter": "dead_leaf", "reason": "retry not continued"} in forest.metadata["filtered"]
    kept = build_forest([loser, winner, next_call], rollout_id="r", options=ForestOptions(drop_dead_leaves=False))
    assert kept.num_branches == 2 and kept.stats.dead_leaves_removed == 0


def test_retries_that_nobody_continued_are_both_kept() -> None:
    forest = build_forest([call(0, SYS + USER, [40, 2]), call(1, SYS + USER, [50, 2])], rollout_id="r")
    assert forest.stats.dead_leaves_removed == 0 and forest.num_branches == 2


def test_openclaw_style_retry_continued_by_splicing_elsewhere() -> None:
    """Non-prefix harness: the winner is continued only by being spliced into a reordered later prompt."""
    r = synthetic_rollout(7, mode="openclaw_chat", turns=3, retry_prob=1.0)
    forest = build_forest(r.calls, rollout_id="r0")
    assert forest.stats.dead_leaves_removed == list(r.expected.values()).count("dead_leaf") == 2
    assert forest.stats.relocated_splice_tokens > 0  # the spliced copies are context, generated only once
    assert int(forest.generated.sum()) == sum(
        len(c.generated_ids) for c in r.calls if r.expected[c.call_index] == "main"
    )


def test_compaction_is_set_aside_or_merged_on_request() -> None:
    r = synthetic_rollout(3, turns=6, compaction_at=4)
    assert "compaction" in r.expected.values()
    forest = build_forest(r.calls, rollout_id="r0")
    n_compaction = list(r.expected.values()).count("compaction")
    assert forest.stats.compaction_calls_set_aside == n_compaction and forest.stats.compaction_trees == 1
    (aux,) = forest.auxiliary
    assert aux.metadata["auxiliary_reason"] == "compaction" and aux.reward is None
    assert aux.num_branches == 1 and aux.num_tokens < forest.num_tokens
    merged = build_forest(r.calls, rollout_id="r0", options=ForestOptions(set_aside_compaction=False))
    assert merged.auxiliary == [] and merged.stats.compaction_calls_set_aside == 0
    # the restart shares the system prompt with the main tree: one root, early fork
    assert (merged.parents == -1).sum() == 1 and merged.num_branches == forest.num_branches + 1


def test_subagents_set_aside_by_default_and_kept_as_own_trees_when_asked() -> None:
    r = synthetic_rollout(5, turns=3, subagent_at=1)
    forest = build_forest(r.calls, rollout_id="r0")
    assert forest.stats.subagent_calls_set_aside == 2 and forest.auxiliary[0].metadata["auxiliary_reason"] == "subagent"
    assert (forest.parents == -1).sum() == 1
    kept = build_forest(r.calls, rollout_id="r0", options=ForestOptions(keep_subagent_trees=True))
    assert kept.auxiliary == [] and (kept.parents == -1).sum() == 2 and kept.stats.subagent_trees == 1
    assert kept.num_tokens == forest.num_tokens + forest.auxiliary[0].num_tokens


def test_main_root_is_the_one_with_most_generated_tokens() -> None:
    other_sys = [seg(0, 8, "system"), seg(8, 18, "user")]
    side = call(0, [1, 4, 3, 99, 98, 97, 2, 3] + USER, [5, 2], other_sys)  # a title call, first but tiny
    main = call(1, SYS + USER, list(range(200, 230)) + [2])
    forest = build_forest([side, main], rollout_id="r")
    assert forest.tokens[:8].tolist() == SYS and forest.stats.subagent_calls_set_aside == 1


def test_overfork_drops_the_rollout() -> None:
    calls = [call(i, SYS + USER, [40 + i, 2]) for i in range(5)]
    forest = build_forest(calls, rollout_id="r", options=ForestOptions(max_leaves=4))
    assert forest.status == "failed" and forest.failure.startswith("overfork") and forest.stats.dropped_overfork == 1
    assert build_forest(calls, rollout_id="r", options=ForestOptions(max_leaves=5)).ok


def test_empty_failed_and_crashed_rollouts_are_never_successes() -> None:
    empty = build_forest([], rollout_id="r", reward=0.0)
    assert empty.status == "empty" and empty.reward is None and empty.stats.empty_rollouts == 1
    bad = [call(0, SYS + USER, [], error="HTTP 500"), call(1, SYS + USER, [], error="HTTP 500")]
    failed = build_forest(bad, rollout_id="r", reward=0.0)
    assert failed.status == "failed" and "HTTP 500" in failed.failure and failed.stats.failed_calls == 2
    assert failed.reward is None
    crashed = build_forest([call(0, SYS + USER, [40, 2])], rollout_id="r", reward=0.0, failure="harness: exit 1")
    assert crashed.status == "failed" and crashed.failure == "harness: exit 1" and crashed.reward is None
    assert crashed.num_tokens > 0  # still built, for inspection


def test_failed_calls_are_counted_and_skipped() -> None:
    calls = [call(0, SYS + USER, [], error="timeout"), call(1, SYS + USER, [40, 2])]
    forest = build_forest(calls, rollout_id="r")
    assert forest.ok and forest.stats.failed_calls == 1 and forest.num_branches == 1


def test_bad_input_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="belongs to rollout"):
        build_forest([call(0, SYS, [1])], rollout_id="other")
    with pytest.raises(ValueError, match="twice"):
        build_forest([call(0, SYS, [1]), call(0, SYS, [2])], rollout_id="r")
    with pytest.raises(ValueError, match="outside its prompt"):
        build_forest([call(0, SYS, [1], [seg(0, 50, "system")])], rollout_id="r")
