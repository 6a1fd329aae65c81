"""Synthetic recordings shaped like the request patterns of real harnesses (docs/harnesses.md).

Used by the property tests, the benchmark and the docs' statistics until real recordings exist. Calls are
rendered ChatML-style on integer ids (`<|im_start|>role\\n ... <|im_end|>\\n`) with the prompt segments a
proxy records, so reconstruction sees what it would see from the proxy:

- "append" (Claude Code, Codex, pi, OpenClaw responses mode): call k+1's prompt extends call k's full ids;
- "openclaw_chat" (OpenClaw chat / anthropic modes): a trailing internal-context user message is always
  moved to the end, so each call's generation sits after a context message that the next call drops.

Each rollout can carry retries (a first attempt the harness discarded), failed calls, a context compaction
(a summarization call, then a restart from a short history) and a subagent (another system prompt).
`expected` says what the filters must decide for every call.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from clawgym_env.records import CallTimings, ModelCall, PromptSegment
from clawgym_env.specs import ApiStyle

IM_START, IM_END, NL = 1, 2, 3
ROLE_IDS = {"system": 4, "user": 5, "assistant": 6, "tool": 7}
FIRST_CONTENT_ID = 100

Mode = Literal["append", "openclaw_chat"]
Expected = Literal["main", "dead_leaf", "compaction", "subagent", "failed"]


@dataclass
class Message:
    role: str
    ids: list[int]
    kind: str  # segment kind of the content
    source_call: int | None = None  # for an assistant message: the call whose generation it is


@dataclass
class SyntheticRollout:
    rollout_id: str
    calls: list[ModelCall]
    expected: dict[int, Expected] = field(default_factory=dict)

    @property
    def total_call_tokens(self) -> int:
        return sum(len(c.prompt_ids) + len(c.generated_ids) for c in self.calls)


def render(messages: list[Message]) -> tuple[list[int], list[PromptSegment]]:
    """ChatML on ids, ending with the generation prompt; one segment per span."""
    ids: list[int] = []
    segs: list[PromptSegment] = []

    def add(tokens: list[int], kind: str, source_call: int | None = None) -> None:
        if tokens:
            segs.append(PromptSegment(start=len(ids), end=len(ids) + len(tokens), kind=kind, source_call=source_call))
            ids.extend(tokens)

    for m in messages:
        add([IM_START, ROLE_IDS[m.role], NL], "template")
        if m.role == "assistant" and m.source_call is not None:
            add(m.ids, "assistant_spliced", m.source_call)  # the recorded ids, stop token included
            add([NL], "template")
        else:
            add(m.ids, m.kind)
            add([IM_END, NL], "template")
    add([IM_START, ROLE_IDS["assistant"], NL], "template")
    return ids, segs


class _Recorder:
    """Hands out call indexes (with gaps) and makes ModelCalls with random generations."""

    def __init__(self, rng: random.Random, rollout_id: str, vocab: int, gaps: bool) -> None:
        self.rng, self.rollout_id, self.vocab, self.gaps = rng, rollout_id, vocab, gaps
        self.next_index = 0
        self.calls: list[ModelCall] = []
        self.expected: dict[int, Expected] = {}
        self.clock = 1_700_000_000.0

    def content(self, n: int) -> list[int]:
        return [self.rng.randrange(FIRST_CONTENT_ID, self.vocab) for _ in range(n)]

    def call(self, messages: list[Message], gen_len: int, role: Expected, *, error: bool = False) -> ModelCall:
        prompt, segs = render(messages)
        index = self.next_index
        self.next_index += self.rng.randint(1, 3) if self.gaps else 1
        gen = [] if error else self.content(gen_len) + [IM_END]
        generate_s = 0.002 * len(gen)
        self.clock += 0.05 + generate_s
        call = ModelCall(
            rollout_id=self.rollout_id,
            call_index=index,
            api_style=ApiStyle.ANTHROPIC_MESSAGES,
            request={"synthetic": True},
            prompt_ids=prompt,
            generated_ids=gen,
            logprobs=[-self.rng.random() * 3 for _ in gen],
            finish_reason="error" if error else "stop",
            segments=segs,
            error="HTTP 500 injected" if error else None,
            timings=CallTimings(
                received_at=self.clock, queue_s=0.001, generate_s=generate_s, total_s=generate_s + 0.01
            ),
        )
        self.calls.append(call)
        self.expected[index] = "failed" if error else role
        return call


def synthetic_rollout(
    seed: int,
    *,
    rollout_id: str = "r0",
    mode: Mode = "append",
    turns: int = 4,
    system_tokens: int = 30,
    tools_tokens: int = 20,
    user_tokens: int = 12,
    gen_tokens: tuple[int, int] = (20, 60),
    tool_tokens: tuple[int, int] = (20, 80),
    retry_prob: float = 0.0,
    fail_prob: float = 0.0,
    compaction_at: int | None = None,
    subagent_at: int | None = None,
    gaps: bool = False,
    vocab: int = 50_000,
) -> SyntheticRollout:
    """One rollout of `turns` agent turns (each turn: a generation, then a tool result)."""
    rng = random.Random(seed)
    rec = _Recorder(rng, rollout_id, vocab, gaps)
    system = [
        Message("system", rec.content(system_tokens), "system"),
        Message("system", rec.content(tools_tokens), "tools"),
    ]
    history: list[Message] = [Message("user", rec.content(user_tokens), "user")]
    role: Expected = "main"
    longest = 0

    def turn_call(hist: list[Message], agent_system: list[Message], who: Expected, ctx: Message | None) -> ModelCall:
        """One model call of a turn, with its failed attempts and retries; returns the continued call."""
        msgs = agent_system + hist + ([ctx] if ctx else [])
        while rng.random() < fail_prob:
            rec.call(msgs, 0, who, error=True)
        if rng.random() < retry_prob:
            rec.call(msgs, rng.randint(*gen_tokens), "dead_leaf" if who == "main" else who)
        return rec.call(msgs, rng.randint(*gen_tokens), who)

    for t in range(turns):
        ctx = Message("user", rec.content(8), "user") if mode == "openclaw_chat" else None
        if subagent_at == t:
            sub_system = [Message("system", rec.content(system_tokens // 2 + 1), "system")]
            sub_hist = [Message("user", rec.content(6), "user")]
            for _ in range(2):
                sub = rec.call(sub_system + sub_hist, rng.randint(3, 8), "subagent")
                sub_hist += [
                    Message("assistant", sub.generated_ids, "", sub.call_index),
                    Message("tool", rec.content(5), "tool"),
                ]
        if compaction_at == t and role == "main":
            summarize = Message("user", rec.content(6), "user")
            summary_call = turn_call(history + [summarize], system, "main", None)
            compacted = [Message("user", summary_call.generated_ids[:-1][:10] + rec.content(4), "user")]
            root = len(render(system)[0])  # system + tools + the next user header: what a restart keeps
            prompt_len = len(render(system + compacted)[0])
            if prompt_len - root < 0.5 * (longest - root):  # a real restart: far shorter past the root
                history, role = compacted, "compaction"
        call = turn_call(history, system, role, ctx)
        longest = max(longest, len(call.prompt_ids) + len(call.generated_ids)) if role == "main" else longest
        history = history + [
            Message("assistant", call.generated_ids, "", call.call_index),
            Message("tool", rec.content(rng.randint(*tool_tokens)), "tool"),
        ]
    _mark_unanswered_retries(rec)
    return SyntheticRollout(rollout_id=rollout_id, calls=rec.calls, expected=rec.expected)


def _mark_unanswered_retries(rec: _Recorder) -> None:
    """A retry whose winning sibling was never continued either (the last turn) is not a dead leaf."""
    spliced = {s.source_call for c in rec.calls for s in c.spliced_spans}
    by_prompt: dict[tuple[int, ...], list[ModelCall]] = {}
    for c in rec.calls:
        if c.error is None:
            by_prompt.setdefault(tuple(c.prompt_ids), []).append(c)
    for siblings in by_prompt.values():
        if not any(c.call_index in spliced for c in siblings):
            for c in siblings:
                if rec.expected[c.call_index] == "dead_leaf":
                    rec.expected[c.call_index] = "main"


def realistic_rollout(
    seed: int, rollout_id: str = "r0", mode: Mode = "append", total_tokens: int = 30_000
) -> SyntheticRollout:
    """A rollout of about `total_tokens` unique tokens shaped like a Claude Code session.

    About 2/3 of it is the system prompt and tool definitions (24 tools, 64 kB of JSON in the measured Claude Code requests), the
    rest 16 turns of ~300 generated and ~400 tool-output tokens, with an occasional retry.
    """
    turns = 16
    per_turn = max(40, (total_tokens // 3) // turns)
    return synthetic_rollout(
        seed,
        rollout_id=rollout_id,
        mode=mode,
        turns=turns,
        system_tokens=total_tokens // 9,
        tools_tokens=total_tokens * 5 // 9,
        user_tokens=60,
        gen_tokens=(per_turn * 3 // 7 - 20, per_turn * 3 // 7 + 20),
        tool_tokens=(per_turn * 4 // 7 - 40, per_turn * 4 // 7 + 40),
        retry_prob=0.1,
        vocab=151_000,
    )
