"""One normalized conversation, whichever API a request came in.

Each API adapter (clawgym_env.proxy.apis) turns its request into a `Conversation`; the renderer turns
a `Conversation` into prompt token ids. Plain dataclasses: this runs on every call and must be cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from clawgym_env.chat.jsonio import dumps_str

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(slots=True)
class ToolCall:
    """A tool call as echoed by the harness (or parsed from a generation).

    `arguments` is the parsed JSON object when the arguments parse as one, else the raw string.
    `id` is whatever the harness uses; matching never depends on it (harnesses rewrite ids).
    """

    name: str
    arguments: dict[str, Any] | str
    id: str | None = None


@dataclass(slots=True)
class Message:
    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None  # assistant thinking echoed back by the harness (not rendered by ChatML)
    tool_call_id: str | None = None  # for role "tool"


@dataclass(slots=True)
class ToolSpec:
    """A function tool, from any API, in the shape chat templates render: name, description, JSON schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def as_template_tool(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


class ToolSpecs(list[ToolSpec]):
    """A request's tools, as a list that also keeps what a renderer made of them (`rendered`, by renderer).

    An adapter hands all of a rollout's calls the same ToolSpecs while the tools repeat
    (`ApiAdapter.conversation_tools`), so a renderer makes its tools section once per rollout, and the
    section is freed with the rollout. The list is never changed once made.
    """

    __slots__ = ("rendered",)

    def __init__(self, specs: Any = ()) -> None:
        super().__init__(specs)
        self.rendered: dict[str, str] = {}


@dataclass(slots=True)
class Conversation:
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)

    @property
    def tool_names(self) -> set[str]:
        return {t.name for t in self.tools}


def parse_arguments(raw: Any) -> dict[str, Any] | str:
    """Tool-call arguments as a JSON object when they are one (OpenAI sends them as a JSON string)."""
    if isinstance(raw, dict):
        return raw
    if raw is None:
        return {}
    if isinstance(raw, str):
        text = raw.strip()
        if not text:
            return {}
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return raw
        return value if isinstance(value, dict) else raw
    return str(raw)


def canonical_arguments(arguments: dict[str, Any] | str) -> str:
    """Arguments in one canonical form (sorted keys, compact), so re-serialised echoes still match."""
    if isinstance(arguments, str):
        parsed = parse_arguments(arguments)
        if isinstance(parsed, str):
            return parsed.strip()
        arguments = parsed
    return dumps_str(_integral_floats_as_ints(arguments), sort_keys=True)


def _integral_floats_as_ints(value: Any) -> Any:
    """JavaScript harnesses re-serialise 1.0 as 1; make both sides agree."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_floats_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_floats_as_ints(v) for v in value]
    return value


def arguments_json(arguments: dict[str, Any] | str) -> str:
    """Arguments as the JSON string an OpenAI-style API returns."""
    if isinstance(arguments, str):
        return arguments
    return dumps_str(arguments)


def merge_consecutive_assistants(messages: list[Message]) -> list[Message]:
    """One generation is one assistant turn; some APIs split it (Responses items, Anthropic retries).

    A merge makes a new Message: the ones given may be shared with earlier calls (`ApiAdapter.conversation_items`).
    """
    merged: list[Message] = []
    for message in messages:
        if merged and message.role == "assistant" and merged[-1].role == "assistant":
            last = merged[-1]
            content = (
                f"{last.content}{message.content}"
                if last.content and message.content
                else (last.content or message.content)
            )
            reasoning = (last.reasoning or "") + message.reasoning if message.reasoning else last.reasoning
            merged[-1] = Message(
                "assistant", content, [*last.tool_calls, *message.tool_calls], reasoning, last.tool_call_id
            )
            continue
        merged.append(message)
    return merged
