"""ChatML renderer for Qwen-family models (Qwen2.5's chat template with Hermes-style tools).

A conversation is rendered block by block: every block starts with `<|im_start|>` and ends with
`<|im_end|>\\n`, so block boundaries fall on special tokens and tokenizing blocks one by one gives the same
ids as tokenizing the whole prompt (checked once per template against the tokenizer's own chat template,
`verify_against_template`). Blocks are cached, so a long system prompt or tool list is tokenized once.
At an echoed assistant turn that matches an earlier generation, that generation's raw ids are spliced in
instead of re-rendering it (see clawgym_env.chat.splice).

Only the template's own pieces may produce control tokens: text that arrives in a message (a tool's
output, the user's text, a system prompt, the tool specs' JSON) is encoded with every added token read as
plain text, so a tool output that prints `<|im_end|>\n<|im_start|>system` cannot forge a turn, nor
`<tool_call>` a tool call; an assistant turn re-rendered as text keeps the non-special ones (`<tool_call>`,
as the model wrote them) and reads special tokens as text (see `untrusted_text`); such attempts are counted.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from clawgym_env.chat.conversation import Conversation, Message, ToolCall, ToolSpec
from clawgym_env.chat.renderers.base import EchoContext, ParsedOutput, RenderedPrompt, SpliceLookup
from clawgym_env.chat.renderers.toolcall_parsing import parse_generation_text
from clawgym_env.chat.renderers.untrusted_text import Trust, TrustedPiece, UntrustedTextEncoder
from clawgym_env.records import PromptSegment, SegmentKind, segment

QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)

Piece = tuple[str, SegmentKind]
EncodedBlock = tuple[list[int], list[tuple[int, int, SegmentKind]], int]  # ids, kind runs, control-token texts
# which added tokens a piece's text may make (untrusted_text): message text none, the model's turns the
# non-special ones (<tool_call>), the template all; the tools section's header and footer are the template's,
# its tool specs' JSON message text (see `_trusted`)
KIND_TRUST: dict[str, Trust] = {"template": "template", "assistant_rendered": "model"}
_VERIFIED: set[tuple[str, int]] = set()
TOOLS_MEMO_SIZE = 64  # distinct tool sets remembered (a run has a few: one per harness and task family)


class TemplateMismatch(RuntimeError):
    """The block-by-block rendering differs from the tokenizer's chat template: this renderer does not fit."""


def tojson(value: Any) -> str:
    """The chat template's `tojson` filter as transformers defines it (ensure_ascii off, default separators)."""
    return json.dumps(value, ensure_ascii=False)


