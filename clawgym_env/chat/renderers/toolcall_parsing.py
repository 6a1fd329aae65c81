"""Reading tool calls and reasoning out of generated text.

Qwen models emit `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; Qwen2.5-Coder-0.5B (the
default learning policy) instead emits bare JSON objects or ```json-fenced ones. All three are accepted.
Bare and fenced JSON only count as a tool call when it names a tool the request offered (when tools were
offered), so a JSON answer is not mistaken for a call.
"""

from __future__ import annotations

import json
import re
from typing import Any

from clawgym_env.chat.conversation import ToolCall, parse_arguments
from clawgym_env.chat.renderers.base import ParsedOutput

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_FENCED = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)\n?```", re.DOTALL)
_DECODER = json.JSONDecoder()


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, rest) for `<think>…</think>` output; an unterminated think block is all reasoning."""
    stripped = text.lstrip()
    if "</think>" in text:
        head, _, rest = text.partition("</think>")
        reasoning = head.split("<think>", 1)[-1]
        return reasoning.strip(), rest
    if stripped.startswith("<think>"):
        return stripped[len("<think>") :].strip(), ""
    return None, text


def _as_tool_call(obj: Any, tool_names: set[str] | None, strict: bool) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if strict and tool_names is not None and obj["name"] not in tool_names:
        return None
    raw_args = obj.get("arguments", obj.get("parameters", {}))
    arguments = parse_arguments(raw_args)
    if isinstance(arguments, str):
        if strict:
            return None
        arguments = {"_raw": arguments}  # tagged but unparsable arguments: keep them visible to the harness
    if strict and set(obj) - {"name", "arguments", "parameters"}:
        return None
    return ToolCall(name=obj["name"], arguments=arguments)


def calls_from_json(value: Any, tool_names: set[str] | None, strict: bool) -> list[ToolCall] | None:
    """The tool calls a parsed JSON value holds (one object or a list of them), or None if any item is not one
    (`strict`: no keys beyond name / arguments / parameters; `tool_names`: only these names)."""
    items = value if isinstance(value, list) else [value]
    calls = [_as_tool_call(item, tool_names, strict) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def _tagged_calls(text: str, tool_names: set[str] | None) -> tuple[list[ToolCall], str] | None:
    if "<tool_call>" not in text:
        return None
    calls: list[ToolCall] = []
    for body in _TAGGED.findall(text):
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            continue
        found = calls_from_json(value, tool_names, strict=False)
        if found:
            calls.extend(found)
    if not calls:
        return None
    return calls, _TAGGED.sub("", text)


def _fenced_calls(text: str, tool_names: set[str] | None) -> tuple[list[ToolCall], str] | None:
    calls: list[ToolCall] = []
    spans: list[tuple[int, int]] = []
    for match in _FENCED.finditer(text):
        try:
            value = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        found = calls_from_json(value, tool_names, strict=True)
        if found:
            calls.extend(found)
            spans.append(match.span())
    if not calls:
        return None
    return calls, _cut(text, spans)


def _bare_calls(text: str, tool_names: set[str] | None) -> tuple[list[ToolCall], str] | None:
    """JSON objects (or lists of them) that start a line."""
    calls: list[ToolCall] = []
    spans: list[tuple[int, int]] = []
    pos = 0
    while pos < len(text):
        start = _next_json_start(text, pos)
        if start < 0:
            break
        try:
            value, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError:
            pos = start + 1
            continue
        found = calls_from_json(value, tool_names, strict=True)
        if found:
            calls.extend(found)
            spans.append((start, end))
        pos = end
    if not calls:
        return None
    return calls, _cut(text, spans)


def _next_json_start(text: str, pos: int) -> int:
    lead = len(text) - len(text.lstrip())
    for i in range(pos, len(text)):
        if text[i] in "{[" and (i == lead or text[i - 1] == "\n"):
            return i
    return -1


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    out, last = [], 0
    for start, end in spans:
        out.append(text[last:start])
        last = end
    out.append(text[last:])
    return "".join(out)


def parse_generation_text(text: str, tool_names: set[str] | None = None) -> ParsedOutput:
    """Split decoded generated text (special end tokens already removed) into reasoning, text and tool calls."""
    reasoning, rest = split_reasoning(text)
    for fmt, finder in (("tagged", _tagged_calls), ("fenced_json", _fenced_calls), ("bare_json", _bare_calls)):
        found = finder(rest, tool_names if tool_names else None)
        if found:
            calls, remaining = found
            return ParsedOutput(text=remaining.strip(), reasoning=reasoning, tool_calls=calls, tool_call_format=fmt)
    return ParsedOutput(text=rest.strip(), reasoning=reasoning)
