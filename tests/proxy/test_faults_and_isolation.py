"""Routes, keys, error shapes, caps and faults: what the proxy answers when things go wrong."""

from __future__ import annotations

import asyncio
import time

import anthropic
import httpx
import openai
import pytest

from clawgym_env.interfaces import Generation, Policy, RolloutLimits, SamplingParams
from clawgym_env.records import read_calls

MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
GOOD = {
    MESSAGES: {"model": "policy", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    CHAT: {"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
    RESPONSES: {"model": "policy", "input": "hi"},
}


class SlowTestEngine:
    """Test double: an engine that takes `delay_s` per call and notes whether it was cancelled."""

    def __init__(self, delay_s: float, fail: Exception | None = None) -> None:
        self.delay_s, self.fail = delay_s, fail
        self.policy_version = 0
        self.cancelled = 0
        self.finished = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail is not None:
            raise self.fail
        self.finished += 1
        return Generation(token_ids=[9707, 151645], logprobs=[-0.5, -0.1], finish_reason="stop")

    def update_weights(self, state_dict, version: int) -> None:
        self.policy_version = version


def headers(route) -> dict[str, str]:
    return {"x-api-key": route.api_key}


async def post(proxy, route, path, body, **kw) -> httpx.Response:
    async with httpx.AsyncClient(base_url=proxy.base_url(route)) as client:
        return await client.post(path, json=body, headers=kw.pop("headers", headers(route)), **kw)


async def test_unknown_rollout_and_wrong_key_401_closed_410(proxy, scripted_policy):
    a = proxy.open_rollout("a", scripted_policy(["A"] * 5))
    b = proxy.open_rollout("b", scripted_policy(["B"] * 5))
    async with httpx.AsyncClient(base_url=proxy.origin) as client:
        # an unknown rollout answers like a wrong key, so a caller cannot tell which rollouts are open
        r = await client.post("/rollouts/nope" + MESSAGES, json=GOOD[MESSAGES], headers=headers(a))
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
        assert "no such open rollout" in r.json()["error"]["message"]
        # the other rollout's key, in both header styles, and no key at all
        for h in ({"x-api-key": b.api_key}, {"authorization": f"Bearer {b.api_key}"}, {}):
            r = await client.post("/rollouts/a" + CHAT, json=GOOD[CHAT], headers=h)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "authentication_error"
            assert r.json()["error"]["code"] == "invalid_api_key"
        r = await client.post("/rollouts/a" + CHAT, json=GOOD[CHAT], headers={"authorization": f"Bearer {a.api_key}"})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "A"
    assert proxy.stats("b").calls == 0  # refused requests never touch another rollout
    proxy.close_rollout("a")
    r = await post(proxy, a, MESSAGES, GOOD[MESSAGES])
    assert r.status_code == 410 and r.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(
    "path,body,param",
    [
        (MESSAGES, {"model": "p", "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        (MESSAGES, {"model": "p", "max_tokens": 0, "messages": []}, "max_tokens"),
        (CHAT, {"model": "p", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        (CHAT, {"messages": [{"role": "user", "content": "x"}]}, "model"),
        (RESPONSES, {"model": "p", "input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
        (RESPONSES, {"model": "p", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ],
)
async def test_malformed_requests_get_400_naming_the_field(proxy, scripted_policy, path, body, param):
    route = proxy.open_rollout("bad", scripted_policy([]))
    r = await post(proxy, route, path, body)
    assert r.status_code == 400
    error = r.json()["error"]
    if path == MESSAGES:
        assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert error["type"] == "invalid_request_error" and error["param"] == param
    assert param in error["message"]
    (call,) = proxy.close_rollout("bad")
    assert call.error.startswith("invalid_request") and call.request == body


async def test_body_that_is_not_json_gets_400(proxy, scripted_policy):
    route = proxy.open_rollout("notjson", scripted_policy([]))
    async with httpx.AsyncClient(base_url=proxy.base_url(route)) as client:
        r = await client.post(CHAT, content=b"{nope", headers=headers(route))
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


async def test_call_cap_is_a_fast_non_retryable_error(proxy, scripted_policy):
    route = proxy.open_rollout("loop", scripted_policy(["again"] * 10), RolloutLimits(max_calls=2))
    async with anthropic.AsyncAnthropic(
        base_url=proxy.base_url(route), api_key=route.api_key
    ) as client:  # SDK retries on
        for _ in range(2):
            await client.messages.create(**GOOD[MESSAGES])
        started = time.perf_counter()
        with pytest.raises(anthropic.BadRequestError, match="cap of 2 model calls"):
            await client.messages.create(**GOOD[MESSAGES])
    assert time.perf_counter() - started < 2.0  # not retried
    stats = proxy.stats("loop")
    assert (stats.calls, stats.completed_calls, stats.error_kinds) == (3, 2, {"call_cap": 1})


async def test_token_budget_and_context_length(proxy, scripted_policy):
    route = proxy.open_rollout("budget", scripted_policy(["word " * 100] * 5), RolloutLimits(max_tokens=80))
    async with openai.AsyncOpenAI(base_url=proxy.base_url(route) + "/v1", api_key=route.api_key) as client:
        first = await client.chat.completions.create(**GOOD[CHAT])
        assert first.choices[0].finish_reason == "length"  # clamped to what is left of the budget
        assert first.usage.prompt_tokens + first.usage.completion_tokens == 80
        with pytest.raises(openai.BadRequestError, match="token budget"):
            await client.chat.completions.create(**GOOD[CHAT])

    small = proxy.open_rollout("small", scripted_policy(["x"], max_context=20))
    r = await post(proxy, small, MESSAGES, {**GOOD[MESSAGES], "messages": [{"role": "user", "content": "long " * 50}]})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("prompt is too long: ")
    r = await post(proxy, small, CHAT, {**GOOD[CHAT], "messages": [{"role": "user", "content": "long " * 50}]})
    assert r.json()["error"]["code"] == "context_length_exceeded"


async def test_engine_timeout_and_failure_are_recorded_and_non_retryable(tmp_path, renderer):
    from clawgym_env.proxy import ServingProxy

    async with ServingProxy(tmp_path, port=0, unix_socket=None, engine_timeout_s=0.2) as proxy:
        slow = SlowTestEngine(delay_s=5)
        route = proxy.open_rollout("slow", Policy(engine=slow, renderer=renderer))
        r = await post(proxy, route, RESPONSES, GOOD[RESPONSES])
        assert r.status_code == 400 and r.json()["error"]["code"] == "engine_timeout"
        await asyncio.sleep(0)
        assert slow.cancelled == 1  # the engine's slot was freed
        broken = proxy.open_rollout(
            "broken", Policy(engine=SlowTestEngine(0, fail=RuntimeError("CUDA fell over")), renderer=renderer)
        )
        r = await post(proxy, broken, MESSAGES, GOOD[MESSAGES])
        assert r.status_code == 400 and "CUDA fell over" in r.json()["error"]["message"]
        log = proxy.log_path
    errors = [c.error.split(":")[0] for c in read_calls(log)]
    assert errors == ["engine_timeout", "engine_error"]


async def test_client_disconnect_frees_the_engine_and_is_recorded(proxy, renderer):
    slow = SlowTestEngine(delay_s=30)
    route = proxy.open_rollout("gone", Policy(engine=slow, renderer=renderer))
    async with httpx.AsyncClient(base_url=proxy.base_url(route)) as client:
        task = asyncio.create_task(
            client.post(MESSAGES, json={**GOOD[MESSAGES], "stream": True}, headers=headers(route))
        )
        await asyncio.sleep(0.3)
        task.cancel()  # the harness hangs up mid-stream
        with pytest.raises(asyncio.CancelledError):
            await task
    for _ in range(100):
        if proxy.stats("gone").disconnects:
            break
        await asyncio.sleep(0.02)
    assert slow.cancelled == 1 and slow.finished == 0
    (call,) = proxy.close_rollout("gone")
    assert call.error.startswith("client_disconnected") and call.streamed


async def test_concurrent_rollouts_never_see_each_other(proxy, scripted_policy):
    routes = [proxy.open_rollout(f"iso{i}", scripted_policy([f"answer {i}"] * 4)) for i in range(6)]

    async def run(i: int, route) -> list[str]:
        out = []
        async with openai.AsyncOpenAI(base_url=proxy.base_url(route) + "/v1", api_key=route.api_key) as client:
            for turn in range(3):
                c = await client.chat.completions.create(
                    model="p", messages=[{"role": "user", "content": f"rollout {i} turn {turn}"}]
                )
                out.append(c.choices[0].message.content)
        return out

    results = await asyncio.gather(*(run(i, r) for i, r in enumerate(routes)))
    assert results == [[f"answer {i}"] * 3 for i in range(6)]
    keys = {r.api_key for r in routes}
    assert len(keys) == 6
    for i, route in enumerate(routes):
        calls = proxy.close_rollout(route.rollout_id)
        assert [c.rollout_id for c in calls] == [route.rollout_id] * 3
        assert all(f"rollout {i} turn" in str(c.request) for c in calls)


async def test_models_head_count_tokens_and_openapi(proxy, scripted_policy, renderer):
    route = proxy.open_rollout("meta", scripted_policy([], name="qwen-policy"))
    async with httpx.AsyncClient(base_url=proxy.origin) as client:
        assert (await client.head("/")).status_code == 200
        assert (await client.head("/rollouts/meta")).status_code == 200
        assert (await client.head("/rollouts/other")).status_code == 200  # HEAD tells nothing about rollouts
        schema = (await client.get("/openapi.json")).json()
    paths = schema["paths"]
    assert {
        "/rollouts/{rollout_id}/v1/messages",
        "/rollouts/{rollout_id}/v1/chat/completions",
        "/rollouts/{rollout_id}/v1/responses",
    } <= set(paths)
    body_ref = paths["/rollouts/{rollout_id}/v1/messages"]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]["$ref"]
    assert body_ref.split("/")[-1] in schema["components"]["schemas"]

    async with openai.AsyncOpenAI(base_url=proxy.base_url(route) + "/v1", api_key=route.api_key) as oa:
        assert [m.id async for m in oa.models.list()] == ["qwen-policy"]
    async with anthropic.AsyncAnthropic(base_url=proxy.base_url(route), api_key=route.api_key) as an:
        count = await an.messages.count_tokens(model="p", messages=[{"role": "user", "content": "hello there"}])
    from clawgym_env.chat.conversation import Conversation, Message

    assert count.input_tokens == renderer.count_tokens(Conversation([Message("user", "hello there")]))


async def test_unix_socket_listener(tmp_path, scripted_policy):
    from clawgym_env.proxy import ServingProxy

    async with ServingProxy(tmp_path / "run") as proxy:  # unix socket only, the default
        sock = proxy.endpoint.unix_socket
        assert sock is not None and sock.exists() and proxy.endpoint.port is None
        route = proxy.open_rollout("uds", scripted_policy(["over the socket"]))
        transport = httpx.AsyncHTTPTransport(uds=str(sock))
        async with httpx.AsyncClient(transport=transport, base_url="http://sandbox" + route.path_prefix) as client:
            client.headers["x-api-key"] = route.api_key
            r = await client.post(MESSAGES + "?beta=true", json=GOOD[MESSAGES])
        assert r.json()["content"] == [{"type": "text", "text": "over the socket"}]
    assert not sock.exists()
