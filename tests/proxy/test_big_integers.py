"""Integers past 64 bits (which orjson refuses to write) in a request's tool-call arguments or in the policy's
own generated tool call: answered in every API, streamed or not, instead of a 500 (found by the fuzz test)."""

from __future__ import annotations

import json

import httpx
import pytest

from clawgym_env.chat.jsonio import dumps

from .conftest import WRITE_SCHEMA, tagged

HUGE = 2**70
CHAT_TOOLS = [{"type": "function", "function": {"name": "write", "description": "w", "parameters": WRITE_SCHEMA}}]


def test_dumps_falls_back_for_what_orjson_refuses() -> None:
    assert json.loads(dumps({"b": HUGE, "a": 1.5}, sort_keys=True)) == {"a": 1.5, "b": HUGE}
    assert dumps({"b": 1, "a": [2]}, sort_keys=True) == b'{"a":[2],"b":1}'  # orjson's own compact form


def _body(api: str, stream: bool) -> dict:
    echoed = {"path": "a.txt", "content": "x", "n": HUGE}
    if api == "messages":
        tools = [{"name": "write", "description": "w", "input_schema": WRITE_SCHEMA}]
        messages = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "write", "input": echoed}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        ]
        return {"model": "p", "max_tokens": 64, "stream": stream, "tools": tools, "messages": messages}
    if api == "chat/completions":
        call = {"id": "c1", "type": "function", "function": {"name": "write", "arguments": json.dumps(echoed)}}
        messages = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
        return {"model": "p", "stream": stream, "tools": CHAT_TOOLS, "messages": messages}
    tools = [{"type": "function", "name": "write", "description": "w", "parameters": WRITE_SCHEMA}]
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "write", "arguments": json.dumps(echoed)},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    return {"model": "p", "stream": stream, "tools": tools, "input": items}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["messages", "chat/completions", "responses"])
async def test_huge_integers_in_echoed_and_generated_tool_calls_are_answered(proxy, scripted_policy, api, stream):
    generated = tagged("write", {"path": "b.txt", "content": "y", "n": HUGE})
    route = proxy.open_rollout("big", scripted_policy([generated]))
    headers = {"authorization": f"Bearer {route.api_key}", "x-api-key": route.api_key}
    async with httpx.AsyncClient(base_url=proxy.origin, timeout=30) as client:
        reply = await client.post(f"{route.path_prefix}/v1/{api}", json=_body(api, stream), headers=headers)
    assert reply.status_code == 200, reply.text
    assert str(HUGE) in reply.text  # the generated argument reaches the harness whole
    (call,) = proxy.calls("big")
    assert call.error is None
