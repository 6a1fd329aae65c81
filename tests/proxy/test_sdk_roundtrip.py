"""Multi-turn tool-calling exchanges through the official `anthropic` and `openai` SDKs, streaming and not.

Each driver below plays a harness: it sends the conversation, runs the tool calls it gets back, echoes the
assistant turn (optionally re-serialised the way OpenClaw and pi do: ids rewritten, arguments re-ordered
and re-spaced, cache_control moved) and asks again. The proxy must splice every echoed turn back as the
raw ids it generated, so each call's prompt begins with the previous call's full ids.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from clawgym_env.records import read_calls
from tests.proxy.conftest import LS_SCHEMA, WRITE_SCHEMA, tagged

SCRIPT = [
    tagged("write", {"path": "a.txt", "content": "hi\nthere", "mode": 1.0}, text="Writing the file."),
    tagged("ls", {"dir": "."}),
    "Done: a.txt is written.",
]
TOOL_OUTPUT = {"write": "wrote 8 bytes to a.txt", "ls": "a.txt\nb.txt"}


def reserialise(arguments: dict[str, Any]) -> str:
    """What a JavaScript harness sends back: other key order, other spacing, 1.0 written as 1."""
    reordered = dict(reversed(list(arguments.items())))
    return json.dumps(json.loads(json.dumps(reordered).replace("1.0", "1")), indent=None, separators=(", ", ": "))


def rewrite_id(call_id: str) -> str:
    return call_id.replace("_", "").replace("-", "")  # OpenClaw: call_f9ec… -> callf9ec…


# ------------------------------------------------------------------------------------------ drivers
async def drive_anthropic(client: anthropic.AsyncAnthropic, stream: bool, rewrite: bool) -> list[Any]:
    tools = [
        {"name": "write", "description": "Write a file.", "input_schema": WRITE_SCHEMA},
        {"name": "ls", "description": "List a folder.", "input_schema": LS_SCHEMA},
    ]
    system = [{"type": "text", "text": "You are a careful agent."}, {"type": "text", "text": "Work in /ws."}]
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>today</system-reminder>"},
                {"type": "text", "text": "Write a.txt"},
            ],
        },
        {"role": "system", "content": "Agent types: none."},  # Claude Code's mid-conversation system message
    ]
    finals = []
    for _ in range(4):
        for m in messages:  # Claude Code moves the cache_control marker to the last block every call
            if isinstance(m["content"], list):
                for block in m["content"]:
                    block.pop("cache_control", None)
        if isinstance(messages[-1]["content"], list):
            messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        kwargs = dict(model="policy", max_tokens=512, system=system, messages=messages, tools=tools)
        if stream:
            async with client.messages.stream(**kwargs) as s:
                final = await s.get_final_message()
        else:
            final = await client.messages.create(**kwargs)
        finals.append(final)
        content, results = [], []
        for block in final.content:
            if block.type == "text":
                content.append({"type": "text", "text": block.text})
            elif block.type == "thinking":
                content.append({"type": "thinking", "thinking": block.thinking, "signature": block.signature})
            elif block.type == "tool_use":
                call_id = rewrite_id(block.id) if rewrite else block.id
                args = json.loads(reserialise(block.input)) if rewrite else block.input
                content.append({"type": "tool_use", "id": call_id, "name": block.name, "input": args})
                results.append({"type": "tool_result", "tool_use_id": call_id, "content": TOOL_OUTPUT[block.name]})
        messages.append({"role": "assistant", "content": content})
        if not results:
            break
        messages.append({"role": "user", "content": results})
    return finals


async def drive_chat(client: openai.AsyncOpenAI, stream: bool, rewrite: bool) -> list[Any]:
    tools = [
        {"type": "function", "function": {"name": "write", "description": "Write a file.", "parameters": WRITE_SCHEMA}},
        {"type": "function", "function": {"name": "ls", "description": "List a folder.", "parameters": LS_SCHEMA}},
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Write a.txt"},
    ]
    finals = []
    for _ in range(4):
        if stream:
            text, calls, usage, finish = "", {}, None, None
            chunks = await client.chat.completions.create(
                model="policy", messages=messages, tools=tools, stream=True, stream_options={"include_usage": True}
            )
            async for chunk in chunks:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
                    text += choice.delta.content or ""
                    for tc in choice.delta.tool_calls or ():
                        slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                        slot["id"] = tc.id or slot["id"]
                        slot["name"] += tc.function.name or ""
                        slot["arguments"] += tc.function.arguments or ""
            assert usage is not None and usage.completion_tokens > 0, "include_usage must end with a usage chunk"
            message = {"content": text or None, "tool_calls": [calls[i] for i in sorted(calls)]}
            finals.append({"finish_reason": finish, **message})
        else:
            completion = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
            msg = completion.choices[0].message
            message = {
                "content": msg.content,
                "tool_calls": [
                    {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                    for c in msg.tool_calls or ()
                ],
            }
            finals.append({"finish_reason": completion.choices[0].finish_reason, **message})
        echoed = {"role": "assistant", "content": message["content"]}
        if message["tool_calls"]:
            echoed["tool_calls"] = [
                {
                    "id": rewrite_id(c["id"]) if rewrite else c["id"],
                    "type": "function",
                    "function": {
                        "name": c["name"],
                        "arguments": reserialise(json.loads(c["arguments"])) if rewrite else c["arguments"],
                    },
                }
                for c in message["tool_calls"]
            ]
        messages.append(echoed)
        if not message["tool_calls"]:
            break
        for c in echoed["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": TOOL_OUTPUT[c["function"]["name"]]})
    return finals


async def drive_responses(client: openai.AsyncOpenAI, stream: bool, rewrite: bool) -> list[Any]:
    tools = [
        {"type": "function", "name": "write", "description": "Write a file.", "parameters": WRITE_SCHEMA},
        {"type": "function", "name": "ls", "description": "List a folder.", "parameters": LS_SCHEMA},
        {"type": "web_search"},  # a hosted tool: not offered to the policy, must not break the call
    ]
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": "You are a careful agent."},
        {"role": "user", "content": [{"type": "input_text", "text": "<environment_context>/ws</environment_context>"}]},
        {"role": "user", "content": "Write a.txt"},
    ]
    finals = []
    for _ in range(4):
        response = await responses_turn(client, stream, model="policy", input=items, tools=tools, store=False)
        finals.append(response)
        calls = []
        for item in response.output:
            data = item.model_dump(exclude_none=True)
            if item.type == "function_call":
                if rewrite:
                    data["call_id"] = rewrite_id(data["call_id"])
                    data["arguments"] = reserialise(json.loads(data["arguments"]))
                calls.append(data)
            items.append(data)
        if not calls:
            break
        for c in calls:
            items.append({"type": "function_call_output", "call_id": c["call_id"], "output": TOOL_OUTPUT[c["name"]]})
    return finals


def tool_names_of(api: str, final: Any) -> list[str]:
    if api == "anthropic":
        return [b.name for b in final.content if b.type == "tool_use"]
    if api == "chat":
        return [c["name"] for c in final["tool_calls"]]
    return [i.name for i in final.output if i.type == "function_call"]


def first_arguments(api: str, final: Any) -> dict[str, Any]:
    if api == "anthropic":
        return next(b.input for b in final.content if b.type == "tool_use")
    if api == "chat":
        return json.loads(final["tool_calls"][0]["arguments"])
    return json.loads(next(i.arguments for i in final.output if i.type == "function_call"))


# -------------------------------------------------------------------------------------------- tests
def client_for(api: str, proxy, route):
    if api == "anthropic":
        return anthropic.AsyncAnthropic(base_url=proxy.base_url(route), api_key=route.api_key, max_retries=0)
    return openai.AsyncOpenAI(base_url=proxy.base_url(route) + "/v1", api_key=route.api_key, max_retries=0)


async def responses_turn(client: Any, stream: bool, **kwargs: Any) -> Any:
    """One Responses call through the SDK, streamed (events drained, final response read) or not."""
    if not stream:
        return await client.responses.create(**kwargs)
    async with client.responses.stream(**kwargs) as s:
        async for _event in s:
            pass
        return await s.get_final_response()


DRIVERS = {"anthropic": drive_anthropic, "chat": drive_chat, "responses": drive_responses}


@pytest.mark.parametrize("rewrite", [False, True], ids=["verbatim", "reserialised"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
async def test_multi_turn_tool_calls_round_trip_and_extend_prefix(proxy, scripted_policy, api, stream, rewrite):
    route = proxy.open_rollout(f"{api}-{stream}-{rewrite}", scripted_policy(list(SCRIPT)))
    async with client_for(api, proxy, route) as client:
        finals = await DRIVERS[api](client, stream, rewrite)

    assert [tool_names_of(api, f) for f in finals] == [["write"], ["ls"], []]
    calls = proxy.close_rollout(route.rollout_id)
    assert [c.call_index for c in calls] == [0, 1, 2]
    assert all(c.error is None and c.streamed == stream for c in calls)
    for previous, current in zip(calls, calls[1:]):
        full = previous.full_ids
        assert current.prompt_ids[: len(full)] == full, (
            f"call {current.call_index} does not extend call {previous.call_index}"
        )
        assert current.drift_events == 0
        spliced = [s for s in current.segments if s.kind == "assistant_spliced"]
        assert [s.source_call for s in spliced] == list(range(current.call_index))
        assert current.prompt_ids[spliced[-1].start : spliced[-1].end] == previous.generated_ids
    assert first_arguments(api, finals[0]) == {"path": "a.txt", "content": "hi\nthere", "mode": 1.0}
    stats = proxy.stats(route.rollout_id)
    assert (stats.calls, stats.completed_calls, stats.drift_events, stats.spliced_turns, stats.errors) == (
        3,
        3,
        0,
        3,
        0,
    )
    # every completed call is already in the run's log
    logged = list(read_calls(proxy.log_path, route.rollout_id))
    assert [c.generated_ids for c in logged] == [c.generated_ids for c in calls]


async def test_openclaw_internal_context_moved_to_end_still_splices(proxy, scripted_policy):
    """OpenClaw (chat mode) keeps its internal-context user message last, after the new turns."""
    route = proxy.open_rollout("openclaw", scripted_policy([tagged("write", {"path": "a", "content": "b"}), "ok"]))
    client = client_for("chat", proxy, route)
    await_close = client.close
    tools = [{"type": "function", "function": {"name": "write", "description": "w", "parameters": WRITE_SCHEMA}}]
    context = {
        "role": "user",
        "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>> sessions: none <<<END_OPENCLAW_INTERNAL_CONTEXT>>>",
    }
    base = [{"role": "system", "content": "sys"}, {"role": "user", "content": "[Sun] write a"}]
    first = await client.chat.completions.create(model="policy/policy", messages=[*base, context], tools=tools)
    call = first.choices[0].message.tool_calls[0]
    echoed = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": rewrite_id(call.id),
                "type": "function",
                "function": {"name": "write", "arguments": '{"content":"b","path":"a"}'},
            }
        ],
    }
    tool = {"role": "tool", "tool_call_id": rewrite_id(call.id), "content": "done"}
    await client.chat.completions.create(model="policy/policy", messages=[*base, echoed, tool, context], tools=tools)
    await await_close()
    c0, c1 = proxy.close_rollout("openclaw")
    assert c1.drift_events == 0
    (spliced,) = c1.spliced_spans
    assert spliced.source_call == 0 and c1.prompt_ids[spliced.start : spliced.end] == c0.generated_ids


async def test_altered_assistant_turn_is_a_drift_event(proxy, scripted_policy):
    route = proxy.open_rollout("drift", scripted_policy(["First answer.", "Second."]))
    client = client_for("anthropic", proxy, route)
    first = await client.messages.create(model="policy", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert first.content[0].text == "First answer."
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "An answer the model never gave."},
        {"role": "user", "content": "and?"},
    ]
    await client.messages.create(model="policy", max_tokens=64, messages=messages)
    await client.close()
    _, second = proxy.close_rollout("drift")
    assert second.drift_events == 1
    assert [s.kind for s in second.segments].count("assistant_rendered") == 1
    assert not second.spliced_spans
    assert proxy.stats("drift").drift_events == 1


async def test_fenced_and_bare_json_tool_calls_are_parsed_and_spliced(proxy, scripted_policy):
    """Qwen2.5-Coder-0.5B writes tool calls as ```json fences or bare JSON, never in <tool_call> tags."""
    script = [
        '```json\n{"name": "write", "arguments": {"path": "x.txt", "content": "1"}}\n```',
        '{"name": "ls", "arguments": {"dir": "."}}',
        "All done.",
    ]
    route = proxy.open_rollout("coder", scripted_policy(script))
    async with client_for("chat", proxy, route) as client:
        finals = await drive_chat(client, stream=True, rewrite=True)
    assert [f["finish_reason"] for f in finals] == ["tool_calls", "tool_calls", "stop"]
    assert [c["name"] for f in finals for c in f["tool_calls"]] == ["write", "ls"]
    calls = proxy.close_rollout("coder")
    assert [c.drift_events for c in calls] == [0, 0, 0]
    assert calls[2].prompt_ids[: len(calls[1].full_ids)] == calls[1].full_ids


async def test_thinking_becomes_thinking_blocks_and_is_spliced(proxy, scripted_policy):
    script = ["<think>\nI should list first.\n</think>\n\n" + tagged("ls", {"dir": "."}), "Nothing to do."]
    route = proxy.open_rollout("think", scripted_policy(script))
    async with client_for("anthropic", proxy, route) as client:
        finals = await drive_anthropic(client, stream=True, rewrite=True)
    assert finals[0].content[0].type == "thinking"
    assert finals[0].content[0].thinking == "I should list first."
    assert finals[0].stop_reason == "tool_use" and finals[1].stop_reason == "end_turn"
    c0, c1 = proxy.close_rollout("think")
    assert c1.prompt_ids[: len(c0.full_ids)] == c0.full_ids and c1.drift_events == 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_namespaced_responses_tools_are_flattened_and_called_back_by_namespace(proxy, scripted_policy, stream):
    """Codex offers MCP tools as a `namespace` tool; the policy sees `mcp__server__tool` and Codex gets namespace + name."""
    search = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    tools = [
        {"type": "function", "name": "exec_command", "description": "Run a command.", "parameters": LS_SCHEMA},
        {
            "type": "namespace",
            "name": "mcp__docs",
            "description": "Search the task's documents.",
            "tools": [{"type": "function", "name": "search", "description": "Find lines.", "parameters": search}],
        },
    ]
    policy = scripted_policy([tagged("mcp__docs__search", {"query": "answer"}), "The answer is 42."])
    route = proxy.open_rollout(f"namespace-{stream}", policy)
    items: list[dict[str, Any]] = [{"role": "user", "content": "Find the answer."}]
    async with client_for("responses", proxy, route) as client:
        for _ in range(2):
            response = await responses_turn(client, stream, model="policy", input=items, tools=tools, store=False)
            calls = [i.model_dump(exclude_none=True) for i in response.output if i.type == "function_call"]
            items += [i.model_dump(exclude_none=True) for i in response.output]
            items += [
                {"type": "function_call_output", "call_id": c["call_id"], "output": "notes.md:1: 42"} for c in calls
            ]
    first_call = items[1]
    assert (first_call["namespace"], first_call["name"]) == ("mcp__docs", "search")
    calls = proxy.close_rollout(route.rollout_id)
    assert len(calls) == 2
    prompt = policy.engine.prompt_texts[0]
    assert '"name": "mcp__docs__search"' in prompt and '"name": "exec_command"' in prompt
    # the echoed namespaced call renders exactly as generated: the second prompt extends the first call
    assert calls[1].prompt_ids[: len(calls[0].full_ids)] == calls[0].full_ids and calls[1].drift_events == 0
    assert "notes.md:1: 42" in policy.engine.prompt_texts[1]
