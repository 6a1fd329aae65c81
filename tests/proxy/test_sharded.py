"""`ShardedProxy`: rollouts spread over shard processes, each call served by its rollout's shard with the
engine of this process (through the engine hub), recorded as one `ServingProxy` records it; a shard that
dies is counted and its rollouts' calls are read back from its log."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest

from clawgym_env.interfaces import Generation, Policy, SamplingParams
from clawgym_env.proxy import ServingProxy
from clawgym_env.proxy.shards import ShardDown, ShardedProxy
from clawgym_env.records import read_calls
from tests.proxy.test_sdk_roundtrip import DRIVERS, SCRIPT, client_for, tool_names_of


@pytest.fixture
async def sharded(tmp_path):
    proxy = ShardedProxy(tmp_path / "run", shards=2, port=0)
    await proxy.start()
    failures = None
    try:
        yield proxy
    finally:
        failures = dict(proxy.shard_failures)
        await proxy.stop()
    assert dict(proxy.shard_failures) == failures  # stopping is no failure


async def drive(proxy, route, api: str, stream: bool) -> list:
    async with client_for(api, proxy, route) as client:
        return await DRIVERS[api](client, stream, True)


@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
async def test_rollouts_spread_over_shards_record_what_one_proxy_records(sharded, scripted_policy, tmp_path, api):
    routes = []
    for i in range(4):  # the shard with the fewest rollouts gets the next: 2 and 2
        sharded.endpoint_for(f"r{i}")
        routes.append(sharded.open_rollout(f"r{i}", scripted_policy(list(SCRIPT))))
    sockets = {sharded.endpoint_for(r.rollout_id).unix_socket for r in routes}
    assert len(sockets) == 2 and all(s is not None and s.exists() for s in sockets)
    assert [s["open_rollouts"] for s in sharded.shard_report()] == [2, 2]
    assert all(50 < s["rss_mb"] < 2000 for s in sharded.shard_report())  # a whole proxy process each
    finals = await asyncio.gather(*(drive(sharded, r, api, stream=i % 2 == 0) for i, r in enumerate(routes)))
    assert all([tool_names_of(api, f) for f in fs] == [["write"], ["ls"], []] for fs in finals)
    sharded_calls = {r.rollout_id: sharded.close_rollout(r.rollout_id) for r in routes}

    async with ServingProxy(tmp_path / "single", port=0) as single:  # the same rollouts on one process
        for i in range(4):
            route = single.open_rollout(f"r{i}", scripted_policy(list(SCRIPT)))
            await drive(single, route, api, stream=i % 2 == 0)
            expected = single.close_rollout(route.rollout_id)
            got = sharded_calls[route.rollout_id]
            assert [(c.prompt_ids, c.generated_ids, c.logprobs) for c in got] == [
                (c.prompt_ids, c.generated_ids, c.logprobs) for c in expected
            ]
            assert all(c.error is None and c.prefix.extended for c in got[1:])
    # each shard's durable log holds its own rollouts' calls
    for shard in sharded.shards:
        logged = {c.rollout_id for c in read_calls(shard.log_path)}
        assert len(logged) == 2
    assert sharded.table_sizes()["open"] == 0


async def test_a_rollouts_key_opens_only_its_own_route_on_its_own_shard(sharded, scripted_policy):
    for rid in ("a", "b"):
        sharded.endpoint_for(rid)
    a, b = (sharded.open_rollout(rid, scripted_policy(["hi"])) for rid in ("a", "b"))
    socket_a, socket_b = (sharded.endpoint_for(r.rollout_id).unix_socket for r in (a, b))
    assert socket_a != socket_b
    body = {"model": "policy", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}

    async def post(socket, route, key) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(socket))) as client:
            url = f"http://proxy{route.path_prefix}/v1/chat/completions"
            return await client.post(url, json=body, headers={"authorization": f"Bearer {key}"})

    assert (await post(socket_b, a, a.api_key)).status_code == 401  # a's route and key, b's shard: unknown there
    assert (await post(socket_a, a, b.api_key)).status_code == 401  # a's shard, b's key
    answer = await post(socket_a, a, a.api_key)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "hi"
    assert [c.generated_ids for c in sharded.close_rollout("a")] != []
    assert sharded.close_rollout("b") == []


class FailingEngine:
    """A named test double: an engine in the main process that fails every call."""

    policy_version = 3

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        raise RuntimeError("the GPU caught fire")

    def update_weights(self, state_dict, version: int) -> None: ...


async def test_an_engine_failure_in_this_process_is_the_calls_error_on_the_shard(sharded, renderer):
    sharded.endpoint_for("f")
    route = sharded.open_rollout("f", Policy(engine=FailingEngine(), renderer=renderer))
    async with client_for("chat", sharded, route) as client:
        with pytest.raises(Exception, match="GPU caught fire"):
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    stats = sharded.stats("f")
    assert stats.errors == 1 and "engine_error" in stats.error_kinds
    (call,) = sharded.close_rollout("f")
    assert "RuntimeError: the GPU caught fire" in call.error


async def test_a_dead_shard_is_counted_its_calls_read_back_and_a_new_one_takes_its_place(sharded, scripted_policy):
    for rid in ("x", "y"):
        sharded.endpoint_for(rid)
    routes = [sharded.open_rollout(rid, scripted_policy(list(SCRIPT))) for rid in ("x", "y")]
    await asyncio.gather(*(drive(sharded, r, "anthropic", stream=True) for r in routes))
    dead = sharded._route_table["x"]
    os.kill(dead.process.pid, signal.SIGKILL)
    await asyncio.to_thread(dead.process.wait, 10)

    calls = sharded.close_rollout("x")  # its shard is gone: from the durable log
    assert [c.call_index for c in calls] == [0, 1, 2] and all(c.generated_ids for c in calls)
    assert sharded.recovered_rollouts == 1 and sum(sharded.shard_failures.values()) == 1
    assert "exited" in dead.down
    assert len(sharded.close_rollout("y")) == 3  # the other shard serves on
    for _ in range(600):  # a new process takes the dead one's place, with a log of its own
        if dead not in sharded.shards:
            break
        await asyncio.sleep(0.05)
    assert sharded.respawned == 1 and all(s["down"] is None for s in sharded.shard_report())
    replacement = sharded.shards[dead.index]
    assert replacement.log_path.parent.name == f"shard-{dead.index}.1"
    fresh = [sharded.open_rollout(f"new{i}", scripted_policy(list(SCRIPT))) for i in range(2)]  # one on each
    sockets = {sharded.endpoint_for(r.rollout_id).unix_socket for r in fresh}
    assert len(sockets) == 2 and dead.endpoint.unix_socket not in sockets
    await asyncio.gather(*(drive(sharded, r, "chat", stream=False) for r in fresh))
    assert [len(sharded.close_rollout(r.rollout_id)) for r in fresh] == [3, 3]


async def test_shards_that_lose_the_engine_hub_exit_and_are_replaced(sharded, scripted_policy):
    """A shard whose connection to the hub breaks cannot generate: it exits, and the next routing counts it
    and starts a new process in its place, which reaches the hub again."""
    first = [s.process for s in sharded.shards]
    for connection in list(sharded._hub._connections):
        connection.cancel()  # the hub drops both shards' connections
    for process in first:
        assert await asyncio.to_thread(process.wait, 30) == 3
    with pytest.raises(ShardDown, match="no live proxy shard"):  # notices both exits: counted, being replaced
        sharded.endpoint_for("meanwhile")
    assert sum(sharded.shard_failures.values()) == 2
    for _ in range(600):
        if sharded.respawned == 2 and all(s.process not in first and s.endpoint for s in sharded.shards):
            break
        await asyncio.sleep(0.05)
    assert all(s.process not in first and s.down is None for s in sharded.shards)
    routes = [sharded.open_rollout(f"r{i}", scripted_policy(list(SCRIPT))) for i in range(2)]
    await asyncio.gather(*(drive(sharded, r, "anthropic", stream=True) for r in routes))
    assert [len(sharded.close_rollout(r.rollout_id)) for r in routes] == [3, 3]


async def test_a_shard_that_died_before_open_refuses_the_route_clearly(tmp_path, scripted_policy):
    async with ShardedProxy(tmp_path / "run", shards=1, max_respawns=0) as proxy:
        proxy.endpoint_for("z")
        os.kill(proxy.shards[0].process.pid, signal.SIGKILL)
        await asyncio.to_thread(proxy.shards[0].process.wait, 10)
        with pytest.raises(ShardDown, match="shard 0 is down"):
            proxy.open_rollout("z", scripted_policy(["hi"]))
        with pytest.raises(ShardDown, match="no live proxy shard"):
            proxy.endpoint_for("w")
        assert proxy.respawned == 0


def test_bad_options_are_refused_with_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="public_url"):
        ShardedProxy(tmp_path, shards=2, public_url="https://x")
    with pytest.raises(ValueError, match="pass 0"):
        ShardedProxy(tmp_path, shards=2, port=8080)
    with pytest.raises(ValueError, match="at least one"):
        ShardedProxy(tmp_path, shards=0)


# ------------------------------------------- a real engine (tiny Qwen3 on TransformersEngine) through the hub
async def test_logprobs_through_a_shard_equal_teacher_forced_recomputation(sharded, tiny_policy, tiny_model):
    from tests.proxy.test_tiny_model import test_recorded_logprobs_equal_teacher_forced_recomputation as check

    await check(sharded, tiny_policy, tiny_model)


async def test_first_event_through_a_shard_arrives_while_this_process_decodes(sharded, tiny_policy, renderer):
    from tests.proxy.test_live_streaming import test_first_event_arrives_while_the_engine_is_still_decoding as check

    tiny_policy.engine.default_stop_ids = frozenset()
    await check(sharded, tiny_policy, renderer)


async def test_a_client_leaving_a_shard_mid_stream_aborts_the_engine_here_and_keeps_the_partial_ids(
    sharded, tiny_policy
):
    from tests.proxy.test_live_streaming import test_client_leaving_mid_stream_records_the_partial_ids as check

    tiny_policy.engine.default_stop_ids = frozenset()
    await check(sharded, tiny_policy)


async def test_an_engine_timeout_here_is_an_engine_timeout_on_the_shard(sharded, tiny_model, renderer):
    from tests.proxy.test_live_streaming import (
        test_engine_failing_mid_stream_ends_it_with_an_error_event_and_records_the_partial_ids as check,
    )

    await check(sharded, tiny_model, renderer)
