"""The ChatML renderer against the tokenizer's own chat template, and the tool-call parser."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from clawgym_env.chat.conversation import Conversation, Message, ToolCall, ToolSpec, canonical_arguments
from clawgym_env.chat.renderers import (
    ChatMLRenderer,
    EchoContext,
    SplicedTurn,
    TemplateMismatch,
    parse_generation_text,
)
from clawgym_env.chat.renderers.chatml import probe_conversations
from clawgym_env.chat.splice import GenerationMemory, strip_leading_cd
from clawgym_env.proxy.apis import AnthropicAdapter, ChatAdapter, ResponsesAdapter
from tests.proxy.conftest import WRITE_SCHEMA

CLAUDE_CODE_LIKE = {
    "model": "policy",
    "max_tokens": 64000,
    "system": [
        {"type": "text", "text": "You are a Claude agent."},
        {"type": "text", "text": "Main prompt\n  with indentation.", "cache_control": {"type": "ephemeral"}},
    ],
    "tools": [{"name": "Write", "description": "Write a file ✓", "input_schema": WRITE_SCHEMA}],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                {"type": "text", "text": "go"},
            ],
        },
        {"role": "system", "content": "Agent types: general."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan", "signature": "fakesig=="},
                {"type": "text", "text": "Writing."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "Write",
                    "input": {"file_path": "/a", "content": "\n\nhi"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "ok"}]},
                {"type": "text", "text": "continue", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ],
}
CHAT_LIKE = {
    "model": "policy",
    "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "do it"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "write", "arguments": '{"path":"p","content":"c"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "write", "arguments": '{"path":"q","content":"d"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok1"},
        {"role": "tool", "tool_call_id": "c2", "content": "ok2"},
        {"role": "developer", "content": "late note"},
        {"role": "user", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"},
    ],
    "tools": [{"type": "function", "function": {"name": "write", "parameters": WRITE_SCHEMA}}],
}
RESPONSES_LIKE = {
    "model": "policy",
    "instructions": None,
    "input": [
        {"role": "developer", "content": "dev 1"},
        {"role": "developer", "content": "dev 2"},
        {"role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "function_call", "call_id": "k", "name": "write", "arguments": '{"path": "p", "content": "c"}'},
        {"type": "function_call_output", "call_id": "k", "output": "written"},
    ],
    "tools": [{"type": "function", "name": "write", "parameters": WRITE_SCHEMA}],
}


@pytest.mark.parametrize("conversation", probe_conversations(), ids=["sys+tools", "tools", "sys", "bare"])
def test_block_rendering_equals_the_tokenizers_chat_template(renderer, tokenizer, conversation):
    """The per-template check: segments concatenate to exactly what the template renders, as ids."""
    text = renderer.template_text(conversation)
    expected = tokenizer.encode(text, add_special_tokens=False)
    rendered = renderer.render(conversation)
    assert rendered.prompt_ids == expected
    assert rendered.segments[0].start == 0 and rendered.segments[-1].end == len(expected)
    assert all(a.end == b.start for a, b in zip(rendered.segments, rendered.segments[1:]))


@pytest.mark.parametrize("conversation", probe_conversations(), ids=["sys+tools", "tools", "sys", "bare"])
def test_the_control_token_safe_encoding_matches_the_one_pass_one(renderer, conversation):
    """Blocks whose message text spells a control token take a second encoding path (the added tokens each
    piece may make, the rest as plain text); without such text that path must give exactly the ids of the
    usual one-pass encoding."""
    for _, message, lazy in renderer._blocks(conversation):
        pieces = lazy or renderer._message_block(message)  # an assistant turn's pieces are made when rendered
        one_pass = renderer._backend.encode("".join(p[0] for p in pieces), add_special_tokens=False)
        ids, offsets = renderer._text.encode_split(renderer._trusted(pieces))
        assert ids == one_pass.ids and offsets == one_pass.offsets, pieces


@pytest.mark.parametrize(
    "adapter,body",
    [(AnthropicAdapter(), CLAUDE_CODE_LIKE), (ChatAdapter(), CHAT_LIKE), (ResponsesAdapter(), RESPONSES_LIKE)],
    ids=["anthropic", "chat", "responses"],
)
def test_real_request_shapes_render_like_the_template(renderer, adapter, body):
    conversation = adapter.to_conversation(adapter.parse_request(body))
    renderer.check_conversation(conversation)  # raises TemplateMismatch on any difference
    roles = [m.role for m in conversation.messages]
    assert roles.count("assistant") == 1 and "tool" in roles
    kinds = {s.kind for s in renderer.render(conversation).segments}
    assert {"system", "tools", "user", "tool", "assistant_rendered", "template"} <= kinds


def test_segment_kinds_cover_the_right_text(renderer):
    conversation = ChatAdapter().to_conversation(ChatAdapter().parse_request(CHAT_LIKE))
    rendered = renderer.render(conversation)
    text_of = {k: "" for k in ("system", "tools", "tool", "user")}
    for s in rendered.segments:
        if s.kind in text_of:
            text_of[s.kind] += renderer.decode(rendered.prompt_ids[s.start : s.end])
    assert text_of["system"] == "syslate note"
    assert '"name": "write"' in text_of["tools"]
    assert text_of["tool"] == "ok1ok2"
    assert "do it" in text_of["user"] and "INTERNAL_CONTEXT" in text_of["user"]


def test_equal_spans_share_one_frozen_segment_across_calls(renderer):
    """The next call of a conversation re-renders its prefix: those spans are the earlier call's segment
    objects (held once, not once per call), and no one can change a shared segment."""
    conversation = ChatAdapter().to_conversation(ChatAdapter().parse_request(CHAT_LIKE))
    first = renderer.render(conversation)
    longer = Conversation([*conversation.messages, Message("user", "one more thing")], conversation.tools)
    second = renderer.render(longer)
    shared = [s for s in first.segments[:-1] if s in second.segments]  # the last is the generation prompt's
    assert shared == first.segments[:-1]
    assert all(any(s is t for t in second.segments) for s in shared)
    with pytest.raises(ValidationError):
        first.segments[0].end = 0


def test_splice_replaces_the_echoed_turn_with_the_recorded_ids(renderer, tokenizer):
    user = Conversation([Message("user", "hi")], [ToolSpec("write", "", WRITE_SCHEMA)])
    first = renderer.render(user)
    # ids a re-tokenizer would never produce ("wr" + "ite" split), decoding to the same call
    raw_text = '<tool_call>\n{"name": "write", "arguments": {"content": "x", "path": "y"}}\n</tool_call>'
    cut = raw_text.index("write") + 2
    generated = tokenizer.encode(raw_text[:cut], add_special_tokens=False) + tokenizer.encode(
        raw_text[cut:], add_special_tokens=False
    )
    assert generated != tokenizer.encode(raw_text, add_special_tokens=False)
    generated.append(renderer.im_end_id)
    parsed = renderer.parse(generated, {"write"})
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("write", {"content": "x", "path": "y"})]
    memory = GenerationMemory()
    memory.remember(0, first.prompt_ids, generated, parsed, renderer.end_of_turn_id)
    echoed = Message("assistant", "", [ToolCall("write", '{"path":"y","content":"x"}', id="rewritten")])
    second = renderer.render(
        Conversation([Message("user", "hi"), echoed, Message("tool", "ok")], user.tools), memory.find
    )
    assert second.prompt_ids[: len(first.prompt_ids) + len(generated)] == first.prompt_ids + generated
    assert second.drift_events == 0 and second.spliced_turns == 1


LIST_DIR = {"name": "list_dir", "arguments": {"path": "/work"}}
LS_TOOLS = [ToolSpec("list_dir", "List a folder.", {"type": "object", "properties": {"path": {"type": "string"}}})]


def generate(renderer, tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) + [renderer.im_end_id]


def echo_of(parsed) -> Message:
    """The assistant turn as a harness echoes it: structure only (ids and raw formatting are gone)."""
    return Message("assistant", parsed.text, [ToolCall(c.name, dict(c.arguments), id="x") for c in parsed.tool_calls])


def run_repeated_calls(renderer, tokenizer, edit_task: bool = False):
    """Three calls through the renderer; the model makes one call twice with different raw text."""
    texts = [json.dumps(LIST_DIR), "<tool_call>\n" + json.dumps(LIST_DIR) + "\n</tool_call>"]
    memory = GenerationMemory()
    messages = [Message("user", "List /work twice.")]
    prompts, generations = [], []
    for index, text in enumerate(texts):
        rendered = renderer.render(Conversation(list(messages), LS_TOOLS), memory.find)
        generated = generate(renderer, tokenizer, text)
        parsed = renderer.parse(generated, {"list_dir"})
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("list_dir", {"path": "/work"})]
        memory.remember(
            index, rendered.prompt_ids, generated, parsed, renderer.end_of_turn_id, position=rendered.assistant_turns
        )
        prompts.append(rendered.prompt_ids)
        generations.append(generated)
        messages += [echo_of(parsed), Message("tool", "a.txt")]
    if edit_task:
        messages[0] = Message("user", "List /work twice, please.")
    last = renderer.render(Conversation(messages, LS_TOOLS), memory.find)
    return prompts, generations, last


def test_repeated_call_with_different_raw_text_is_spliced_from_its_own_generation(renderer, tokenizer):
    prompts, generations, last = run_repeated_calls(renderer, tokenizer)
    assert generations[0] != generations[1]  # one structure, two id sequences
    assert prompts[1][: len(prompts[0]) + len(generations[0])] == prompts[0] + generations[0]
    assert last.prompt_ids[: len(prompts[1]) + len(generations[1])] == prompts[1] + generations[1]
    assert [s.source_call for s in last.segments if s.kind == "assistant_spliced"] == [0, 1]
    assert (last.drift_events, last.spliced_turns, last.assistant_turns) == (0, 2, 2)


def test_after_an_edited_history_echoes_are_matched_by_position(renderer, tokenizer):
    """No recorded prompt equals the edited history: each echo still gets the generation at its position."""
    _, generations, last = run_repeated_calls(renderer, tokenizer, edit_task=True)
    spliced = [s for s in last.segments if s.kind == "assistant_spliced"]
    assert [s.source_call for s in spliced] == [0, 1]
    assert [last.prompt_ids[s.start : s.end] for s in spliced] == generations


def test_memory_without_positions_prefers_the_longest_shared_prompt(renderer):
    memory = GenerationMemory()
    parsed = parse_generation_text("ls")
    memory.remember(0, [1, 2, 3, 7], [10, 11], parsed, 11)
    memory.remember(1, [1, 2, 3, 7, 10, 11, 4, 7], [20, 11], parsed, 11)
    echo = Message("assistant", "ls")
    assert memory.find(echo, EchoContext([1, 2, 3], [7], 0)) == SplicedTurn([10, 11], 0, True, exact=True)
    assert memory.find(echo, EchoContext([1, 2, 3, 7, 10, 11, 4], [7], 1)).source_call == 1
    # an edited history shares more with call 1's prompt (past call 0's) than with call 0's: call 1
    assert memory.find(echo, EchoContext([1, 2, 3, 7, 10, 11, 5], [7], 5)).source_call == 1


def test_claude_code_cd_prefix_rewrite_is_a_structural_match(renderer, tokenizer):
    bash = {"name": "Bash", "arguments": {"command": "cd /tmp/ws && ls -la", "description": "list"}}
    tools = [ToolSpec("Bash", "Run.", {"type": "object", "properties": {"command": {"type": "string"}}})]
    first = renderer.render(Conversation([Message("user", "ls")], tools))
    generated = generate(renderer, tokenizer, "<tool_call>\n" + json.dumps(bash) + "\n</tool_call>")
    parsed = renderer.parse(generated, {"Bash"})
    memory = GenerationMemory()
    memory.remember(0, first.prompt_ids, generated, parsed, renderer.end_of_turn_id, position=0)
    echoed = Message("assistant", "", [ToolCall("Bash", {"command": "ls -la", "description": "list"}, id="t")])
    second = renderer.render(Conversation([Message("user", "ls"), echoed, Message("tool", "a")], tools), memory.find)
    assert second.prompt_ids[: len(first.prompt_ids) + len(generated)] == first.prompt_ids + generated
    assert (second.drift_events, second.spliced_turns, second.rewritten_turns) == (0, 1, 1)
    # a different command is not a rewrite of this one: drift, re-tokenized
    other = Message("assistant", "", [ToolCall("Bash", {"command": "ls", "description": "list"}, id="t")])
    third = renderer.render(Conversation([Message("user", "ls"), other, Message("tool", "a")], tools), memory.find)
    assert (third.drift_events, third.spliced_turns, third.rewritten_turns) == (1, 0, 0)


@pytest.mark.parametrize(
    "command,echo",
    [
        ("cd /work && ls", "ls"),
        ('cd "/my dir" && make test', "make test"),
        ("cd /work&&git status", "git status"),
        ("  cd /work  &&  pytest -q", "pytest -q"),
        ("cd /work; ls", None),  # not `&&`: Claude Code keeps it
        ("cd /work && ", None),  # nothing left to run
        ("echo cd /work && ls", None),
    ],
)
def test_strip_leading_cd(command, echo):
    out = strip_leading_cd(ToolCall("Bash", {"command": command}))
    assert (out.arguments["command"] if out else None) == echo
    assert strip_leading_cd(ToolCall("Write", {"command": command})) is None


@pytest.mark.parametrize(
    "text,fmt,calls,rest",
    [
        (
            'Sure.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>',
            "tagged",
            [("a", {"x": 1})],
            "Sure.",
        ),
        (
            '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>\n<tool_call>{"name": "b", "arguments": {}}</tool_call>',
            "tagged",
            [("a", {"x": 1}), ("b", {})],
            "",
        ),
        ('```json\n{"name": "a", "arguments": {"x": 1}}\n```', "fenced_json", [("a", {"x": 1})], ""),
        (
            'I will call it.\n```json\n[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]\n```',
            "fenced_json",
            [("a", {}), ("b", {})],
            "I will call it.",
        ),
        ('{"name": "a", "arguments": {"x": [1, 2]}}', "bare_json", [("a", {"x": [1, 2]})], ""),
        (
            '{"name": "a", "parameters": {"x": 1}}\n{"name": "b", "arguments": {}}',
            "bare_json",
            [("a", {"x": 1}), ("b", {})],
            "",
        ),
    ],
)
def test_tool_call_formats(text, fmt, calls, rest):
    parsed = parse_generation_text(text, {"a", "b"})
    assert parsed.tool_call_format == fmt
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == calls
    assert parsed.text == rest


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "unknown_tool", "arguments": {}}',
        '{"answer": 42}',
        '```json\n{"name": "a"\n```',
        "Just text {not json}",
    ],
)
def test_json_that_is_not_a_call_stays_text(text):
    parsed = parse_generation_text(text, {"a"})
    assert parsed.tool_calls == [] and parsed.text == text.strip()


def test_reasoning_is_split_off():
    parsed = parse_generation_text("<think>\nstep 1\n</think>\n\nAnswer.")
    assert (parsed.reasoning, parsed.text) == ("step 1", "Answer.")
    truncated = parse_generation_text("<think>still thinking")
    assert (truncated.reasoning, truncated.text) == ("still thinking", "")


def test_canonical_arguments_ignore_order_spacing_and_integral_floats():
    assert canonical_arguments({"b": 1.0, "a": [2.0, "x"]}) == canonical_arguments('{ "a": [2, "x"], "b": 1 }')
    assert canonical_arguments("not json ") == "not json"


def test_a_template_that_does_not_fit_is_refused(tokenizer):
    class OtherTemplate:
        chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
        name_or_path = "other"
        backend_tokenizer = tokenizer.backend_tokenizer

        def apply_chat_template(self, messages, **kw):
            from jinja2 import Template

            return Template(self.chat_template).render(messages=messages)

    with pytest.raises(TemplateMismatch, match="differs from the tokenizer's chat template"):
        ChatMLRenderer(OtherTemplate())


def test_the_memoized_tools_section_is_the_templates_text_and_skips_values_orjson_cannot_tell_apart(tokenizer):
    """The tools section is memoized by orjson's encoding of the tools; orjson writes NaN as null, so a set
    holding null is rendered afresh every time (and still rendered exactly like the stdlib `tojson`)."""
    from clawgym_env.chat.renderers.chatml import TOOLS_FOOTER, TOOLS_HEADER, ChatMLRenderer, tojson

    fresh = ChatMLRenderer(tokenizer, verify=False)
    plain = [ToolSpec("write", "write a file", WRITE_SCHEMA), ToolSpec("ls", "list", {"type": "object", "x": 1.5})]
    nullish = [ToolSpec("opt", "", {"type": "object", "default": None})]
    nan = [ToolSpec("opt", "", {"type": "object", "default": float("nan")})]

    def expected(tools: list[ToolSpec]) -> str:
        return TOOLS_HEADER + "".join("\n" + tojson(t.as_template_tool()) for t in tools) + TOOLS_FOOTER

    for tools in (plain, plain, nullish, nan, nullish):
        assert fresh._tools_text(tools) == expected(tools)
    assert len(fresh._tools_memo) == 1  # only the set without null is kept
    assert "NaN" in fresh._tools_text(nan) and "null" in fresh._tools_text(nullish)
    conv = Conversation(messages=[Message(role="user", content="hi")], tools=plain)
    assert fresh.render(conv).prompt_ids == fresh.render(conv).prompt_ids
