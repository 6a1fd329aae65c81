"""What the proxy keeps after a rollout closes: nothing per rollout beyond a bounded stats table.

Rollouts are opened, served over real HTTP (a tool call, then a spliced echo of it) and closed, in two
rounds; after each round the proxy's per-rollout tables, the rollouts' states, the renderer's block cache
and the loop's tasks are back where they were.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import httpx
import pytest

from clawgym_env.proxy import ServingProxy

from .conftest import WRITE_SCHEMA, tagged

TOOLS = [{"type": "function", "function": {"name": "write", "description": "write a file", "parameters": WRITE_SCHEMA}}]
SYSTEM = {"role": "system", "content": "You write files."}
USER = {"role": "user", "content": "Write 42 to answer.txt"}
KEEP_CLOSED = 8


def answer(prompt: str) -> str:
    return "Done." if "<tool_response>" in prompt else tagged("write", {"path": "answer.txt", "content": "42"})


async def serve_one(client: httpx.AsyncClient, proxy: ServingProxy, rollout_id: str, policy) -> weakref.ref:
    """One rollout: a tool call, then the echo of it with the tool's result; returns a weak ref to its state."""
    route = proxy.open_rollout(rollout_id, policy)
    state = weakref.ref(proxy._rollouts[rollout_id])
    memory = weakref.ref(proxy._rollouts[rollout_id].memory)
    url, key = f"{route.path_prefix}/v1/chat/completions", {"authorization": f"Bearer {route.api_key}"}
    first = await client.post(url, json={"model": "policy", "messages": [SYSTEM, USER], "tools": TOOLS}, headers=key)
    assert first.status_code == 200, first.text
    turn = first.json()["choices"][0]["message"]
    result = {"role": "tool", "tool_call_id": turn["tool_calls"][0]["id"], "content": "ok"}
    second = await client.post(
        url, json={"model": "policy", "messages": [SYSTEM, USER, turn, result], "tools": TOOLS}, headers=key
    )
    assert second.status_code == 200 and second.json()["choices"][0]["message"]["content"] == "Done."
    assert len(proxy.close_rollout(rollout_id)) == 2
    return state, memory


async def serve_round(client, proxy, policy, prefix: str, n: int) -> list[weakref.ref]:
    refs = await asyncio.gather(*(serve_one(client, proxy, f"{prefix}{i}", policy) for i in range(n)))
    return [r for pair in refs for r in pair]


async def settled_task_count() -> int:
    for _ in range(5):  # let finished handlers' tasks be collected by the loop
        await asyncio.sleep(0)
    return len(asyncio.all_tasks())


async def test_closed_rollouts_leave_nothing_but_a_bounded_stats_table(tmp_path, scripted_policy):
    policy = scripted_policy(answer)
    async with ServingProxy(tmp_path / "run", port=0, keep_closed=KEEP_CLOSED) as proxy:
        assert proxy.table_sizes() == {"open": 0, "closed_stats": 0}
        async with httpx.AsyncClient(base_url=proxy.origin) as client:
            refs = await serve_round(client, proxy, policy, "warm", 10)
            gc.collect()
            assert [r for r in refs if r() is not None] == []  # every closed state and its splice memory dropped
            baseline = {
                "tables": proxy.table_sizes(),
                "blocks": policy.renderer._encode_pieces.cache_info().currsize,
                "tasks": await settled_task_count(),
            }
            assert baseline["tables"] == {"open": 0, "closed_stats": KEEP_CLOSED}

            refs = await serve_round(client, proxy, policy, "more", 30)
            gc.collect()
            assert [r for r in refs if r() is not None] == []
            after = {
                "tables": proxy.table_sizes(),
                "blocks": policy.renderer._encode_pieces.cache_info().currsize,
                "tasks": await settled_task_count(),
            }
            assert after == baseline
            assert proxy.closed_count == 40

            # the latest closed rollouts still answer stats() (and 410 to their own key); older ones are forgotten
            assert proxy.stats("more29").completed_calls == 2 and proxy.stats("more29").spliced_turns == 1
            with pytest.raises(KeyError, match="latest 8"):
                proxy.stats("warm0")
            body = {"model": "policy", "messages": [USER]}
            # without its key, a closed or forgotten rollout answers like any other route (nothing disclosed)
            assert (await client.post("/rollouts/more29/v1/chat/completions", json=body)).status_code == 401
            assert (await client.post("/rollouts/warm0/v1/chat/completions", json=body)).status_code == 401
            assert (await client.get("/health")).json() == {"status": "ok"}
            assert len(proxy._closed_keys) == KEEP_CLOSED and proxy._in_flight == {}
