"""Does a call's prompt extend the previous call of its agent? If not, where did it break, and why?

Token-in, token-out holds when every prompt begins with the previous call's prompt + generated ids: then
the rollout rebuilds to one branch and every sampled token sits where it was sampled. The proxy checks it
for each call (`check_prefix`, stored in `ModelCall.prefix`); reconstruction sums the outcomes into the
forest's statistics and `clawgym inspect` shows them per call.

The previous call is the latest completed call with the same root (leading system / tools / template
ids): calls of a subagent or a side call are compared with their own agent's calls. A break is explained
by what sits at the first differing token, in the previous prompt and in this one:

- `drift`: an echoed assistant turn (re-tokenized, or spliced from another generation than before);
- `edited_history`: an earlier user or tool message changed, or a message was inserted or removed;
- `harness_rewrite`: a mid-conversation system message (the harness's own instructions) changed;
- `compaction`: past the root, the prompt is under `compaction_ratio` of the previous full ids and new;
- `retry`: the prompt is a prefix of the previous call's ids, or the previous generation was not echoed.
"""

from __future__ import annotations

from collections.abc import Sequence

from clawgym_env.records import ModelCall, PrefixCheck, PrefixReason, PromptSegment

ROOT_KINDS = frozenset({"system", "tools", "template"})
ASSISTANT_KINDS = frozenset({"assistant_spliced", "assistant_rendered"})
RootKey = tuple[int, int] | None


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two id lists (slice comparisons run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] holds, a[:hi] == b[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def extends(prompt_ids: list[int], previous: ModelCall) -> bool:
    """Whether `prompt_ids` begins with the previous call's prompt + generated ids (no copy of them made)."""
    p, g = len(previous.prompt_ids), len(previous.generated_ids)
    return (
        len(prompt_ids) >= p + g
        and prompt_ids[p : p + g] == previous.generated_ids
        and prompt_ids[:p] == previous.prompt_ids
    )


def same_root(prompt_ids: list[int], segments: Sequence[PromptSegment], other: ModelCall) -> bool:
    """Whether two prompts have the same root (the same agent), comparing ids only when the lengths agree."""
    end = root_length(segments)
    return end == root_length(other.segments) and prompt_ids[:end] == other.prompt_ids[:end]


def root_length(segments: Sequence[PromptSegment]) -> int:
    """End of the leading run of system / tools / template segments (the agent's instructions)."""
    end = 0
    for seg in sorted(segments, key=lambda s: s.start):
        if seg.kind not in ROOT_KINDS or seg.start != end:
            break
        end = seg.end
    return end


def root_key(prompt_ids: list[int], segments: Sequence[PromptSegment]) -> RootKey:
    """What makes two calls the same agent: the ids of their root (None for calls without segments)."""
    if not segments:
        return None
    end = root_length(segments)
    return end, hash(tuple(prompt_ids[:end]))


def _segment_at(segments: Sequence[PromptSegment], position: int) -> PromptSegment | None:
    for seg in segments:
        if seg.start <= position < seg.end:
            return seg
    return None


def _message_kind(segments: Sequence[PromptSegment], position: int) -> str | None:
    """The kind of content at `position`; on a template token (a role header), the next content's kind."""
    seg = _segment_at(segments, position)
    if seg is None or seg.kind != "template":
        return seg.kind if seg is not None else None
    following = [s for s in segments if s.start >= seg.end and s.kind != "template"]
    return min(following, key=lambda s: s.start).kind if following else "template"


def check_prefix(
    previous: ModelCall | None,
    prompt_ids: list[int],
    segments: Sequence[PromptSegment],
    *,
    first_of_rollout: bool = True,
    compaction_ratio: float = 0.5,
) -> PrefixCheck:
    """Compare a prompt (and its segments) with the full ids of `previous`, the latest call of its agent."""
    if previous is None:
        if first_of_rollout:
            return PrefixCheck()
        return PrefixCheck(
            reason="new_root",
            detail="the first call with this system prompt and tool set (a subagent, a side call, or changed instructions)",
        )
    if extends(prompt_ids, previous):
        n = len(previous.prompt_ids) + len(previous.generated_ids)
        return PrefixCheck(previous_call=previous.call_index, shared=n, previous_length=n, extended=True)
    full = previous.prompt_ids + previous.generated_ids
    shared = common_prefix_length(prompt_ids, full)
    check = PrefixCheck(previous_call=previous.call_index, shared=shared, previous_length=len(full), extended=True)
    if shared == len(full):
        return check
    reason, detail = _explain(previous, full, prompt_ids, segments, shared, compaction_ratio)
    return check.model_copy(
        update={"extended": False, "reason": reason, "detail": f"broke at token {shared}: {detail}"}
    )


def _explain(
    previous: ModelCall,
    full: list[int],
    prompt_ids: list[int],
    segments: Sequence[PromptSegment],
    shared: int,
    compaction_ratio: float,
) -> tuple[PrefixReason, str]:
    prev_prompt = len(previous.prompt_ids)
    root = root_length(segments)
    if shared < len(prompt_ids) and len(prompt_ids) - root < compaction_ratio * (len(full) - root):
        return "compaction", (
            f"the prompt past its root is {len(prompt_ids) - root} ids, under {compaction_ratio:g} x the previous "
            f"call's {len(full) - root} (the harness summarized its history)"
        )
    if shared == len(prompt_ids):
        return (
            "retry",
            f"the prompt is a prefix of call {previous.call_index}'s ids (the harness re-sent an earlier prompt)",
        )
    here = _message_kind(segments, shared)
    last_prev = max(previous.segments, key=lambda s: s.end) if previous.segments else None
    at_generation = shared >= prev_prompt or (
        last_prev is not None
        and last_prev.kind == "template"
        and shared >= last_prev.start
        and last_prev.end == prev_prompt
    )
    if at_generation:
        seg = _segment_at(segments, shared)
        if here == "assistant_spliced" and seg is not None and seg.kind == "assistant_spliced":
            return (
                "drift",
                f"call {previous.call_index}'s generation was echoed but spliced from call {seg.source_call}",
            )
        if here == "assistant_rendered":
            return (
                "drift",
                f"the echo of call {previous.call_index}'s generation matched no recorded generation (re-tokenized)",
            )
        if here in ASSISTANT_KINDS:
            return "drift", f"the echo of call {previous.call_index}'s generation differs from its ids"
        if any(s.kind == "assistant_spliced" and s.source_call == previous.call_index for s in segments):
            return (
                "edited_history",
                f"a {here or 'new'} message was inserted before the echo of call {previous.call_index}'s generation",
            )
        return (
            "retry",
            f"call {previous.call_index}'s generation was not echoed (a retry, or the harness dropped the turn)",
        )
    before = _message_kind(previous.segments, shared)
    kinds = {before, here}
    if kinds & ASSISTANT_KINDS and not kinds & {"user", "tool"}:
        return "drift", f"an earlier assistant turn is echoed with other ids than in call {previous.call_index}"
    if "user" in kinds or "tool" in kinds or kinds & ASSISTANT_KINDS:
        kind = before if before in ("user", "tool") else here if here in ("user", "tool") else "message"
        return (
            "edited_history",
            f"an earlier {kind} message differs from call {previous.call_index}'s (changed, inserted or removed)",
        )
    return (
        "harness_rewrite",
        f"the harness changed its own instructions ({before or 'template'} text) since call {previous.call_index}",
    )
