"""What every API adapter does: request body -> Conversation, finished call -> response (JSON or SSE)."""

from __future__ import annotations

import itertools
import operator
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from clawgym_env.chat import jsonio
from clawgym_env.chat.conversation import Conversation, Message, ToolCall
from clawgym_env.proxy.errors import ProxyError, validation_message
from clawgym_env.specs import ApiStyle

T = TypeVar("T")

STREAM_CHUNK_CHARS = 96  # text and argument deltas are cut into pieces of this size


class _IdMint:
    """Unique ids for responses and tool calls: a random per-process half and a counter (24 hex digits).

    They only need to be unique (a harness echoes them back; nothing is authorized by them), so a call
    does not pay a getrandom syscall per id; a forked child draws a fresh random half.
    """

    def __init__(self) -> None:
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)

    def reseed(self) -> None:
        self._base, self._counter = secrets.token_hex(6), itertools.count(int.from_bytes(secrets.token_bytes(3)))

    def __call__(self, prefix: str) -> str:
        return f"{prefix}{self._base}{next(self._counter) & 0xFFFFFFFFFFFF:012x}"


mint_id = _IdMint()


def chunks(text: str, size: int = STREAM_CHUNK_CHARS) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + jsonio.dumps(data) + b"\n\n"


class Permissive(BaseModel):
    """Request models accept unknown fields: harnesses send many we do not need."""

    model_config = ConfigDict(extra="allow")


Finish = Literal["stop", "length", "tool_calls"]


@dataclass(slots=True)
class CallOutput:
    """A finished generation, ready to be written in any API's format."""

    model: str
    created: int
    text: str
    reasoning: str | None
    tool_calls: list[ToolCall]  # ids minted by the adapter
    finish: Finish
    prompt_tokens: int
    completion_tokens: int
    response_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ValidatedItems:
    """One rollout's previous request's conversation items, as sent and as validated (`ApiAdapter.parse_request`).

    A harness resends the whole conversation every call, and the proxy's request sharing
    (clawgym_env.proxy.request_sharing) makes each repeated item *be* the earlier object. An item that is the
    very object validated last time is passed to pydantic as its validated model, which pydantic takes as it
    is (`revalidate_instances="never"`), so a call validates only what it adds; and that model's Messages
    are the ones made from it last call (`ApiAdapter.conversation_items`), so it converts only what it adds.
    The tools are treated the same way (`ApiAdapter.conversation_tools`): a harness sends the same ones
    every call, and some send dozens.
    """

    request_model: type[BaseModel] | None = None  # whose models these are (a rollout may speak two APIs)
    lists: dict[str, tuple[list[Any], list[Any]]] = field(default_factory=dict)  # field -> (as sent, validated)
    converted: dict[int, tuple[Any, list[Message]]] = field(default_factory=dict)  # id(model) -> its messages
    converted_items: tuple[Any, ...] = ()  # last call's validated items, in order...
    converted_messages: tuple[Message, ...] = ()  # ...and the Messages they gave, in order
    tools: tuple[list[Any], Any] | None = None  # last call's validated tools and what they were converted into


def _begins_with(items: Sequence[Any], old: Sequence[Any]) -> bool:
    """`items` begin with all of `old`, the very objects (an identity check per item, looped in C)."""
    return len(items) >= len(old) and all(map(operator.is_, items, old))


