"""A `VLLMServerPool` behind a `ShardedProxy`: each shard runs its own client of the same servers, and the pool
that updates weights holds every shard's client around the update, so no call of any process spans it.

The servers are the token-server stand-in (vLLM's token API, its version RPC and its weight-file load, over
real HTTP) in front of `VersionedEngine`, a named test double that notes when it generates and loads."""

from __future__ import annotations

import asyncio
import time

import httpx
import torch

from clawgym_env.engines.vllm_server import VLLMServerPool
from clawgym_env.interfaces import Generation, Policy, SamplingParams
from clawgym_env.proxy import ShardedProxy
from tests.engines.test_vllm_pool_rpc import stand_in


class VersionedEngine:
    """Test double: two fixed tokens after `delay_s`; `update_weights` sets the version and notes what ran."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.policy_version = delay_s, 0
        self.active = self.started = 0
        self.ended_at: list[float] = []
        self.loads: list[tuple[int, int, float]] = []  # (version, generations running then, when)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        self.started += 1
        self.active += 1
        try:
            await asyncio.sleep(self.delay_s)
            return Generation(token_ids=[5, 6], logprobs=[-0.5, -0.25], finish_reason="length")
        finally:
            self.active -= 1
            self.ended_at.append(time.monotonic())

    def update_weights(self, state_dict, version: int) -> None:
        assert set(state_dict) == {"w"}  # the stand-in read the pool's checkpoint file
        self.loads.append((version, self.active, time.monotonic()))
        self.policy_version = version


async def chat(proxy: ShardedProxy, route) -> httpx.Response:
    async with httpx.AsyncClient(base_url=proxy.base_url(route), timeout=60) as client:
        body = {"model": "policy", "messages": [{"role": "user", "content": "go"}], "max_tokens": 2}
        return await client.post("/v1/chat/completions", json=body, headers={"x-api-key": route.api_key})


async def test_shard_clients_of_a_pool_follow_its_weight_updates(tmp_path, renderer):
    engines = [VersionedEngine(delay_s=1.0), VersionedEngine(delay_s=1.0)]
    async with stand_in(engines[0], "life-a") as (url_a, _, _), stand_in(engines[1], "life-b") as (url_b, _, _):
        pool = VLLMServerPool([url_a, url_b], checkpoint_dir=tmp_path / "weights")
        policy = Policy(engine=pool, renderer=renderer)
        try:
            async with ShardedProxy(tmp_path / "run", shards=2, port=0) as proxy:
                routes = [proxy.open_rollout(f"r{i}", policy) for i in range(4)]
                assert [s["open_rollouts"] for s in proxy.shard_report()] == [2, 2]
                first = [asyncio.create_task(chat(proxy, r)) for r in routes]
                while sum(e.started for e in engines) < 4:  # every first call is generating
                    await asyncio.sleep(0.01)
                await pool.aupdate_weights({"w": torch.zeros(2)}, 1)  # waits for the shards' calls to end
                assert all(r.status_code == 200 for r in await asyncio.gather(*first))
                second = await asyncio.gather(*(chat(proxy, r) for r in routes))
                assert all(r.status_code == 200 for r in second)
                calls = [proxy.close_rollout(r.rollout_id) for r in routes]
                report = pool.report()
        finally:
            await pool.aclose()
    first_ended = [t for e in engines for t in e.ended_at[:2]]
    for engine in engines:
        ((version, running, loaded_at),) = engine.loads
        assert version == 1 and running == 0  # no generation ran while the weights changed
        assert all(t <= loaded_at for t in first_ended)  # the shards' calls ended before any server loaded
    assert [[c.policy_version for c in rollout] for rollout in calls] == [[0, 1]] * 4
    assert all(c.error is None for rollout in calls for c in rollout)
    # every call went through a shard's own client of the servers, none through this process's
    assert report["calls"] == 0 and report["weight_updates"] == 1
    followers = report["followers"]
    assert len(followers) == 2 and sum(f["calls"] for f in followers) == 8
    assert all(f["failed_calls"] == 0 and f["policy_version"] == 1 for f in followers)


async def test_without_engines_in_shards_a_pool_is_reached_through_the_hub(tmp_path, renderer):
    engine = VersionedEngine(delay_s=0.0)
    async with stand_in(engine, "life-a") as (url, _, _):
        pool = VLLMServerPool([url], checkpoint_dir=tmp_path / "weights")
        try:
            async with ShardedProxy(tmp_path / "run", shards=2, port=0, engines_in_shards=False) as proxy:
                route = proxy.open_rollout("r", Policy(engine=pool, renderer=renderer))
                assert (await chat(proxy, route)).status_code == 200
                assert [c.error for c in proxy.close_rollout("r")] == [None]
            assert pool.report()["calls"] == 1 and "followers" not in pool.report()
        finally:
            await pool.aclose()


async def test_policies_made_per_rollout_over_one_pool_share_each_shards_client(tmp_path, renderer):
    """One client of the servers per engine and shard, whatever the policies over it (made per rollout, they
    would otherwise leave a pool, its thread and its connections behind in the shard for each)."""
    engine = VersionedEngine(delay_s=0.0)
    async with stand_in(engine, "life-a") as (url, _, _):
        pool = VLLMServerPool([url], checkpoint_dir=tmp_path / "weights")
        try:
            async with ShardedProxy(tmp_path / "run", shards=2, port=0) as proxy:
                routes = [proxy.open_rollout(f"r{i}", Policy(engine=pool, renderer=renderer)) for i in range(4)]
                answers = await asyncio.gather(*(chat(proxy, r) for r in routes))
                assert all(a.status_code == 200 for a in answers)
                assert [len(proxy.close_rollout(r.rollout_id)) for r in routes] == [1] * 4
                followers = pool.report()["followers"]
            assert len(followers) == 2 and sum(f["calls"] for f in followers) == 4
        finally:
            await pool.aclose()
