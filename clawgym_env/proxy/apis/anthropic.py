"""Anthropic Messages (`POST /v1/messages`), as Claude Code, OpenClaw and pi speak it.

Accepted beyond the public API: `role: "system"` entries inside `messages` (Claude Code's
mid-conversation-system beta). Ignored: `cache_control` markers (they move between calls), thinking
signatures, sampling parameters (the rollout's limits decide sampling), server tools without a schema.
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
from clawgym_env.proxy.errors import ProxyError
from clawgym_env.specs import ApiStyle

SIGNATURE = "clawgym-local"  # thinking blocks need a signature; harnesses echo it back verbatim


class ContentBlock(Permissive):
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[Any] | None = None
    thinking: str | None = None
    is_error: bool | None = None


class AnthropicMessage(Permissive):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class AnthropicTool(Permissive):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class MessagesRequest(Permissive):
    """The fields of a Messages request the proxy reads; anything else is accepted and ignored."""

    model: str
    messages: list[AnthropicMessage]
    system: str | list[ContentBlock] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    tools: list[AnthropicTool] | None = None
    stream: bool = False


class CountTokensRequest(Permissive):
    model: str
    messages: list[AnthropicMessage]
    system: str | list[ContentBlock] | None = None
    tools: list[AnthropicTool] | None = None


def _blocks_text(blocks: str | list[ContentBlock] | None, param: str) -> str:
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    texts = []
    for j, block in enumerate(blocks):
        if block.type == "text":
            if block.text is None:
                raise ProxyError("invalid_request", f"{param}.{j}.text is required", f"{param}.{j}.text")
            texts.append(block.text)
    return "\n\n".join(texts)


def _tool_result_text(block: ContentBlock, param: str) -> str:
    text = content_text(block.content, f"{param}.content")
    return f"[error] {text}" if block.is_error and not text.startswith("[error]") else text


class AnthropicAdapter(ApiAdapter):
    style: ClassVar[ApiStyle] = ApiStyle.ANTHROPIC_MESSAGES
    request_model = MessagesRequest
    tool_call_id_prefix = "toolu_"
    response_id_prefix = "msg_"

    def requested_max_tokens(self, request: MessagesRequest) -> int | None:
        return request.max_tokens

    def item_messages(self, msg: AnthropicMessage, param: str) -> list[Message]:
        if isinstance(msg.content, str):
            return [Message(msg.role, msg.content)]
        if msg.role == "assistant":
            return [self._assistant(msg.content, f"{param}.content")]
        return self._user_or_system(msg.role, msg.content, f"{param}.content")

    def to_conversation(
        self, request: MessagesRequest | CountTokensRequest, previous: ValidatedItems | None = None
    ) -> Conversation:
        messages: list[Message] = []
        if request.system:
            messages.append(Message("system", _blocks_text(request.system, "system")))
        messages += self.conversation_items(request.messages, "messages", previous)
        tools = self.conversation_tools(
            request.tools,
            previous,
            lambda: ToolSpecs(
                ToolSpec(t.name, t.description or "", t.input_schema)
                for t in request.tools or ()
                if t.input_schema is not None
            ),
        )
        return Conversation(merge_consecutive_assistants(messages), tools)

    @staticmethod
    def _assistant(blocks: list[ContentBlock], param: str) -> Message:
        message = Message("assistant")
        texts: list[str] = []
        for j, block in enumerate(blocks):
            if block.type == "text":
                texts.append(block.text or "")
            elif block.type == "tool_use":
                if not block.name:
                    raise ProxyError(
                        "invalid_request", f"{param}.{j}.name is required for tool_use", f"{param}.{j}.name"
                    )
                message.tool_calls.append(ToolCall(block.name, block.input or {}, block.id))
            elif block.type == "thinking":
                message.reasoning = (message.reasoning or "") + (block.thinking or "")
        message.content = "".join(texts)
        return message

    @staticmethod
    def _user_or_system(role: str, blocks: list[ContentBlock], param: str) -> list[Message]:
        out: list[Message] = []
        texts: list[str] = []

        def flush() -> None:
            if texts:
                out.append(Message(role, "\n\n".join(texts)))  # type: ignore[arg-type]
                texts.clear()

        for j, block in enumerate(blocks):
            if block.type == "tool_result":
                flush()
                out.append(Message("tool", _tool_result_text(block, f"{param}.{j}"), tool_call_id=block.tool_use_id))
            elif block.type == "text":
                if block.text is None:
                    raise ProxyError("invalid_request", f"{param}.{j}.text is required", f"{param}.{j}.text")
                texts.append(block.text)
            elif block.type in ("image", "document"):
                texts.append(f"[{block.type} omitted]")
        flush()
        return out

    # ---------------------------------------------------------------------------------- output
    @staticmethod
    def stop_reason(output: CallOutput) -> str:
        return {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}[output.finish]

    @staticmethod
    def _usage(output: CallOutput) -> dict[str, int]:
        return {
            "input_tokens": output.prompt_tokens,
            "output_tokens": output.completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }

    def _content(self, output: CallOutput) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        if output.reasoning:
            content.append({"type": "thinking", "thinking": output.reasoning, "signature": SIGNATURE})
        if output.text or not output.tool_calls:
            content.append({"type": "text", "text": output.text})
        for call in output.tool_calls:
            content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
        return content

    def _message(self, output: CallOutput, content: list[dict[str, Any]], stop_reason: str | None) -> dict[str, Any]:
        return {
            "id": output.response_id,
            "type": "message",
            "role": "assistant",
            "model": output.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": self._usage(output),
        }

    def response(self, output: CallOutput, request: Any) -> dict[str, Any]:
        return self._message(output, self._content(output), self.stop_reason(output))

    def events(self, output: CallOutput, request: Any) -> AnthropicEvents:
        return AnthropicEvents(output, request, self)


class AnthropicEvents(EventWriter):
    """message_start, content blocks (thinking, text, tool_use with input_json_delta), message_delta, message_stop."""

    def __init__(self, output: CallOutput, request: Any, adapter: AnthropicAdapter) -> None:
        super().__init__(output, request)
        self.adapter = adapter
        self.index = -1  # the latest block's index
        self.open: str | None = None  # the kind of the block still open
        self.had_text = False

    def _block(self, opening: dict[str, Any], deltas: list[dict[str, Any]], keep_open: bool = False) -> list[bytes]:
        events = self._close()
        self.index += 1
        events.append(
            sse({"type": "content_block_start", "index": self.index, "content_block": opening}, "content_block_start")
        )
        events += [self._delta(d) for d in deltas]
        if keep_open:
            self.open = opening["type"]
        else:
            events.append(sse({"type": "content_block_stop", "index": self.index}, "content_block_stop"))
        return events

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse({"type": "content_block_delta", "index": self.index, "delta": delta}, "content_block_delta")

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [sse({"type": "content_block_stop", "index": self.index}, "content_block_stop")]

    def start(self) -> list[bytes]:
        message = self.adapter._message(self.output, [], None)
        message["usage"] = {**self.adapter._usage(self.output), "output_tokens": 0}
        return [sse({"type": "message_start", "message": message}, "message_start"), sse({"type": "ping"}, "ping")]

    def reasoning(self, text: str) -> list[bytes]:
        deltas = [{"type": "thinking_delta", "thinking": c} for c in chunks(text)]
        deltas.append({"type": "signature_delta", "signature": SIGNATURE})
        return self._block({"type": "thinking", "thinking": "", "signature": ""}, deltas)

    def text(self, delta: str) -> list[bytes]:
        events = [] if self.open == "text" else self._block({"type": "text", "text": ""}, [], keep_open=True)
        self.had_text = True
        if delta:
            events.append(self._delta({"type": "text_delta", "text": delta}))
        return events

    def tool_call(self, call: ToolCall) -> list[bytes]:
        opening = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": c} for c in chunks(arguments_json(call.arguments))]
        return self._block(opening, deltas)

    def finish(self, output: CallOutput) -> list[bytes]:
        events = self.text("") if not self.had_text and not output.tool_calls else []  # an empty text block
        events += self._close()
        usage = self.adapter._usage(output)
        stop = {"stop_reason": self.adapter.stop_reason(output), "stop_sequence": None}
        events.append(sse({"type": "message_delta", "delta": stop, "usage": usage}, "message_delta"))
        events.append(sse({"type": "message_stop"}, "message_stop"))
        return events

    def error(self, message: str) -> list[bytes]:
        return [sse({"type": "error", "error": {"type": "api_error", "message": message}}, "error")]

    def keepalive(self) -> list[bytes]:
        return [sse({"type": "ping"}, "ping")]  # the Messages API's own keep-alive event


class CountTokensAdapter(AnthropicAdapter):
    request_model = CountTokensRequest
