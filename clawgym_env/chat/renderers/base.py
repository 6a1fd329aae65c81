"""What a renderer is: a conversation -> prompt token ids (with segments), generated ids -> structure.

A renderer belongs to a model family (its chat template and its native tool-call format). The proxy
asks it to render every request and parse every generation; `splice` lets it put an earlier
generation's raw ids in place of an echoed assistant turn (token-in, token-out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from clawgym_env.chat.conversation import Conversation, Message, ToolCall
from clawgym_env.records import PromptSegment


@dataclass(slots=True)
class SplicedTurn:
    """The raw ids of an earlier generation to put in place of an echoed assistant turn."""

    token_ids: list[int]
    source_call: int
    ended_with_stop: bool  # the ids end with the template's end-of-turn token
    rewrite: str | None = None  # the known harness rewrite undone to match the echo (None: matched as echoed)
    exact: bool = False  # the generation's prompt is exactly the prompt the echo sits after (the append-only case)


@dataclass(slots=True)
class EchoContext:
    """Where an echoed assistant turn sits: what the call that generated it would have been prompted with.

    `prompt_before` is the renderer's live list of ids rendered before the turn (read it, never keep it);
    the generating call's prompt ended with the template's generation prompt (`<|im_start|>assistant\n`
    for ChatML), so the prompt as that call saw it is `prompt_before + generation_prompt`.
    `position` counts the assistant turns before this one in the conversation.
    """

    prompt_before: list[int]
    generation_prompt: list[int]
    position: int

    @property
    def prompt_length(self) -> int:
        return len(self.prompt_before) + len(self.generation_prompt)

    def prompt_ids(self) -> list[int]:
        """The prompt the generating call saw, if the history before the turn is unchanged (a copy)."""
        return self.prompt_before + self.generation_prompt


# Given an echoed assistant message and its context, return the generation to splice (None: re-render it).
SpliceLookup = Callable[[Message, EchoContext], SplicedTurn | None]


@dataclass(slots=True)
class RenderedPrompt:
    prompt_ids: list[int]
    segments: list[PromptSegment]
    drift_events: int = 0  # assistant turns that matched no recorded generation (re-tokenized)
    spliced_turns: int = 0
    rewritten_turns: int = 0  # spliced turns matched only after undoing a known harness rewrite
    assistant_turns: int = 0  # assistant turns in the conversation (the position a new generation takes)
    control_token_texts: int = 0  # control tokens written as text in message content (encoded as plain text)
    resume: Any = None  # where the same rollout's next renders may start (renderer-specific; None: nowhere)
    resumed: Any = None  # the earlier render's `resume` this render started from (None: from the beginning)


@dataclass(slots=True)
class ParsedOutput:
    """A generation read back as structure: visible text, reasoning, and tool calls (ids not yet minted)."""

    text: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_format: str | None = None  # "tagged" | "bare_json" | "fenced_json" when tool calls were found


@runtime_checkable
class Renderer(Protocol):
    name: str
    stop_token_ids: tuple[int, ...]  # passed to the engine as stop ids
    end_of_turn_id: int  # the id that closes an assistant turn in the template (<|im_end|> for ChatML)

    def render(
        self, conversation: Conversation, splice: SpliceLookup | None = None, resume: Sequence[Any] = ()
    ) -> RenderedPrompt: ...

    def parse(self, generated_ids: list[int], tool_names: set[str] | None = None) -> ParsedOutput: ...

    def count_tokens(self, conversation: Conversation) -> int: ...


# Text where Qwen-family vocabularies differ (Qwen3 added <tool_response> and <think> as single tokens).
VOCABULARY_PROBE = (
    "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    '<think>\nx\n</think>\n<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call> héllo 世界<|im_end|>\n'
)
_FITTING: set[tuple[int, int]] = set()


def check_renderer_fits_engine(renderer: Any, engine: Any) -> None:
    """Refuse a policy whose renderer tokenizes differently from its engine's model.

    A prompt rendered with another model's tokenizer is ids the model reads as something else (Qwen3's
    <tool_response> id is a [PAD] token in Qwen2.5's vocabulary). Engines and renderers without a
    `tokenizer` attribute (remote engines) are not checked.
    """
    ours, theirs = getattr(renderer, "tokenizer", None), getattr(engine, "tokenizer", None)
    if ours is None or theirs is None or ours is theirs or (id(ours), id(theirs)) in _FITTING:
        return
    a = list(ours.encode(VOCABULARY_PROBE, add_special_tokens=False))
    b = list(theirs.encode(VOCABULARY_PROBE, add_special_tokens=False))
    if a != b:
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        raise ValueError(
            f"the renderer's tokenizer ({getattr(ours, 'name_or_path', '?')}) and the engine's "
            f"({getattr(theirs, 'name_or_path', '?')}) tokenize differently (token {at}: renderer id "
            f"{a[at] if at < len(a) else None} {ours.decode(a[at : at + 1])!r}, engine id {b[at] if at < len(b) else None} "
            f"{theirs.decode(b[at : at + 1])!r}): build the renderer from the engine's tokenizer, e.g. "
            "clawgym_env.policies.make_policy(model)"
        )
    _FITTING.add((id(ours), id(theirs)))
