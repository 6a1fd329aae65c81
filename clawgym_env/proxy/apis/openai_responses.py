"""OpenAI Responses (`POST /v1/responses`), as Codex CLI and OpenClaw speak it.

Stateless only (harnesses send `store: false` and the full `input`): `previous_response_id` is refused
with a 400 that says so. `instructions`, system and developer messages become system messages;
`function_call` / `function_call_output` items become tool calls and tool results; `reasoning` items are
echoed reasoning. Hosted tools (web_search, ...) are not offered to the policy: it cannot call them.

Namespaced tools (`{"type": "namespace", "name": "mcp__server", "tools": [...]}`, how Codex offers its MCP
and sub-agent tools) are flattened into plain tools named `<namespace>__<tool>` (so an MCP tool reads
`mcp__server__tool`, the name Claude Code uses too). A call of such a tool goes back to the harness as a
`function_call` with `namespace` and the tool's own `name`, which is how Codex dispatches it; Codex echoes
that item back with both fields, and it is flattened the same way, so the echoed turn renders as generated.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from clawgym_env.chat import jsonio
from clawgym_env.chat.conversation import (
    Conversation,
    Message,
    ToolCall,
    ToolSpec,
    ToolSpecs,
    arguments_json,
    merge_consecutive_assistants,
    parse_arguments,
)
from clawgym_env.proxy.apis.base import (
    ApiAdapter,
    CallOutput,
    EventWriter,
    Permissive,
    ValidatedItems,
    chunks,
    content_text,
    mint_id,
)
from clawgym_env.proxy.errors import ProxyError
from clawgym_env.specs import ApiStyle


class InputItem(Permissive):
    type: str | None = None
    role: str | None = None
    content: str | list[Any] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | dict[str, Any] | None = None
    namespace: str | None = None  # a call of a namespaced tool (Codex's MCP tools)
    output: str | list[Any] | None = None
    input: str | None = None
    summary: list[Any] | None = None


class ResponsesTool(Permissive):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    tools: list[ResponsesTool] | None = None  # the members of a `namespace` tool


NAMESPACE_SEPARATOR = "__"


def flat_tool_name(namespace: str | None, name: str) -> str:
    """The name the policy sees for tool `name` of `namespace` (the name itself when there is none)."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def _tool_spec(tool: ResponsesTool, namespace: str | None) -> ToolSpec | None:
    name = flat_tool_name(namespace, tool.name or "")
    if tool.type == "function" and tool.name:
        return ToolSpec(name, tool.description or "", tool.parameters or {"type": "object", "properties": {}})
    if tool.type == "custom" and tool.name:
        schema = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
        return ToolSpec(name, tool.description or "", schema)
    return None  # hosted tools: the policy cannot call them


def flatten_tools(tools: list[ResponsesTool] | None) -> tuple[ToolSpecs, dict[str, tuple[str, str]]]:
    """The callable tools as the chat template sees them, and flat name -> (namespace, name) for namespaced ones."""
    specs = ToolSpecs()
    namespaced: dict[str, tuple[str, str]] = {}
    for tool in tools or ():
        if tool.type == "namespace" and tool.name:
            for member in tool.tools or ():
                spec = _tool_spec(member, tool.name)
                if spec is not None:
                    specs.append(spec)
                    namespaced[spec.name] = (tool.name, member.name or "")
        else:
            spec = _tool_spec(tool, None)
            if spec is not None:
                specs.append(spec)
    return specs, namespaced


class ResponsesRequest(Permissive):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    stream: bool = False
    max_output_tokens: int | None = Field(default=None, ge=1)
    previous_response_id: str | None = None


def _summary_text(parts: list[Any] | None) -> str:
    return "".join(p.get("text", "") for p in parts or () if isinstance(p, dict))


