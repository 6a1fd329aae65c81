"""OpenAI Chat Completions (`POST /v1/chat/completions`), as OpenClaw and pi speak it.

`developer` messages count as system messages; legacy `function` messages as tool results. Reasoning
the policy produced (`<think>`) is returned as `reasoning_content` (the vLLM / DeepSeek convention) and
accepted back as `reasoning_content` or `reasoning`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

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
    sse,
)
from clawgym_env.proxy.errors import ProxyError, error_body
from clawgym_env.specs import ApiStyle


class ChatFunctionCall(Permissive):
    name: str
    arguments: str | dict[str, Any] | None = None


class ChatToolCall(Permissive):
    id: str | None = None
    type: str = "function"
    function: ChatFunctionCall


class ChatMessage(Permissive):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[Any] | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class ChatFunction(Permissive):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatTool(Permissive):
    type: str = "function"
    function: ChatFunction


class StreamOptions(Permissive):
    include_usage: bool = False


class ChatCompletionRequest(Permissive):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1, le=1, description="only n=1 is supported")


class ChatAdapter(ApiAdapter):
    style: ClassVar[ApiStyle] = ApiStyle.OPENAI_CHAT
    request_model = ChatCompletionRequest
    tool_call_id_prefix = "call_"
    response_id_prefix = "chatcmpl-"

    def requested_max_tokens(self, request: ChatCompletionRequest) -> int | None:
        return request.max_completion_tokens or request.max_tokens

    def item_messages(self, msg: ChatMessage, param: str) -> list[Message]:
        text = content_text(msg.content, f"{param}.content")
        if msg.role in ("system", "developer"):
            return [Message("system", text)]
        if msg.role == "user":
            return [Message("user", text)]
        if msg.role in ("tool", "function"):
            return [Message("tool", text, tool_call_id=msg.tool_call_id)]
        calls = [ToolCall(c.function.name, parse_arguments(c.function.arguments), c.id) for c in msg.tool_calls or ()]
        return [Message("assistant", text, calls, reasoning=msg.reasoning_content or msg.reasoning)]

    def to_conversation(self, request: ChatCompletionRequest, previous: ValidatedItems | None = None) -> Conversation:
        messages = self.conversation_items(request.messages, "messages", previous)
        tools = self.conversation_tools(request.tools, previous, lambda: self._tool_specs(request.tools))
        return Conversation(merge_consecutive_assistants(messages), tools)

    @staticmethod
    def _tool_specs(tools: list[ChatTool] | None) -> ToolSpecs:
        specs = ToolSpecs()
        for j, tool in enumerate(tools or ()):
            if tool.type != "function":
                raise ProxyError(
                    "invalid_request",
                    f"tools.{j}.type {tool.type!r} is not supported; use 'function'",
                    f"tools.{j}.type",
                )
            specs.append(
                ToolSpec(
                    tool.function.name,
                    tool.function.description or "",
                    tool.function.parameters or {"type": "object", "properties": {}},
                )
            )
        return specs

    # ---------------------------------------------------------------------------------- output
    @staticmethod
    def _usage(output: CallOutput) -> dict[str, int]:
        return {
            "prompt_tokens": output.prompt_tokens,
            "completion_tokens": output.completion_tokens,
            "total_tokens": output.prompt_tokens + output.completion_tokens,
        }

    def response(self, output: CallOutput, request: Any) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": output.text if (output.text or not output.tool_calls) else None,
        }
        if output.reasoning:
            message["reasoning_content"] = output.reasoning
        if output.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": arguments_json(c.arguments)}}
                for c in output.tool_calls
            ]
        return {
            "id": output.response_id,
            "object": "chat.completion",
            "created": output.created,
            "model": output.model,
            "choices": [{"index": 0, "message": message, "finish_reason": output.finish, "logprobs": None}],
            "usage": self._usage(output),
        }

    def events(self, output: CallOutput, request: ChatCompletionRequest) -> ChatEvents:
        return ChatEvents(output, request, self)


class ChatEvents(EventWriter):
    """chat.completion.chunk deltas: role, reasoning_content, content, tool_calls (argument deltas), finish."""

    def __init__(self, output: CallOutput, request: ChatCompletionRequest, adapter: ChatAdapter) -> None:
        super().__init__(output, request)
        self.adapter = adapter
        self.include_usage = bool(request.stream_options and request.stream_options.include_usage)
        self.base = {
            "id": output.response_id,
            "object": "chat.completion.chunk",
            "created": output.created,
            "model": output.model,
        }
        self.tools = 0

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        body: dict[str, Any] = {
            **self.base,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    def start(self) -> list[bytes]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def reasoning(self, text: str) -> list[bytes]:
        return [self._chunk({"reasoning_content": c}) for c in chunks(text)]

    def text(self, delta: str) -> list[bytes]:
        return [self._chunk({"content": delta})] if delta else []

    def tool_call(self, call: ToolCall) -> list[bytes]:
        index, self.tools = self.tools, self.tools + 1
        opening = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        events = [self._chunk({"tool_calls": [opening]})]
        events += [
            self._chunk({"tool_calls": [{"index": index, "function": {"arguments": c}}]})
            for c in chunks(arguments_json(call.arguments))
        ]
        return events

    def finish(self, output: CallOutput) -> list[bytes]:
        events = [self._chunk({}, output.finish)]
        if self.include_usage:
            events.append(sse({**self.base, "choices": [], "usage": self.adapter._usage(output)}))
        events.append(b"data: [DONE]\n\n")
        return events

    def error(self, message: str) -> list[bytes]:
        return [sse(error_body(ApiStyle.OPENAI_CHAT, "engine_error", message))]
