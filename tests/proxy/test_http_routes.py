"""The hot routes (clawgym_env.proxy.http_routes): generation calls skip FastAPI's routing, everything else
still goes through the app, and a handler's unexpected exception still gets a 500 in the API's format."""

from __future__ import annotations

import httpx

from clawgym_env.interfaces import RolloutLimits

from .conftest import WRITE_SCHEMA, tagged

TOOLS = [{"type": "function", "function": {"name": "write", "description": "write", "parameters": WRITE_SCHEMA}}]


async def test_generation_routes_take_the_hot_path_and_the_rest_the_app(proxy, scripted_policy):
    policy = scripted_policy(lambda _p: tagged("write", {"path": "a.txt", "content": "1"}))
    route = proxy.open_rollout("hot1", policy, RolloutLimits(max_calls=4))
    seen: list[str] = []
    real = proxy._generation_call

    async def spy(request, rollout_id, adapter):
        seen.append(f"{request.scope['path']} {rollout_id} {adapter.style.value}")
        return await real(request, rollout_id, adapter)

    proxy._generation_call = spy
    headers = {"authorization": f"Bearer {route.api_key}", "anthropic-version": "2023-06-01"}
    body = {"model": "p", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    async with httpx.AsyncClient(base_url=proxy.origin) as client:
        chat = await client.post(f"{route.path_prefix}/v1/chat/completions", json=body, headers=headers)
        assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["tool_calls"]
        anthropic = {"model": "p", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
        messages = await client.post(f"{route.path_prefix}/v1/messages", json=anthropic, headers=headers)
        assert messages.status_code == 200 and messages.json()["type"] == "message"
        count = await client.post(f"{route.path_prefix}/v1/messages/count_tokens", json=anthropic, headers=headers)
        assert count.status_code == 200 and count.json()["input_tokens"] > 0
        assert (await client.get("/health")).json() == {"status": "ok"}
        assert "/rollouts/{rollout_id}/v1/messages" in (await client.get("/openapi.json")).json()["paths"]
        models = await client.get(f"{route.path_prefix}/v1/models", headers=headers)
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "policy"
        # not a hot path (trailing slash, unknown suffix, GET): FastAPI answers as it did before
        slash = await client.post(f"{route.path_prefix}/v1/chat/completions/", json=body, headers=headers)
        assert slash.status_code in (307, 404, 405)
        unknown = await client.post(f"{route.path_prefix}/v1/nothing", json=body, headers=headers)
        assert unknown.status_code == 404
        wrong = await client.post(
            f"{route.path_prefix}/v1/chat/completions", json=body, headers={"authorization": "Bearer nope"}
        )
        assert wrong.status_code == 401 and wrong.json()["error"]["type"]
    assert seen == [
        "/rollouts/hot1/v1/chat/completions hot1 openai-chat",
        "/rollouts/hot1/v1/messages hot1 anthropic-messages",
        "/rollouts/hot1/v1/chat/completions hot1 openai-chat",
    ]


async def test_an_unexpected_handler_exception_is_a_500_in_the_apis_format(proxy, scripted_policy):
    route = proxy.open_rollout("hot2", scripted_policy(["x"]))

    async def broken(request, rollout_id, adapter):
        raise RuntimeError("bug")

    proxy._generation_call = broken
    headers = {"authorization": f"Bearer {route.api_key}", "x-api-key": route.api_key}
    async with httpx.AsyncClient(base_url=proxy.origin) as client:
        chat = await client.post(f"{route.path_prefix}/v1/chat/completions", json={}, headers=headers)
        assert chat.status_code == 500
        assert chat.json()["error"]["message"] == "clawgym proxy internal error: RuntimeError"
        anthropic = await client.post(f"{route.path_prefix}/v1/messages", json={}, headers=headers)
        assert anthropic.status_code == 500 and anthropic.json()["type"] == "error"
        assert (await client.get("/health")).status_code == 200  # the server goes on
