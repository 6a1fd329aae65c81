"""VLLMServerPool on two real vLLM server processes of tiny-qwen3-h64 (loopback): routing, weights reaching every
server, per-call version checks, a server killed mid-run and restarted.

The servers are started once for the module (~1 min each on the shared 2-core machine, started in parallel);
the tests run in order on one event loop and build on each other's state (versions, a killed server).
"""

import asyncio

import pytest
import pytest_asyncio
import torch

from clawgym_env.engines.vllm_engine import VLLM_MISSING, vllm_available
from clawgym_env.engines.weight_broadcast import default_backend
from clawgym_env.interfaces import SamplingParams

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason=VLLM_MISSING),
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(900),
]

MODEL = "tiny-qwen3-h64"
FLOAT32_TOLERANCE = 1e-4  # as for the in-process engine (test_vllm_engine.LOGPROB_TOLERANCE)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(tmp_path_factory):
    from clawgym_env.engines.vllm_server import VLLMServerPool

    p = await asyncio.to_thread(
        VLLMServerPool.launch, MODEL, 2, dtype="float32", max_model_len=1024, kv_cache_memory_bytes=64 * 2**20
    )
    p.checkpoint_dir = tmp_path_factory.mktemp("weights")
    yield p
    await p.aclose()
    assert not any(s.alive() for s in p.servers)


@pytest.fixture(scope="module")
def hf_model():
    from clawgym_env.engines.models import load_policy_model

    model, _ = load_policy_model(MODEL)
    return model


def teacher_forced(model, prompt, ids):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0]
    logp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(ids)], -1)
    return [float(logp[i, t]) for i, t in enumerate(ids)]


def prompts(qwen_tok, n, tag):
    return [
        qwen_tok.apply_chat_template(
            [{"role": "user", "content": f"{tag} task {i}: list the files."}],
            add_generation_prompt=True,
            return_dict=False,
        )
        for i in range(n)
    ]


def holder(pool, seq):
    """[the server the pool recorded as holding exactly `seq`], or []."""
    match = pool.routes.find(seq)
    return [match.found.server] if match.found is not None and match.found.length == len(seq) else []


async def test_rollouts_spread_over_servers_and_stick_to_theirs(pool, qwen_tok, hf_model):
    firsts = prompts(qwen_tok, 4, "spread")
    gens = await asyncio.gather(*(pool.generate(p, SamplingParams(max_tokens=8, seed=i)) for i, p in enumerate(firsts)))
    assert all(s.served >= 1 for s in pool.slots)  # concurrent new rollouts went to both servers
    for p, g in zip(firsts, gens):
        assert max(abs(a - b) for a, b in zip(g.logprobs, teacher_forced(hf_model, p, g.token_ids))) < FLOAT32_TOLERANCE
    # each rollout's next turn goes to the server holding its context
    for p, g in zip(firsts, gens):
        (owner,) = holder(pool, p + g.token_ids)
        turn2 = p + g.token_ids + [198]
        g2 = await pool.generate(turn2, SamplingParams(max_tokens=4, seed=9))
        assert holder(pool, turn2 + g2.token_ids) == [owner]


async def test_weight_update_reaches_every_server(pool, qwen_tok, hf_model):
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if "mlp" in name or "self_attn" in name:
                param.mul_(1.5)
            if "embed_tokens" in name:  # tied: the head changes with it (vLLM must re-tie it after a reload)
                param.add_(0.01 * torch.randn_like(param))
    await pool.aupdate_weights(hf_model.state_dict(), 1)
    assert [await pool.server_version(s.url) for s in pool.slots] == [1, 1]
    firsts = prompts(qwen_tok, 4, "after-update")
    gens = await asyncio.gather(*(pool.generate(p, SamplingParams(max_tokens=8, seed=i)) for i, p in enumerate(firsts)))
    holders = [holder(pool, p + g.token_ids) for p, g in zip(firsts, gens)]
    assert all(any(h and h[0] is s for h in holders) for s in pool.slots)  # both servers took new rollouts
    for p, g in zip(firsts, gens):
        assert g.policy_version == 1
        assert max(abs(a - b) for a, b in zip(g.logprobs, teacher_forced(hf_model, p, g.token_ids))) < FLOAT32_TOLERANCE