class ChatMLRenderer:
    """Renders conversations for Qwen2.5-style ChatML templates and parses Qwen generations.

    `tokenizer` is a transformers fast tokenizer whose chat template is Qwen2.5's (for example
    `clawgym_env.engines.tokenizer.load_qwen_tokenizer()`); `verify=True` checks that once.
    """

    name = "qwen-chatml"

    def __init__(
        self,
        tokenizer: Any,
        *,
        default_system: str = QWEN_DEFAULT_SYSTEM,
        verify: bool = True,
        cache_blocks: int = 4096,
    ) -> None:
        self.tokenizer = tokenizer
        self.default_system = default_system
        self._backend = tokenizer.backend_tokenizer
        self.im_end_id = self._token_id(IM_END)
        self.end_of_turn_id = self.im_end_id  # a generation that ends with it closes its turn
        self.end_of_text_id = self._backend.token_to_id(END_OF_TEXT)
        self.stop_token_ids: tuple[int, ...] = tuple(t for t in (self.im_end_id, self.end_of_text_id) if t is not None)
        # the blocks' encodings, least recently used dropped first; functools' C cache, safe across threads
        self._encode_pieces = functools.lru_cache(maxsize=cache_blocks)(self._encode_block)
        self._text = UntrustedTextEncoder(self._backend)
        self._tools_memo: dict[bytes, str] = {}  # tools JSON (orjson) -> the template's tools section
        self.generation_prompt: tuple[Piece, ...] = ((f"{IM_START}assistant\n", "template"),)
        self._after_stop = self._encode_pieces((("\n", "template"),))[0]
        self._close_turn = self._encode_pieces(((f"{IM_END}\n", "template"),))[0]
        self._cache_blocks = cache_blocks
        if verify:
            self.verify_against_template()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its constructor's arguments (a proxy shard builds its own; its caches are per process).
        Not verified again: this one was, and the tokenizer travels with it."""
        options = {"default_system": self.default_system, "verify": False, "cache_blocks": self._cache_blocks}
        return (functools.partial(type(self), **options), (self.tokenizer,))

    def _token_id(self, token: str) -> int:
        tid = self._backend.token_to_id(token)
        if tid is None:
            raise ValueError(f"ChatMLRenderer needs the token {token!r}, which this tokenizer lacks")
        return tid

    # ------------------------------------------------------------------------------------ blocks
    def _system_block(self, content: str, tools: list[ToolSpec]) -> tuple[Piece, ...]:
        if not tools:
            return ((f"{IM_START}system\n", "template"), (content, "system"), (f"{IM_END}\n", "template"))
        return (
            (f"{IM_START}system\n", "template"),
            (content, "system"),
            (self._tools_text(tools), "tools"),
            (f"{IM_END}\n", "template"),
        )

    def _tools_text(self, tools: list[ToolSpec]) -> str:
        """The system prompt's tools section, memoized: a harness sends the same tools every call, and the
        template's `tojson` (stdlib json, for its exact separators) costs ~25 us per tool per call.

        The key is orjson's encoding of the same dicts: equal keys mean equal values and key order, so equal
        `tojson` text; orjson writes NaN/Infinity as null, so a key holding null is not memoized. Making the
        key costs ~20 µs for 20 tools, so `ToolSpecs` also keep the section they got (`rendered`): a rollout's
        calls share one ToolSpecs while the tools repeat, so the key is made once per rollout.
        """
        rendered = getattr(tools, "rendered", None)  # ToolSpecs: a rollout's calls share one while tools repeat
        if rendered is None:
            return self._tools_text_of(tools)
        text = rendered.get("chatml")
        if text is None:
            text = rendered["chatml"] = self._tools_text_of(tools)
        return text

    def _tools_text_of(self, tools: list[ToolSpec]) -> str:
        dicts = [t.as_template_tool() for t in tools]
        try:
            key = orjson.dumps(dicts)
        except TypeError:  # not JSON orjson writes (a non-str key, a huge int): no memo
            key = b"null"
        text = self._tools_memo.get(key)
        if text is None:
            text = TOOLS_HEADER + "".join("\n" + tojson(d) for d in dicts) + TOOLS_FOOTER
            if b"null" not in key:
                if len(self._tools_memo) >= TOOLS_MEMO_SIZE:
                    self._tools_memo.pop(next(iter(self._tools_memo)), None)
                self._tools_memo[key] = text
        return text

    @staticmethod
    def _tool_call_text(call: ToolCall) -> str:
        return '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' + tojson(call.arguments) + "}\n</tool_call>"

    def _message_block(self, message: Message) -> tuple[Piece, ...]:
        role = message.role
        if role in ("user", "system"):
            return ((f"{IM_START}{role}\n", "template"), (message.content, role), (f"{IM_END}\n", "template"))
        if role == "assistant" and not message.tool_calls:
            return (
                (f"{IM_START}assistant\n", "template"),
                (message.content, "assistant_rendered"),
                (f"{IM_END}\n", "template"),
            )
        if role == "assistant":
            pieces: list[Piece] = [(f"{IM_START}assistant", "template")]
            body = ("\n" + message.content if message.content else "") + "".join(
                self._tool_call_text(c) for c in message.tool_calls
            )
            pieces.append((body, "assistant_rendered"))
            pieces.append((f"{IM_END}\n", "template"))
            return tuple(pieces)
        raise ValueError(f"unexpected role {role!r} outside a tool run")

    @staticmethod
    def _tool_run_block(run: list[Message]) -> tuple[Piece, ...]:
        pieces: list[Piece] = [(f"{IM_START}user", "template")]
        for message in run:
            pieces += [
                ("\n<tool_response>\n", "template"),
                (message.content, "tool"),
                ("\n</tool_response>", "template"),
            ]
        pieces.append((f"{IM_END}\n", "template"))
        return tuple(pieces)

    def _blocks(
        self, conversation: Conversation, start: int = 0
    ) -> Iterator[tuple[int, Message | None, tuple[Piece, ...] | None]]:
        """(messages rendered after it, message, pieces) per block from message `start` on (0: the system block
        first). `message` is set for assistant blocks (splice candidates), whose pieces are None: an echoed
        turn is usually spliced, so its text (and its tool calls' `tojson`, the costliest part) is made only
        if it is rendered (`_message_block`)."""
        messages = conversation.messages
        i = start
        if start == 0:
            if messages and messages[0].role == "system":
                i = 1
                yield i, None, self._system_block(messages[0].content, conversation.tools)
            else:
                yield i, None, self._system_block(self.default_system, conversation.tools)
        while i < len(messages):
            message = messages[i]
            if message.role == "tool":
                j = i
                while j < len(messages) and messages[j].role == "tool":
                    j += 1
                yield j, None, self._tool_run_block(messages[i:j])
                i = j
            elif message.role == "assistant":
                i += 1
                yield i, message, None
            else:
                i += 1
                yield i, None, self._message_block(message)

    # -------------------------------------------------------------------------------- tokenizing
    @staticmethod
    def _trusted(pieces: tuple[Piece, ...]) -> list[TrustedPiece]:
        trusted: list[TrustedPiece] = []
        for text, kind in pieces:
            if kind == "tools" and text.startswith(TOOLS_HEADER) and text.endswith(TOOLS_FOOTER):
                specs = text[len(TOOLS_HEADER) : len(text) - len(TOOLS_FOOTER)]
                trusted += [(TOOLS_HEADER, "template"), (specs, "plain"), (TOOLS_FOOTER, "template")]
            else:
                trusted.append((text, KIND_TRUST.get(kind, "plain")))
        return trusted

    def _encode_block(self, pieces: tuple[Piece, ...]) -> EncodedBlock:
        """Token ids of one block, its kind runs [(start, end, kind)] and how many control tokens its message
        text spelled out (called through `_encode_pieces`, its cache by the block's pieces). The usual case
        (nothing spelled out) is one pass over the whole block."""
        ids, offsets, forged = self._text.encode(self._trusted(pieces))
        bounds: list[tuple[int, SegmentKind]] = []  # (end char, kind) per piece
        pos = 0
        for piece_text, kind in pieces:
            pos += len(piece_text)
            bounds.append((pos, kind))
        runs: list[tuple[int, int, SegmentKind]] = []
        b = 0
        for t, (char_start, _) in enumerate(offsets):
            while b < len(bounds) - 1 and char_start >= bounds[b][0]:
                b += 1
            kind = bounds[b][1]
            if runs and runs[-1][2] == kind:
                runs[-1] = (runs[-1][0], t + 1, kind)
            else:
                runs.append((t, t + 1, kind))
        return ids, runs, forged

    # ------------------------------------------------------------------------------------ render
    def render(
        self, conversation: Conversation, splice: SpliceLookup | None = None, resume: Sequence[Any] = ()
    ) -> RenderedPrompt:
        """The prompt ids of `conversation`. `resume`: the `resume` of this rollout's recent renders, latest first
        (see `RenderResume`); where the conversation begins with one's messages, those are not walked again."""
        resumed = _resumable(resume, self, conversation)
        ids: list[int] = []
        spans: list[list[Any]] = []  # [start, end, kind, source_call]: models are made once, merged, at the end
        done: list[PromptSegment] = []  # the resumed prefix's segments (made by an earlier render)
        at = _Checkpoint(0, 0, 0, None, 0, 0, 0, 0)
        if resumed is not None:
            at = resumed.at
            ids, spans, done = resumed.ids[: at.length], [list(at.open_span)], resumed.segments[: at.closed]
        first, position, rewritten, spliced, forged = at.messages_done, at.position, at.rewritten, at.spliced, at.forged
        drift = 0

        def add(block_ids: list[int], runs: list[tuple[int, int, SegmentKind]], source: int | None = None) -> None:
            offset = len(ids)
            ids.extend(block_ids)
            for start, end, kind in runs:
                src = source if kind == "assistant_spliced" else None
                last = spans[-1] if spans else None
                if last is not None and last[2] == kind and last[3] == src and last[1] == offset + start:
                    last[1] = offset + end
                else:
                    spans.append([offset + start, offset + end, kind, src])

        header, header_runs, _ = self._encode_pieces(self.generation_prompt)
        checkpoint: _Checkpoint | None = None  # the state before the last block, while every turn was exact
        exact_so_far = True
        for messages_done, message, pieces in self._blocks(conversation, first):
            if exact_so_far and spans:
                closed, open_span = len(done) + len(spans) - 1, tuple(spans[-1])
                checkpoint = _Checkpoint(first, len(ids), closed, open_span, position, rewritten, spliced, forged)
            first = messages_done
            if message is not None and splice is not None:
                turn = splice(message, EchoContext(ids, header, position))
                position += 1
                if turn is not None:
                    exact_so_far = exact_so_far and turn.exact
                    spliced += 1
                    rewritten += turn.rewrite is not None
                    add(header, header_runs)
                    add(turn.token_ids, [(0, len(turn.token_ids), "assistant_spliced")], source=turn.source_call)
                    tail = self._after_stop if turn.ended_with_stop else self._close_turn
                    add(tail, [(0, len(tail), "template")])
                    continue
                drift += 1
                exact_so_far = False
            elif message is not None:
                position += 1
                exact_so_far = False  # nothing was matched: the next render looks again
            if pieces is None:  # an assistant turn rendered as text (no splice lookup, or drift)
                pieces = self._message_block(message)  # type: ignore[arg-type]
            block_ids, runs, block_forged = self._encode_pieces(pieces)
            forged += block_forged
            add(block_ids, runs)
        add(header, header_runs)
        segments = done + [segment(a, b, k, c) for a, b, k, c in spans]
        return RenderedPrompt(
            prompt_ids=ids,
            segments=segments,
            drift_events=drift,
            spliced_turns=spliced,
            rewritten_turns=rewritten,
            assistant_turns=position,
            control_token_texts=forged,
            resume=_resume_after(self, conversation, ids, segments, checkpoint),
            resumed=resumed,
        )

    def count_tokens(self, conversation: Conversation) -> int:
        return len(self.render(conversation).prompt_ids)

    # ------------------------------------------------------------------------------------- parse
    def decode(self, ids: list[int]) -> str:
        return self._backend.decode(ids, skip_special_tokens=False)

    def parse(self, generated_ids: list[int], tool_names: set[str] | None = None) -> ParsedOutput:
        ids = generated_ids
        while ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        return parse_generation_text(self.decode(ids), tool_names)

    # ------------------------------------------------------------------------------ verification
    @staticmethod
    def template_messages(conversation: Conversation) -> list[dict[str, Any]]:
        """The conversation as the dicts a Hugging Face chat template takes."""
        out: list[dict[str, Any]] = []
        for m in conversation.messages:
            d: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tool_calls:
                d["tool_calls"] = [
                    {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls
                ]
            out.append(d)
        return out

    def template_text(self, conversation: Conversation) -> str:
        """What the tokenizer's own chat template renders for the whole conversation."""
        tools = [t.as_template_tool() for t in conversation.tools] or None
        return self.tokenizer.apply_chat_template(
            self.template_messages(conversation), tools=tools, tokenize=False, add_generation_prompt=True
        )

    def check_conversation(self, conversation: Conversation) -> None:
        """Raise TemplateMismatch unless block-wise ids equal the tokenized whole-template rendering (message
        text encoded as text, as the renderer does: for text that spells no added token, the template's ids).
        Tool specs are the template's here (it writes them with `tojson`): specs that spell an added token
        differ, as the renderer encodes them as text."""
        tools = [t.as_template_tool() for t in conversation.tools] or None
        expected, _ = self._text.encode_chat(
            self.tokenizer,
            self.template_messages(conversation),
            trust={"assistant": "model"},
            tools=tools,
            add_generation_prompt=True,
        )
        got = self.render(conversation).prompt_ids
        if got != expected:
            at = next(
                (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), min(len(got), len(expected))
            )
            raise TemplateMismatch(
                f"{self.name}: block-wise rendering differs from the tokenizer's chat template at token {at} "
                f"(got {self.decode(got[at : at + 12])!r}, template {self.decode(expected[at : at + 12])!r}); "
                "this renderer only fits Qwen2.5-style ChatML templates: pass a matching renderer for this model"
            )

    def verify_against_template(self) -> None:
        """Once per (tokenizer, template): the probe conversations must render identically both ways."""
        template = getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise TemplateMismatch(f"{self.name}: the tokenizer has no chat template to check against")
        key = (str(getattr(self.tokenizer, "name_or_path", "")), hash(template))
        if key in _VERIFIED:
            return
        for conversation in probe_conversations():
            self.check_conversation(conversation)
        _VERIFIED.add(key)


def probe_conversations() -> list[Conversation]:
    """Conversations that exercise every branch of the template (tools, tool runs, mid-conversation system)."""
    tools = [
        ToolSpec(
            "write",
            "Write a file.",
            {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
        ),
        ToolSpec("ls", "List files — non-ASCII ✓.", {"type": "object", "properties": {}}),
    ]
    turns = [
        Message("user", "  Write hi.txt, then list.\n\n"),
        Message("system", "Mid-conversation system note."),
        Message("assistant", "Sure.", [ToolCall("write", {"path": "hi.txt", "content": "hi\n"}), ToolCall("ls", {})]),
        Message("tool", "ok", tool_call_id="a"),
        Message("tool", "\nhi.txt\n", tool_call_id="b"),
        Message("assistant", "", [ToolCall("ls", {"deep": True, "n": 1.5})]),
        Message("tool", "hi.txt"),
        Message("assistant", "Done: hi.txt exists."),
        Message("user", "Thanks! <tools> is literal here."),
    ]
    return [
        Conversation([Message("system", "You are a careful agent."), *turns], tools),
        Conversation(list(turns), tools),
        Conversation([Message("system", "Plain system."), *turns], []),
        Conversation([Message("user", "hello")], []),
    ]


# -------------------------------------------------------------------------------------- resuming
class _Checkpoint(NamedTuple):
    """A render's state between two blocks."""

    messages_done: int  # messages whose blocks are rendered
    length: int  # ids rendered
    closed: int  # spans that a next block cannot extend
    open_span: tuple[Any, ...] | None  # (start, end, kind, source_call) of the span ending at `length`: may grow
    position: int  # assistant turns rendered
    rewritten: int
    spliced: int
    forged: int


@dataclass(frozen=True, slots=True)
class RenderResume:
    """Where a render of one rollout left off, for the rollout's next render.

    A harness re-sends the whole conversation every call, and the next call's conversation begins with the
    last one's: re-walking it made every call cost more than the one before (a 32-call rollout rendered ~500
    blocks and looked up ~250 echoed turns). So a render keeps its state before its last block: the next
    render starts there when its conversation begins with the same messages (the last block is walked
    again: a tool run may go on in the next call). Only a prefix whose echoed turns were all spliced from
    the generation prompted with exactly the ids before them is kept: such a match cannot change (a later
    generation's prompt holds the turn itself), while a turn that drifted or matched another way is looked
    up again, as in a render from scratch.
    """

    renderer: Any
    system: tuple[str | None, Any]  # the first system message's text (None: the default) and the tool specs
    messages: list[Message]  # the conversation's first `at.messages_done` messages
    ids: list[int]  # the render's prompt ids (never changed once rendered); the first `at.length` hold those messages
    segments: list[PromptSegment]  # the render's segments; the first `at.closed` end before `at.length`
    at: _Checkpoint


def _system_of(conversation: Conversation) -> tuple[str | None, Any]:
    messages = conversation.messages
    return (messages[0].content if messages and messages[0].role == "system" else None, conversation.tools)


def _resume_after(
    renderer: ChatMLRenderer,
    conversation: Conversation,
    ids: list[int],
    segments: list[PromptSegment],
    checkpoint: _Checkpoint | None,
) -> RenderResume | None:
    if checkpoint is None or checkpoint.messages_done == 0:  # nothing past the system block to skip
        return None
    messages = conversation.messages[: checkpoint.messages_done]
    return RenderResume(renderer, _system_of(conversation), messages, ids, segments, checkpoint)


def _resumable(resumes: Sequence[Any], renderer: ChatMLRenderer, conversation: Conversation) -> RenderResume | None:
    """The first of `resumes` whose messages `conversation` begins with (same system text and tools), or None."""
    messages = conversation.messages
    system, tools = _system_of(conversation)
    for resume in resumes:
        if not isinstance(resume, RenderResume) or resume.renderer is not renderer:
            continue
        if system != resume.system[0] or not (tools is resume.system[1] or tools == resume.system[1]):
            continue  # another agent of the rollout (a subagent, a side call)
        done = resume.at.messages_done
        if len(messages) <= done or messages[:done] != resume.messages:  # identical objects compare in C
            continue
        if messages[done - 1].role == "tool" and messages[done].role == "tool":
            continue  # the covered tool run goes on in this conversation: it is one block here
        return resume
    return None
