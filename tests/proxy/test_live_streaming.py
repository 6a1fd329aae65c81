"""Live streaming (issue #18): SSE events leave while the engine decodes, and the record is unchanged.

With the real tiny Qwen3 model on the TransformersEngine: the first event reaches the client while the
generation is still running (nothing recorded yet, the engine still busy), through the official SDKs; a
streamed call records the same ids and logprobs as a non-streamed one (greedy) and answers with the same
text, stop reason and usage, in all three APIs; a client that hangs up after the first events leaves its
partial ids in the log. With the scripted engine (a named test double that streams one token at a time):
tool calls arrive as deltas that reassemble to the non-streamed answer. `StreamSplitter` is checked
token by token with the real tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from clawgym_env.engines.scripted import ScriptedTestEngine
from clawgym_env.engines.transformers_engine import TransformersEngine
from clawgym_env.interfaces import Policy, RolloutLimits
from clawgym_env.proxy.live_stream import StreamSplitter
from tests.proxy.conftest import LS_SCHEMA, WRITE_SCHEMA, tagged

TOKENS = 64


@pytest.fixture
async def tiny_policy(tiny_model, renderer):
    engine = TransformersEngine(tiny_model, seed=0, max_batch_size=4)
    engine.default_stop_ids = frozenset()  # always TOKENS tokens: the stream has something to overlap with
    yield Policy(engine=engine, renderer=renderer, name="tiny")
    await engine.aclose()


def greedy(max_new_tokens: int = TOKENS) -> RolloutLimits:
    return RolloutLimits(max_new_tokens=max_new_tokens, temperature=0.0)


def openai_client(proxy, route) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.base_url(route) + "/v1", api_key=route.api_key, max_retries=0)


def anthropic_client(proxy, route) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=proxy.base_url(route), api_key=route.api_key, max_retries=0)


# --------------------------------------------------------------------------- time to first byte
async def test_first_event_arrives_while_the_engine_is_still_decoding(proxy, tiny_policy, renderer):
    """Anthropic SDK: at the first event the call is not recorded yet and the engine is still running."""
    engine = tiny_policy.engine
    route = proxy.open_rollout("ttfb", tiny_policy, greedy())
    seen: list[tuple[str, int, int]] = []  # (event type, calls recorded, requests active in the engine)
    async with anthropic_client(proxy, route) as client:
        t0 = time.perf_counter()
        async with client.messages.stream(
            model="tiny", max_tokens=TOKENS, messages=[{"role": "user", "content": "Say something long."}]
        ) as stream:
            async for event in stream:
                seen.append((event.type, len(proxy.calls("ttfb")), engine._active))
                if len(seen) == 1:
                    first_s = time.perf_counter() - t0
            final = await stream.get_final_message()
        total_s = time.perf_counter() - t0
    call = proxy.close_rollout("ttfb")[0]
    assert len(call.generated_ids) == TOKENS and call.error is None
    assert seen[0][0] == "message_start"
    assert seen[0][1:] == (0, 1), "the first event came after the generation ended"
    assert first_s < total_s / 2, (first_s, total_s)
    assert call.timings.first_token_s is not None and call.timings.first_token_s < call.timings.total_s / 2
    # the text went out in pieces while decoding, and the pieces are the answer
    assert final.content[0].text == renderer.parse(call.generated_ids).text
    if final.content[0].text:
        deltas_before_end = [s for s in seen if s[0] == "text" and s[1] == 0]
        assert len(deltas_before_end) > 1


async def test_first_chat_chunk_arrives_while_the_engine_is_still_decoding(proxy, tiny_policy):
    """OpenAI SDK (chat): the first chunk arrives before the call is recorded."""
    route = proxy.open_rollout("ttfb-chat", tiny_policy, greedy())
    recorded_at_chunk: list[int] = []
    async with openai_client(proxy, route) as client:
        chunks = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Say something long."}], stream=True
        )
        async for _ in chunks:
            recorded_at_chunk.append(len(proxy.calls("ttfb-chat")))
    proxy.close_rollout("ttfb-chat")
    assert recorded_at_chunk[0] == 0 and recorded_at_chunk[-1] == 1


# ------------------------------------------------------------------ same record, same final answer
async def _anthropic(client: Any, stream: bool) -> tuple[str, str, dict[str, int]]:
    kwargs = {"model": "tiny", "max_tokens": TOKENS, "messages": [{"role": "user", "content": "Tell me a story."}]}
    if stream:
        async with client.messages.stream(**kwargs) as s:
            message = await s.get_final_message()
    else:
        message = await client.messages.create(**kwargs)
    text = "".join(b.text for b in message.content if b.type == "text")
    usage = {"in": message.usage.input_tokens, "out": message.usage.output_tokens}
    return text, message.stop_reason, usage


async def _chat(client: Any, stream: bool) -> tuple[str, str, dict[str, int]]:
    kwargs = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a story."}]}
    if not stream:
        completion = await client.chat.completions.create(**kwargs)
        usage = {"in": completion.usage.prompt_tokens, "out": completion.usage.completion_tokens}
        return completion.choices[0].message.content, completion.choices[0].finish_reason, usage
    chunks = await client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    text, finish, usage = "", "", {}
    async for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = {"in": chunk.usage.prompt_tokens, "out": chunk.usage.completion_tokens}
    return text, finish, usage


async def _responses(client: Any, stream: bool) -> tuple[str, str, dict[str, int]]:
    kwargs = {"model": "tiny", "input": "Tell me a story.", "max_output_tokens": TOKENS}
    if stream:
        async with client.responses.stream(**kwargs) as s:
            async for event in s:  # a length-cut answer ends with response.incomplete, not response.completed
                if event.type in ("response.completed", "response.incomplete"):
                    response = event.response
    else:
        response = await client.responses.create(**kwargs)
    usage = {"in": response.usage.input_tokens, "out": response.usage.output_tokens}
    return response.output_text, response.status, usage


@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
async def test_streamed_call_records_and_answers_like_a_non_streamed_one(proxy, tiny_policy, api):
    answers, calls = {}, {}
    for stream in (False, True):
        rollout = f"{api}-{'sse' if stream else 'json'}"
        route = proxy.open_rollout(rollout, tiny_policy, greedy())
        if api == "anthropic":
            async with anthropic_client(proxy, route) as client:
                answers[stream] = await _anthropic(client, stream)
        else:
            drive = _chat if api == "chat" else _responses
            async with openai_client(proxy, route) as client:
                answers[stream] = await drive(client, stream)
        [calls[stream]] = proxy.close_rollout(rollout)
    assert answers[True] == answers[False]
    json_call, sse_call = calls[False], calls[True]
    assert sse_call.streamed and not json_call.streamed
    assert sse_call.prompt_ids == json_call.prompt_ids
    assert sse_call.generated_ids == json_call.generated_ids and len(sse_call.generated_ids) == TOKENS
    # the second call reuses the first one's prompt KV from the prefix cache: float32 rounding only
    assert sse_call.logprobs == pytest.approx(json_call.logprobs, abs=1e-4)
    assert (sse_call.finish_reason, sse_call.policy_version, sse_call.error) == ("length", 0, None)
    assert proxy.stats(f"{api}-sse").stream_mismatches == 0


# ------------------------------------------------------------------------------------- tool calls
TOOL_SCRIPT = tagged("write", {"path": "a.txt", "content": "héllo ✓\nthere"}, text="Writing the file now.") + (
    "\n" + tagged("ls", {"dir": "."})
)
TOOLS_ANTHROPIC = [
    {"name": "write", "description": "Write a file.", "input_schema": WRITE_SCHEMA},
    {"name": "ls", "description": "List a folder.", "input_schema": LS_SCHEMA},
]
TOOLS_CHAT = [
    {
        "type": "function",
        "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
    }
    for t in TOOLS_ANTHROPIC
]
TOOLS_RESPONSES = [{"type": "function", **t["function"]} for t in TOOLS_CHAT]


def streaming_policy(tokenizer, renderer, completions: list[str]) -> Policy:
    engine = ScriptedTestEngine(tokenizer, completions, token_delay_s=0.002)
    return Policy(engine=engine, renderer=renderer, name="policy")


async def test_anthropic_tool_calls_stream_as_input_json_deltas(proxy, tokenizer, renderer):
    route = proxy.open_rollout("tools-a", streaming_policy(tokenizer, renderer, [TOOL_SCRIPT, TOOL_SCRIPT]))
    kwargs = {
        "model": "m",
        "max_tokens": 500,
        "tools": TOOLS_ANTHROPIC,
        "messages": [{"role": "user", "content": "go"}],
    }
    async with anthropic_client(proxy, route) as client:
        whole = await client.messages.create(**kwargs)
        events = []
        async with client.messages.stream(**kwargs) as stream:
            async for event in stream:
                events.append(event)
            streamed = await stream.get_final_message()
    proxy.close_rollout("tools-a")

    def shape(message: Any) -> list[Any]:
        return [(b.type, b.text) if b.type == "text" else (b.type, b.name, b.input) for b in message.content]

    assert shape(streamed) == shape(whole)
    assert [b.type for b in streamed.content] == ["text", "tool_use", "tool_use"]
    assert streamed.stop_reason == whole.stop_reason == "tool_use"
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    text_deltas = [e for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    json_deltas = [e for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len(text_deltas) > 1  # the text went out token by token
    assert {e.index for e in json_deltas} == {1, 2}
    for index, block in ((1, streamed.content[1]), (2, streamed.content[2])):
        assert json.loads("".join(e.delta.partial_json for e in json_deltas if e.index == index)) == block.input


async def test_chat_tool_calls_stream_as_argument_deltas(proxy, tokenizer, renderer):
    route = proxy.open_rollout("tools-c", streaming_policy(tokenizer, renderer, [TOOL_SCRIPT, TOOL_SCRIPT]))
    kwargs = {"model": "m", "tools": TOOLS_CHAT, "messages": [{"role": "user", "content": "go"}]}
    async with openai_client(proxy, route) as client:
        whole = (await client.chat.completions.create(**kwargs)).choices[0]
        text, calls, finish = "", {}, None
        async for chunk in await client.chat.completions.create(**kwargs, stream=True):
            delta = chunk.choices[0].delta
            text += delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
            for part in delta.tool_calls or ():
                entry = calls.setdefault(part.index, {"name": "", "arguments": ""})
                entry["name"] += part.function.name or ""
                entry["arguments"] += part.function.arguments or ""
    proxy.close_rollout("tools-c")
    assert text == whole.message.content == "Writing the file now."
    assert finish == whole.finish_reason == "tool_calls"
    expected = [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]
    assert [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)] == expected


async def test_responses_tool_calls_stream_as_function_call_argument_deltas(proxy, tokenizer, renderer):
    route = proxy.open_rollout("tools-r", streaming_policy(tokenizer, renderer, [TOOL_SCRIPT, TOOL_SCRIPT]))
    kwargs = {"model": "m", "tools": TOOLS_RESPONSES, "input": "go"}
    async with openai_client(proxy, route) as client:
        whole = await client.responses.create(**kwargs)
        deltas: dict[str, str] = {}
        async with client.responses.stream(**kwargs) as stream:
            async for event in stream:
                if event.type == "response.function_call_arguments.delta":
                    deltas[event.item_id] = deltas.get(event.item_id, "") + event.delta
            streamed = await stream.get_final_response()
    proxy.close_rollout("tools-r")

    def shape(response: Any) -> list[Any]:
        return [
            (i.type, i.name, json.loads(i.arguments)) if i.type == "function_call" else (i.type, i.content[0].text)
            for i in response.output
        ]

    assert shape(streamed) == shape(whole)
    calls = [i for i in streamed.output if i.type == "function_call"]
    assert len(calls) == 2 and {c.id: c.arguments for c in calls} == deltas


def test_splitter_sends_text_then_each_tagged_call_as_soon_as_it_closes(tokenizer, renderer):
    ids = tokenizer.encode(TOOL_SCRIPT, add_special_tokens=False) + [renderer.stop_token_ids[0]]
    splitter = StreamSplitter(renderer.decode, set(renderer.stop_token_ids), iter(["id1", "id2", "id3"]).__next__)
    text, calls = "", []
    for i, token in enumerate(ids):
        for kind, value in splitter.feed([token]):
            if kind == "text":
                assert "<" not in value and not calls  # no text of a call, no text after one
                text += value
            elif kind == "tool":
                decoded = renderer.decode(ids[: i + 1])
                assert decoded.endswith("</tool_call>"), "a call goes out with the token that closes it"
                calls.append((value.id, value.name, value.arguments))
    parsed = renderer.parse(ids, {"write", "ls"})
    assert text == parsed.text == "Writing the file now."
    assert calls == [("id1", "write", parsed.tool_calls[0].arguments), ("id2", "ls", {"dir": "."})]
    rest, all_calls, agrees = splitter.finish(parsed)
    assert agrees and rest == [] and [c.id for c in all_calls] == ["id1", "id2"]


@pytest.mark.parametrize(
    "completion",
    [
        "Plain answer, with ünïcödé ✓ and trailing space.   ",
        "<think>plan it</think>\n\nThe answer.",
        'Here it is:\n```json\n{"name": "ls", "arguments": {"dir": "."}}\n```',
        'Calling.\n{"name": "ls", "arguments": {"dir": "/"}}',
        "Not a call: x = {1: 2}\n[1, 2] is a list.",
        "Tagged but <tool_call> broken json </tool_call> then text",
    ],
)
def test_splitter_never_sends_what_the_final_parse_takes_back(tokenizer, renderer, completion):
    ids = tokenizer.encode(completion, add_special_tokens=False) + [renderer.stop_token_ids[0]]
    splitter = StreamSplitter(renderer.decode, set(renderer.stop_token_ids), iter(map(str, range(9))).__next__)
    pieces = [piece for token in ids for piece in splitter.feed([token])]
    parsed = renderer.parse(ids, {"ls"})
    rest, calls, agrees = splitter.finish(parsed)
    assert agrees
    everything = pieces + rest
    assert "".join(v for k, v in everything if k == "text") == parsed.text
    assert [v for k, v in everything if k == "reasoning"] == ([parsed.reasoning] if parsed.reasoning else [])
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in parsed.tool_calls]


# -------------------------------------------------------------------------------------- disconnect
async def test_client_leaving_mid_stream_records_the_partial_ids(proxy, tiny_policy):
    """The client reads the first events, then hangs up: the record keeps what was generated so far."""
    engine = tiny_policy.engine
    route = proxy.open_rollout("leave", tiny_policy, RolloutLimits(max_new_tokens=4000))
    body = {"model": "tiny", "max_tokens": 4000, "messages": [{"role": "user", "content": "Go on."}], "stream": True}
    received = b""
    async with httpx.AsyncClient(base_url=proxy.base_url(route), timeout=60) as client:

        async def read_some() -> None:
            nonlocal received
            async with client.stream("POST", "/v1/messages", json=body, headers={"x-api-key": route.api_key}) as r:
                assert r.status_code == 200
                async for data in r.aiter_bytes():
                    received += data
                    if received.count(b"event: ") >= 3:
                        return  # leave mid-stream: the connection closes here

        await asyncio.wait_for(read_some(), timeout=60)
    for _ in range(400):
        if proxy.stats("leave").disconnects:
            break
        await asyncio.sleep(0.05)
    [call] = proxy.close_rollout("leave")
    assert call.error.startswith("client_disconnected") and call.delivered is False
    assert call.finish_reason == "abort"
    assert 0 < len(call.generated_ids) < 4000 and len(call.logprobs) == len(call.generated_ids)
    assert b"message_start" in received and b"message_stop" not in received
    for _ in range(100):  # the engine's slot was freed
        if not engine._active:
            break
        await asyncio.sleep(0.05)
    assert engine._active == 0


async def test_engine_failing_mid_stream_ends_it_with_an_error_event_and_records_the_partial_ids(
    proxy, tiny_model, renderer
):
    """The real engine times out after its first tokens went out: an `error` event, and a record like a
    non-streamed engine timeout (error kind, partial ids, finish abort)."""
    engine = TransformersEngine(tiny_model, seed=0, request_timeout_s=1.0)
    engine.default_stop_ids = frozenset()
    policy = Policy(engine=engine, renderer=renderer, name="tiny")
    route = proxy.open_rollout("fails", policy, RolloutLimits(max_new_tokens=4000))
    body = {"model": "tiny", "max_tokens": 4000, "messages": [{"role": "user", "content": "Go on."}], "stream": True}
    async with httpx.AsyncClient(base_url=proxy.base_url(route), timeout=60) as client:
        response = await client.post("/v1/messages", json=body, headers={"x-api-key": route.api_key})
    await engine.aclose()
    [call] = proxy.close_rollout("fails")
    assert response.status_code == 200
    assert response.text.startswith("event: message_start") and "message_stop" not in response.text
    assert response.text.rstrip().splitlines()[-2] == "event: error"
    assert call.error.startswith("engine_timeout") and call.finish_reason == "abort"
    assert 0 < len(call.generated_ids) < 4000 and len(call.logprobs) == len(call.generated_ids)
    assert proxy.stats("fails").error_kinds == {"engine_timeout": 1}


async def test_a_fast_engine_still_notices_the_client_leaving(proxy, tokenizer, renderer):
    """An engine whose chunks come every loop turn must not starve the disconnect check (it did: a chunk
    ready together with the disconnect was taken first, every time, and the whole answer was generated)."""
    policy = Policy(engine=ScriptedTestEngine(tokenizer, ["word " * 20_000]), renderer=renderer, max_context=100_000)
    route = proxy.open_rollout("fast", policy, RolloutLimits(max_new_tokens=50_000, max_tokens=1_000_000))
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    async with httpx.AsyncClient(base_url=proxy.base_url(route), timeout=30) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers={"x-api-key": route.api_key}) as r:
            async for _ in r.aiter_raw():
                break
    for _ in range(200):
        if proxy.calls("fast"):
            break
        await asyncio.sleep(0.05)
    [call] = proxy.close_rollout("fast")
    assert call.error.startswith("client_disconnected") and 0 < len(call.generated_ids) < 20_000


# --------------------------------------------------------------------------- keep-alive while text is held
BARE_JSON_CALL = '{"name": "write", "arguments": {"path": "notes.txt", "content": "' + "word " * 40 + '"}}'


@pytest.mark.parametrize("api", ["anthropic", "chat"])
async def test_a_stream_holding_back_a_tool_call_sends_keepalives(tmp_path, tokenizer, renderer, api):
    """A bare-JSON tool call (Qwen2.5-Coder's habit) can only go out once the generation ends; meanwhile the
    stream is silent for as long as the model writes it (minutes for a long file on a CPU). The proxy sends
    the API's keep-alive (Anthropic `ping` events, an SSE comment for OpenAI) every `stream_keepalive_s` of
    silence, counted per rollout; the answer is unchanged."""
    from clawgym_env.proxy import ServingProxy

    engine = ScriptedTestEngine(tokenizer, [BARE_JSON_CALL], token_delay_s=0.02)  # ~60 tokens: ~1.2 s of silence
    proxy = ServingProxy(tmp_path / "run", port=0, stream_keepalive_s=0.2)
    await proxy.start()
    try:
        route = proxy.open_rollout(api, Policy(engine=engine, renderer=renderer, name="policy"))
        headers = {"x-api-key": route.api_key, "authorization": f"Bearer {route.api_key}"}
        if api == "anthropic":
            path = "/v1/messages"
            body = {"model": "m", "max_tokens": 500, "stream": True, "tools": TOOLS_ANTHROPIC}
        else:
            path = "/v1/chat/completions"
            body = {"model": "m", "stream": True, "tools": TOOLS_CHAT}
        body["messages"] = [{"role": "user", "content": "write the notes"}]
        async with httpx.AsyncClient(base_url=proxy.base_url(route), timeout=30) as client:
            async with client.stream("POST", path, json=body, headers=headers) as response:
                assert response.status_code == 200
                raw = b"".join([part async for part in response.aiter_bytes()]).decode()
        stats = proxy.stats(api)
        proxy.close_rollout(api)
    finally:
        await proxy.stop()
    keepalives = raw.count("event: ping") - 1 if api == "anthropic" else raw.count(": keep-alive\n\n")
    assert keepalives >= 2 and stats.stream_keepalives == keepalives  # (the Messages API also pings once at start)
    assert '"name":"write"' in raw.replace(" ", "") and "notes.txt" in raw  # the call itself, at the end
    assert raw.rstrip().endswith("[DONE]") if api == "chat" else "message_stop" in raw


async def test_keepalive_ticks_wait_for_the_first_tokens(tokenizer):
    """The first `next()` is the engine's first tokens even when prefill outlasts several ticks: the proxy
    answers a failure before them like a non-streamed call, so nothing may start the stream early."""
    from clawgym_env.interfaces import SamplingParams
    from clawgym_env.proxy.live_stream import TokenFeed

    class SlowStart(ScriptedTestEngine):  # a test double whose prefill takes 0.3 s
        async def stream(self, prompt_ids, sampling, *, request_id=None):
            await asyncio.sleep(0.3)
            async for chunk in super().stream(prompt_ids, sampling, request_id=request_id):
                yield chunk

    async def never_disconnects() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    loop = asyncio.get_running_loop()
    engine = SlowStart(tokenizer, ["hello there, world"], token_delay_s=0.1)
    feed = TokenFeed(engine, [1, 2, 3], SamplingParams(max_tokens=20), "r", never_disconnects, loop.time() + 30, 0.05)
    first = await feed.next()
    assert first is not None and first.token_ids  # not an empty tick
    ticks = 0
    while (chunk := await feed.next()) is not None:
        ticks += not chunk.token_ids
    await feed.aclose()
    assert ticks >= 1  # between later tokens (0.1 s apart) the 0.05 s ticks do come


async def test_paced_feed_sends_fewer_larger_chunks_but_never_holds_back_the_first_or_the_end(tokenizer):
    """`min_gap_s`: tokens decoded 10 ms apart go out at most every 50 ms after the first hand-out, all of
    them, in order; the first tokens and the final chunk go out as soon as the engine yields them."""
    from clawgym_env.interfaces import SamplingParams
    from clawgym_env.proxy.live_stream import TokenFeed

    class Timed(ScriptedTestEngine):  # a test double that notes when it yields the final chunk
        async def stream(self, prompt_ids, sampling, *, request_id=None):
            async for chunk in super().stream(prompt_ids, sampling, request_id=request_id):
                if chunk.finish_reason is not None:
                    self.final_at = time.perf_counter()
                yield chunk

    async def never_disconnects() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    text = "one two three four five six seven eight nine ten " * 3

    async def hand_outs(min_gap_s: float, completion: str = text) -> tuple[list[tuple[float, list[int]]], Timed]:
        engine = Timed(tokenizer, [completion], token_delay_s=0.01)
        loop = asyncio.get_running_loop()
        feed = TokenFeed(
            engine,
            [1, 2],
            SamplingParams(max_tokens=200),
            "r",
            never_disconnects,
            loop.time() + 30,
            min_gap_s=min_gap_s,
        )
        out = []
        while (chunk := await feed.next()) is not None:
            out.append((time.perf_counter(), chunk.token_ids))
        await feed.aclose()
        assert [t for _, ids in out for t in ids] == [t for c in feed.chunks for t in c.token_ids]
        return out, engine

    every, _ = await hand_outs(0.0)
    paced, engine = await hand_outs(0.05)
    tokens = sum(len(ids) for _, ids in paced)
    assert tokens == sum(len(ids) for _, ids in every) > 30
    assert len(every) >= tokens - 2  # unpaced: about one hand-out per token
    assert len(paced) <= 2 + (paced[-1][0] - paced[0][0]) / 0.05 + 1, len(paced)  # paced: one per 50 ms window
    assert len(paced[0][1]) <= 2  # the first tokens were not held back
    gaps = [b[0] - a[0] for a, b in zip(paced[:-2], paced[1:-1], strict=True)]
    assert min(gaps) >= 0.04, gaps  # between the first and the end, sends are at least the gap apart
    # A generation that ends 30 ms into a 300 ms gap: the end goes out with the held tokens at once.
    short, engine = await hand_outs(0.3, "one two three")
    assert len(short) == 2 and short[-1][0] - engine.final_at < 0.15, (short, engine.final_at)


async def test_calls_on_one_connection_share_its_lost_future_and_only_the_current_one_stops(tokenizer):
    """A keep-alive connection's calls watch one shared `lost` future (GuardedHttpProtocol.lost): a finished
    call must leave it as it was (not cancelled, no wake-up of a closed feed), and when the connection goes
    the call then in progress stops as disconnected, with the ids generated so far."""
    from clawgym_env.interfaces import SamplingParams
    from clawgym_env.proxy.live_stream import StreamStopped, TokenFeed

    async def unused_receive() -> dict[str, Any]:
        raise AssertionError("with a lost future the feed must not read receive()")

    loop = asyncio.get_running_loop()
    lost: asyncio.Future[None] = loop.create_future()
    engine = ScriptedTestEngine(tokenizer, ["done in one go", "word " * 2000], token_delay_s=0.002)
    first = TokenFeed(engine, [1, 2], SamplingParams(max_tokens=10), "a", unused_receive, loop.time() + 30, lost=lost)
    while await first.next() is not None:
        pass
    await first.aclose()
    assert not lost.done()  # the finished call left the connection's future alone

    second = TokenFeed(
        engine, [3, 4], SamplingParams(max_tokens=4000), "b", unused_receive, loop.time() + 30, lost=lost
    )
    assert (await second.next()) is not None
    lost.set_result(None)  # the client hangs up mid-stream
    with pytest.raises(StreamStopped) as stopped:
        while await second.next() is not None:
            pass
    await second.aclose()
    assert stopped.value.why == "disconnected"
    assert stopped.value.generation is not None and 0 < len(stopped.value.generation.token_ids) < 4000
    assert first.finished and first.chunks[-1].finish_reason is not None  # the first call ended normally


def test_the_hazard_search_finds_what_a_character_by_character_scan_finds():
    """`_first_hazard` searches with `str.find` and a regex; a plain scan of every character is the reference."""
    import random

    from clawgym_env.proxy.live_stream import MARKERS, _first_hazard

    def scan(body: str, lead: int, since: int) -> int | None:
        found = [i for i in (body.find(m, since) for m in MARKERS) if i >= 0]
        for i in range(since, len(body)):
            if body[i] in "{[" and (i == lead or body[i - 1] == "\n"):
                found.append(i)
                break
        return min(found) if found else None

    rng = random.Random(0)
    pieces = ["a", " ", "\n", "{", "[", "<tool_call>", "```", "}", "<tool", "`", "é"]
    for _ in range(20_000):
        body = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        lead = rng.randint(0, len(body))
        since = rng.randint(lead, len(body))
        assert _first_hazard(body, lead, since) == scan(body, lead, since), (body, lead, since)