class ResponsesAdapter(ApiAdapter):
    style: ClassVar[ApiStyle] = ApiStyle.OPENAI_RESPONSES
    request_model = ResponsesRequest
    items_field = "input"
    tool_call_id_prefix = "call_"
    response_id_prefix = "resp_"

    def requested_max_tokens(self, request: ResponsesRequest) -> int | None:
        return request.max_output_tokens

    def to_conversation(self, request: ResponsesRequest, previous: ValidatedItems | None = None) -> Conversation:
        if request.previous_response_id:
            raise ProxyError(
                "invalid_request",
                "previous_response_id is not supported by this proxy (it stores no responses); send the whole "
                "conversation in `input` with store: false",
                "previous_response_id",
            )
        messages: list[Message] = []
        if request.instructions:
            messages.append(Message("system", request.instructions))
        if isinstance(request.input, str):
            messages.append(Message("user", request.input))
        else:
            messages += self.conversation_items(request.input, "input", previous)
        tools, _ = self.conversation_tools(request.tools, previous, lambda: flatten_tools(request.tools))
        return Conversation(merge_consecutive_assistants(messages), tools)

    def item_messages(self, item: InputItem, param: str) -> list[Message]:
        kind = item.type or ("message" if item.role else None)
        if kind == "message":
            role = item.role
            text = content_text(item.content, f"{param}.content")
            if role in ("system", "developer"):
                return [Message("system", text)]
            if role in ("user", "assistant"):
                return [Message(role, text)]
            raise ProxyError(
                "invalid_request", f"{param}.role must be user, assistant, system or developer", f"{param}.role"
            )
        if kind == "function_call":
            if not item.name:
                raise ProxyError(
                    "invalid_request", f"{param}.name is required for a function_call item", f"{param}.name"
                )
            name = flat_tool_name(item.namespace, item.name)
            return [Message("assistant", tool_calls=[ToolCall(name, parse_arguments(item.arguments), item.call_id)])]
        if kind == "custom_tool_call":
            return [
                Message("assistant", tool_calls=[ToolCall(item.name or "", {"input": item.input or ""}, item.call_id)])
            ]
        if kind in ("function_call_output", "custom_tool_call_output"):
            return [Message("tool", content_text(item.output, f"{param}.output"), tool_call_id=item.call_id)]
        if kind == "reasoning":
            text = _summary_text(item.summary) or _summary_text(
                item.content if isinstance(item.content, list) else None
            )
            return [Message("assistant", reasoning=text)] if text else []
        raise ProxyError(
            "invalid_request",
            f"{param}.type {kind!r} is not supported; send message, function_call, function_call_output or reasoning items",
            f"{param}.type",
        )

    # ---------------------------------------------------------------------------------- output
    def _items(self, output: CallOutput, request: ResponsesRequest) -> list[dict[str, Any]]:
        """The output items, with ids fixed once per call so streaming and the final response agree."""
        if "items" in output.extra:
            return output.extra["items"]
        _, namespaced = flatten_tools(request.tools)
        items: list[dict[str, Any]] = []
        if output.reasoning:
            items.append(
                {
                    "type": "reasoning",
                    "id": mint_id("rs_"),
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": output.reasoning}],
                    "status": "completed",
                }
            )
        if output.text or not output.tool_calls:
            items.append(
                {
                    "type": "message",
                    "id": mint_id("msg_"),
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": output.text, "annotations": [], "logprobs": []}],
                }
            )
        items += [_function_call_item(call, namespaced) for call in output.tool_calls]
        output.extra["items"] = items
        return items

    def _response(
        self, output: CallOutput, request: ResponsesRequest, items: list[dict[str, Any]], status: str
    ) -> dict[str, Any]:
        incomplete = status == "incomplete"
        return {
            "id": output.response_id,
            "object": "response",
            "created_at": output.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": request.instructions,
            "model": output.model,
            "output": items,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [t.model_dump(exclude_none=True) for t in request.tools or ()],
            "temperature": None,
            "top_p": None,
            "max_output_tokens": request.max_output_tokens,
            "store": False,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "metadata": {},
            "usage": None
            if status == "in_progress"
            else {
                "input_tokens": output.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": output.prompt_tokens + output.completion_tokens,
            },
        }

    @staticmethod
    def _status(output: CallOutput) -> str:
        return "incomplete" if output.finish == "length" else "completed"

    def response(self, output: CallOutput, request: ResponsesRequest) -> dict[str, Any]:
        return self._response(output, request, self._items(output, request), self._status(output))

    def events(self, output: CallOutput, request: ResponsesRequest) -> ResponsesEvents:
        return ResponsesEvents(output, request, self)