async def test_killed_server_fails_only_its_rollouts_then_restart_is_survived(pool, qwen_tok, hf_model):
    from clawgym_env.engines.vllm_server import ServerUnavailable

    firsts = prompts(qwen_tok, 2, "kill")
    gens = await asyncio.gather(*(pool.generate(p, SamplingParams(max_tokens=6, seed=i)) for i, p in enumerate(firsts)))
    owners = [holder(pool, p + g.token_ids)[0] for p, g in zip(firsts, gens)]
    assert owners[0] is not owners[1]
    victim = pool.servers[pool.slots.index(owners[0])]
    first_life = owners[0].life  # vLLM's answers name the server life (BootIdMiddleware): no RPC per call
    assert first_life is not None and first_life[1] == pool.policy_version == 1
    await asyncio.to_thread(victim.kill)

    failed = pool.stats.failed_calls
    with pytest.raises(ServerUnavailable):  # the rollout on the killed server fails ...
        await pool.generate(firsts[0] + gens[0].token_ids + [198], SamplingParams(max_tokens=4))
    with pytest.raises(ServerUnavailable, match="down"):  # ... and stays failed (its context is gone)
        await pool.generate(firsts[0] + gens[0].token_ids + [198, 13], SamplingParams(max_tokens=4))
    assert pool.stats.failed_calls == failed + 2 and pool.stats.servers_lost == 1
    # ... while the other rollout continues, and new rollouts go to the live server
    ok = await pool.generate(firsts[1] + gens[1].token_ids + [198], SamplingParams(max_tokens=4))
    assert ok.policy_version == 1
    fresh_prompt = prompts(qwen_tok, 1, "while-down")[0]
    fresh = await pool.generate(fresh_prompt, SamplingParams(max_tokens=4))
    assert fresh.policy_version == 1 and holder(pool, fresh_prompt + fresh.token_ids) == [owners[1]]

    # restarted (initial weights, version 0): revived only after it is brought to version 1
    await asyncio.to_thread(lambda: (victim.start(), victim.wait_ready(900)))
    assert await pool.server_version(victim.url) == 0
    new = prompts(qwen_tok, 2, "after-restart")
    gens = await asyncio.gather(*(pool.generate(p, SamplingParams(max_tokens=8, seed=i)) for i, p in enumerate(new)))
    assert pool.stats.servers_revived == 1 and owners[0].alive
    assert owners[0].life is not None and owners[0].life[0] != first_life[0]  # a new life, its version read anew
    assert await pool.server_version(victim.url) == 1
    for p, g in zip(new, gens):
        assert g.policy_version == 1
        assert max(abs(a - b) for a, b in zip(g.logprobs, teacher_forced(hf_model, p, g.token_ids))) < FLOAT32_TOLERANCE


async def test_stream_through_the_pool_equals_generate(pool, qwen_tok):
    """`stream()` routes like `generate()` (the next turn goes to the server holding the context) and
    yields the same ids and logprobs in several chunks (the first token, then 4 per chunk), stamped with the
    server's policy version."""
    (first,) = prompts(qwen_tok, 1, "stream")
    sampling = SamplingParams(max_tokens=12, seed=3)
    whole = await pool.generate(first, sampling)
    (owner,) = holder(pool, first + whole.token_ids)
    chunks = [chunk async for chunk in pool.stream(first, sampling)]
    assert len(chunks) > 2 and chunks[-1].finish_reason == whole.finish_reason
    sizes = [len(c.token_ids) for c in chunks if c.token_ids]  # vLLM's stream_interval (RemoteEngine asks for 4)
    # at least 4 per chunk between the first and the last: more when vLLM merged the outputs of a slow reader
    assert sizes[0] == 1 and all(size >= 4 for size in sizes[1:-1]) and len(sizes) <= 2 + 11 // 4, sizes
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids
    assert [lp for c in chunks for lp in c.logprobs] == pytest.approx(whole.logprobs, abs=1e-4)
    assert {c.policy_version for c in chunks} == {whole.policy_version}
    assert holder(pool, first + whole.token_ids) and owner.in_flight == 0


def perturb(model, scale: float) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "mlp" in name:
                param.mul_(scale)
            if "embed_tokens" in name:
                param.add_(0.01 * torch.randn_like(param))


async def check_serves(pool, qwen_tok, hf_model, version: int, tag: str) -> None:
    firsts = prompts(qwen_tok, 2 * len(pool.slots), tag)
    gens = await asyncio.gather(*(pool.generate(p, SamplingParams(max_tokens=8, seed=i)) for i, p in enumerate(firsts)))
    for p, g in zip(firsts, gens):
        assert g.policy_version == version
        assert max(abs(a - b) for a, b in zip(g.logprobs, teacher_forced(hf_model, p, g.token_ids))) < FLOAT32_TOLERANCE


