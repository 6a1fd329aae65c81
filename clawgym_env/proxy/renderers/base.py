"""What a renderer is: a conversation -> prompt token ids (with segments), generated ids -> structure.

A renderer belongs to a model family (its chat template and its native tool-call format). The proxy
asks it to render every request and parse every generation; `splice` lets it put an earlier
generation's raw ids in place of an echoed assistant turn (token-in, token-out).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from clawgym_env.proxy.conversation import Conversation, Message, ToolCall
from clawgym_env.records import PromptSegment


@dataclass(slots=True)
class SplicedTurn:
    """The raw ids of an earlier generation to put in place of an echoed assistant turn."""

    token_ids: list[int]
    source_call: int
    ended_with_stop: bool  # the ids end with the template's end-of-turn token


# Given an echoed assistant message and the prompt ids rendered so far, return the generation to splice.
SpliceLookup = Callable[[Message, list[int]], SplicedTurn | None]


@dataclass(slots=True)
class RenderedPrompt:
    prompt_ids: list[int]
    segments: list[PromptSegment]
    drift_events: int = 0  # assistant turns that matched no recorded generation (re-tokenized)
    spliced_turns: int = 0
    control_token_texts: int = 0  # control tokens written as text in message content (encoded as plain text)


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

    def render(self, conversation: Conversation, splice: SpliceLookup | None = None) -> RenderedPrompt: ...

    def parse(self, generated_ids: list[int], tool_names: set[str] | None = None) -> ParsedOutput: ...

    def count_tokens(self, conversation: Conversation) -> int: ...