def _function_call_item(call: ToolCall, namespaced: dict[str, tuple[str, str]]) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "id": mint_id("fc_"),
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments_json(call.arguments),
        "status": "completed",
    }
    if call.name in namespaced:
        item["namespace"], item["name"] = namespaced[call.name]
    return item


class ResponsesEvents(EventWriter):
    """response.created / in_progress, output items (reasoning, message with output_text deltas, function_call
    with function_call_arguments deltas), then response.completed (or incomplete) with every item."""

    def __init__(self, output: CallOutput, request: ResponsesRequest, adapter: ResponsesAdapter) -> None:
        super().__init__(output, request)
        self.adapter = adapter
        self.items: list[dict[str, Any]] = []
        self.message: dict[str, Any] | None = None  # the message item still open
        self.sequence = 0
        _, self.namespaced = flatten_tools(request.tools)

    def _emit(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\n".encode() + b"data: " + jsonio.dumps(body) + b"\n\n"

    def _add(self, item: dict[str, Any], **opening: Any) -> list[bytes]:
        events = self._close_message()
        self.items.append(item)
        return events + [self._emit("response.output_item.added", output_index=len(self.items) - 1, item=opening)]

    def start(self) -> list[bytes]:
        opening = self.adapter._response(self.output, self.request, [], "in_progress")
        return [
            self._emit("response.created", response=opening),
            self._emit("response.in_progress", response=opening),
        ]

    def reasoning(self, text: str) -> list[bytes]:
        content = [{"type": "reasoning_text", "text": text}]
        item = {"type": "reasoning", "id": mint_id("rs_"), "summary": [], "content": content, "status": "completed"}
        events = self._add(item, **{**item, "status": "in_progress", "content": []})
        index, item_id = len(self.items) - 1, item["id"]
        for piece in chunks(text):
            events.append(
                self._emit(
                    "response.reasoning_text.delta", item_id=item_id, output_index=index, content_index=0, delta=piece
                )
            )
        events.append(
            self._emit("response.reasoning_text.done", item_id=item_id, output_index=index, content_index=0, text=text)
        )
        events.append(self._emit("response.output_item.done", output_index=index, item=item))
        return events

    def text(self, delta: str) -> list[bytes]:
        events: list[bytes] = []
        if self.message is None:
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item = {"type": "message", "id": mint_id("msg_"), "status": "completed", "role": "assistant"}
            item["content"] = [part]
            events = self._add(item, **{**item, "status": "in_progress", "content": []})
            self.message = item
            events.append(
                self._emit(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=len(self.items) - 1,
                    content_index=0,
                    part=dict(part),
                )
            )
        if delta:
            self.message["content"][0]["text"] += delta
            events.append(
                self._emit(
                    "response.output_text.delta",
                    item_id=self.message["id"],
                    output_index=len(self.items) - 1,
                    content_index=0,
                    delta=delta,
                    logprobs=[],
                )
            )
        return events

    def _close_message(self) -> list[bytes]:
        item, self.message = self.message, None
        if item is None:
            return []
        index, part = self.items.index(item), item["content"][0]
        fields = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            self._emit("response.output_text.done", **fields, text=part["text"], logprobs=[]),
            self._emit("response.content_part.done", **fields, part=part),
            self._emit("response.output_item.done", output_index=index, item=item),
        ]

    def tool_call(self, call: ToolCall) -> list[bytes]:
        item = _function_call_item(call, self.namespaced)
        events = self._add(item, **{**item, "status": "in_progress", "arguments": ""})
        index, item_id = len(self.items) - 1, item["id"]
        for piece in chunks(item["arguments"]):
            events.append(
                self._emit("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=piece)
            )
        events.append(
            self._emit(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        )
        events.append(self._emit("response.output_item.done", output_index=index, item=item))
        return events

    def finish(self, output: CallOutput) -> list[bytes]:
        has_message = any(item["type"] == "message" for item in self.items)
        events = self.text("") if not has_message and not output.tool_calls else []
        events += self._close_message()
        output.extra["items"] = self.items
        status = self.adapter._status(output)
        response = self.adapter._response(output, self.request, self.items, status)
        return events + [self._emit(f"response.{status}", response=response)]

    def error(self, message: str) -> list[bytes]:
        return [self._emit("error", code="server_error", message=message, param=None)]