async def test_broadcast_weights_reach_every_server_over_a_process_group(pool, qwen_tok, hf_model):
    """weight_transfer="broadcast": the trainer (rank 0) and each server's worker join one gloo group (NCCL on
    GPUs) and the tensors go through it, not through a file; the next update reuses the group; the checkpoint
    file is still written afterwards, for a server that comes back later."""
    pool.weight_transfer = "broadcast"
    for version, scale in ((2, 0.8), (3, 1.25)):
        perturb(hf_model, scale)
        await pool.aupdate_weights(hf_model.state_dict(), version)
        if version == 2:
            group = pool._group
            assert group is not None and group.world_size == 3 and group.backend == default_backend()
        assert pool._group is group  # same servers: the group is kept
        assert pool.stats.broadcast_failures == 0
        assert [await pool.server_version(s.url) for s in pool.slots] == [version, version]
        await check_serves(pool, qwen_tok, hf_model, version, f"broadcast-{version}")
    latest = await pool.checkpoint_written()
    assert latest is not None and latest.name == "policy-v3.safetensors"


async def test_broadcast_that_cannot_start_falls_back_to_the_file(pool, qwen_tok, hf_model):
    """A broadcast that fails (here: a backend neither side has) loads the checkpoint file instead, and says so
    in `stats.broadcast_failures`; the servers stay in service."""
    pool.broadcast_backend = "ucc"
    pool._group, pool._group_urls = None, []  # force a new group on the next update
    perturb(hf_model, 0.9)
    await pool.aupdate_weights(hf_model.state_dict(), 4)
    assert pool.stats.broadcast_failures == 1 and all(s.alive for s in pool.slots)
    assert [await pool.server_version(s.url) for s in pool.slots] == [4, 4]
    await check_serves(pool, qwen_tok, hf_model, 4, "fallback")
    pool.broadcast_backend = default_backend()


async def test_broadcast_regroups_without_a_server_that_died(pool, qwen_tok, hf_model):
    """A server that died since the last update is found before the broadcast (it would stall the group until
    its timeout): it is lost, and the update goes to a new group of the live servers."""
    lost = pool.stats.servers_lost
    victim = pool.servers[1]
    await asyncio.to_thread(victim.kill)
    perturb(hf_model, 1.1)
    await pool.aupdate_weights(hf_model.state_dict(), 5)
    assert pool.stats.servers_lost == lost + 1 and not pool.slots[1].alive
    assert pool.stats.broadcast_failures == 1 and pool._group is not None and pool._group.world_size == 2
    assert await pool.server_version(pool.slots[0].url) == 5
    await check_serves(pool, qwen_tok, hf_model, 5, "regrouped")


async def test_proxy_shards_run_their_own_clients_and_follow_an_update(pool, qwen_tok, hf_model, tmp_path):
    """A `ShardedProxy` over this pool: each shard reaches the real servers with its own client (started
    knowing which server is down), the calls' logprobs are the model's, and a weight update here holds the
    shards and lets them go on at the new version."""
    import httpx

    from clawgym_env.chat import ChatMLRenderer
    from clawgym_env.interfaces import Policy
    from clawgym_env.proxy import ShardedProxy

    pool.weight_transfer = "disk"
    version, main_calls = pool.policy_version, pool.stats.calls
    policy = Policy(engine=pool, renderer=ChatMLRenderer(qwen_tok))

    async def chat(proxy, route, turn: int) -> None:
        body = {"model": "policy", "messages": [{"role": "user", "content": f"List the files, {turn}."}]}
        async with httpx.AsyncClient(base_url=proxy.base_url(route), timeout=120) as client:
            answer = await client.post(
                "/v1/chat/completions", json={**body, "max_tokens": 8}, headers={"x-api-key": route.api_key}
            )
        assert answer.status_code == 200, answer.text

    def check_logprobs(calls) -> None:
        for call in calls:
            want = teacher_forced(hf_model, call.prompt_ids, call.generated_ids)
            assert max(abs(a - b) for a, b in zip(call.logprobs, want)) < FLOAT32_TOLERANCE

    async with ShardedProxy(tmp_path / "run", shards=2, port=0) as proxy:
        routes = [proxy.open_rollout(f"shard-{i}", policy) for i in range(2)]
        await asyncio.gather(*(chat(proxy, r, 0) for r in routes))
        check_logprobs([c for r in routes for c in proxy.calls(r.rollout_id)])
        perturb(hf_model, 0.95)
        await pool.aupdate_weights(hf_model.state_dict(), version + 1)
        await asyncio.gather(*(chat(proxy, r, 1) for r in routes))
        calls = [proxy.close_rollout(r.rollout_id) for r in routes]
        check_logprobs([rollout[1] for rollout in calls])
        report = pool.report()
    assert [[c.policy_version for c in rollout] for rollout in calls] == [[version, version + 1]] * 2
    assert pool.stats.calls == main_calls  # every call went through a shard's own client
    assert sum(f["calls"] for f in report["followers"]) == 4
    assert all(f["failed_calls"] == 0 for f in report["followers"])