class ApiAdapter(ABC):
    style: ClassVar[ApiStyle]
    request_model: ClassVar[type[Permissive]]
    items_field: ClassVar[str] = "messages"  # the request's list of conversation items
    tools_field: ClassVar[str] = "tools"
    tool_call_id_prefix: ClassVar[str] = "call_"
    response_id_prefix: ClassVar[str] = "resp_"

    def parse_request(self, body: Any, previous: ValidatedItems | None = None) -> Any:
        """The validated request (400 naming the bad field); with `previous`, items validated last call are
        not validated again, and `previous` is updated for the next call."""
        if not isinstance(body, dict):
            raise ProxyError("invalid_request", "invalid request: the body must be a JSON object")
        names = (self.items_field, self.tools_field)
        data = body
        if previous is not None and previous.request_model is self.request_model:
            for name in names:
                items, seen = body.get(name), previous.lists.get(name)
                if isinstance(items, list) and seen is not None:
                    old, models = seen
                    if _begins_with(items, old):  # the append-only case
                        reused = models + items[len(old) :]
                    else:
                        reused = [
                            models[i] if i < len(old) and item is old[i] else item for i, item in enumerate(items)
                        ]
                    data = {**data, name: reused}
        try:
            request = self.request_model.model_validate(data)
        except ValidationError as exc:
            message, param = validation_message(exc)
            raise ProxyError("invalid_request", message, param) from None
        if previous is not None:
            if previous.request_model is not self.request_model:
                previous.request_model, previous.converted, previous.tools = self.request_model, {}, None
                previous.converted_items = previous.converted_messages = ()
            previous.lists = {
                name: (body[name], getattr(request, name))
                for name in names
                if isinstance(body.get(name), list) and isinstance(getattr(request, name, None), list)
            }
        return request

    @abstractmethod
    def to_conversation(self, request: Any, previous: ValidatedItems | None = None) -> Conversation:
        """The request as a Conversation; with `previous` (see `parse_request`), items seen last call are not
        converted again."""

    def item_messages(self, item: Any, param: str) -> list[Message]:
        """The Messages one conversation item (a message or an input item) stands for; `param` names it."""
        raise NotImplementedError

    def conversation_tools(
        self, tools: list[Any] | None, previous: ValidatedItems | None, convert: Callable[[], T]
    ) -> T:
        """`convert()` (the request's tools made into ToolSpecs), or last call's result when the validated tools
        are the very same models (`parse_request` passed them on): what they give cannot have changed."""
        seen = previous.tools if previous is not None else None
        if seen is not None and tools is not None and len(seen[0]) == len(tools):
            if all(a is b for a, b in zip(seen[0], tools)):
                return seen[1]
        result = convert()
        if previous is not None:
            previous.tools = (list(tools), result) if tools is not None else None
        return result

    def conversation_items(self, items: list[Any], param: str, previous: ValidatedItems | None) -> list[Message]:
        """`item_messages` of each item, reusing what the same validated model gave last call (Messages are
        never changed once made, so sharing them between calls is safe)."""
        memo = previous.converted if previous is not None else {}  # `parse_request` empties it for another API
        old = previous.converted_items if previous is not None else ()
        if previous is not None and old and _begins_with(items, old):
            # the items begin with all of last call's (the usual case): their Messages in one piece, the memo as
            # it is (each of its models is still here), and only the new items are walked
            start, out, made = len(old), list(previous.converted_messages), memo
        else:
            start, out, made = 0, [], {}
        for i in range(start, len(items)):
            item = items[i]
            seen = memo.get(id(item))
            messages = seen[1] if seen is not None and seen[0] is item else self.item_messages(item, f"{param}.{i}")
            made[id(item)] = (item, messages)  # holds the model, so its id is not reused while remembered
            out += messages
        if previous is not None:
            previous.converted, previous.converted_items, previous.converted_messages = made, tuple(items), tuple(out)
        return out

    @abstractmethod
    def requested_max_tokens(self, request: Any) -> int | None: ...

    def wants_stream(self, request: Any) -> bool:
        return bool(getattr(request, "stream", False))

    def finish_output(self, output: CallOutput) -> CallOutput:
        """Mint the response id and tool-call ids (the proxy's own; harnesses may rewrite them)."""
        output.response_id = mint_id(self.response_id_prefix)
        for call in output.tool_calls:
            call.id = mint_id(self.tool_call_id_prefix)
        return output

    @abstractmethod
    def response(self, output: CallOutput, request: Any) -> dict[str, Any]: ...

    @abstractmethod
    def events(self, output: CallOutput, request: Any) -> EventWriter:
        """An incremental SSE writer for one call (`output` holds the response id, model and prompt size)."""

    def stream(self, output: CallOutput, request: Any) -> list[bytes]:
        """The whole SSE answer of a finished call: the same events a live stream sends, cut in chunks."""
        writer = self.events(output, request)
        events = writer.start()
        if output.reasoning:
            events += writer.reasoning(output.reasoning)
        for piece in chunks(output.text) if output.text else []:
            events += writer.text(piece)
        for call in output.tool_calls:
            events += writer.tool_call(call)
        return events + writer.finish(output)


class EventWriter(ABC):
    """Writes one call's SSE events as its parts become known: start, reasoning, text deltas, tool calls
    (each whole, its arguments as deltas), then the finish (stop reason and usage). Block and item
    indices, ids and the final summary are kept here, so a live stream and a replayed one agree."""

    def __init__(self, output: CallOutput, request: Any) -> None:
        self.output, self.request = output, request

    @abstractmethod
    def start(self) -> list[bytes]: ...

    @abstractmethod
    def reasoning(self, text: str) -> list[bytes]: ...

    @abstractmethod
    def text(self, delta: str) -> list[bytes]: ...

    @abstractmethod
    def tool_call(self, call: ToolCall) -> list[bytes]:
        """`call.id` is set by the caller (minted once, so the final summary carries the same id)."""

    @abstractmethod
    def finish(self, output: CallOutput) -> list[bytes]: ...

    @abstractmethod
    def error(self, message: str) -> list[bytes]:
        """An error event after the stream has started (the status line, 200, is already sent)."""

    def keepalive(self) -> list[bytes]:
        """Sent while nothing else can go out for a while (text held back in a tool call being generated):
        an SSE comment line, which every SSE client skips; APIs with a ping event of their own override it."""
        return [b": keep-alive\n\n"]


def content_text(content: Any, param: str, allowed: tuple[str, ...] = ("text", "input_text", "output_text")) -> str:
    """Plain text of a content value: a string, or a list of parts whose text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
                continue
            if not isinstance(part, dict):
                raise ProxyError("invalid_request", f"{param}.{i} must be a content part object", f"{param}.{i}")
            kind = part.get("type")
            if kind in allowed or (kind is None and "text" in part):
                text = part.get("text")
                if not isinstance(text, str):
                    raise ProxyError("invalid_request", f"{param}.{i}.text must be a string", f"{param}.{i}.text")
                texts.append(text)
            elif kind in ("image", "image_url", "input_image"):
                texts.append("[image omitted]")
            elif kind in ("document", "input_file", "file"):
                texts.append("[file omitted]")
            elif kind == "refusal":
                texts.append(str(part.get("refusal", "")))
        return "\n\n".join(texts)
    raise ProxyError("invalid_request", f"{param} must be a string or a list of content parts", param)
