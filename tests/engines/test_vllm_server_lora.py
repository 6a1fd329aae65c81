"""LoRA adapters pushed to vLLM servers as adapters (`engine=vllm_server`, `model.lora.sync=adapter`): a real
server of tiny-qwen3-h64 started with LoRA on serves the trainer's log-probs (base + adapter), a new version
replaces the old adapter, a restarted server gets the newest adapter back before it serves again, and a
full-weight push drops the adapter."""

import asyncio
import copy

import httpx
import pytest
import pytest_asyncio

from clawgym_env.engines.vllm_engine import VLLM_MISSING, vllm_available
from clawgym_env.engines.vllm_server import ServerUnavailable, VLLMServerPool
from clawgym_env.interfaces import SamplingParams
from tests.engines.test_vllm_engine import KV_BYTES, LOGPROB_TOLERANCE, MODEL, max_diff, teacher_forced
from tests.engines.test_vllm_lora import _move, adapter_run
from trainers.model import LoraSettings, apply_lora, export_adapter

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason=VLLM_MISSING),
    pytest.mark.timeout(900),
]
TOLERANCE = LOGPROB_TOLERANCE["float32"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(tmp_path_factory):
    p = await asyncio.to_thread(
        VLLMServerPool.launch,
        MODEL,
        1,
        dtype="float32",
        max_model_len=1024,
        kv_cache_memory_bytes=KV_BYTES,
        enable_lora=True,
        max_lora_rank=8,
        checkpoint_dir=str(tmp_path_factory.mktemp("weights")),
    )
    yield p
    await p.aclose()


@pytest.fixture(scope="module")
def policy():
    from clawgym_env.engines.models import load_policy_model

    base, _ = load_policy_model(MODEL)
    return apply_lora(copy.deepcopy(base), LoraSettings(enabled=True, r=8, alpha=16)), base


def served_models(pool: VLLMServerPool) -> set[str]:
    return {m["id"] for m in httpx.get(f"{pool.slots[0].url}/v1/models", timeout=10).json()["data"]}


@pytest.mark.asyncio(loop_scope="module")
async def test_served_logprobs_after_an_adapter_push_are_the_trainers(pool, policy, chat_prompt):
    peft_model, base = policy
    assert pool.supports_adapters
    sampling = SamplingParams(max_tokens=16, seed=1)
    for version in (1, 2):
        _move(peft_model, seed=version)
        await pool.aupdate_adapter(export_adapter(peft_model), version)
        gen = await pool.generate(chat_prompt, sampling)
        assert gen.policy_version == version == pool.policy_version
        served = teacher_forced(peft_model, chat_prompt, gen.token_ids)
        assert max_diff(gen.logprobs, served) < TOLERANCE
        assert max_diff(teacher_forced(base, chat_prompt, gen.token_ids), served) > 1e-2  # the adapter matters
        models = await asyncio.to_thread(served_models, pool)
        assert f"policy-v{version}" in models and f"policy-v{version - 1}" not in models  # the old one unloaded
        assert pool.report()["adapter"] == f"policy-v{version}"
        assert not (pool.checkpoint_dir / f"adapter-v{version - 1}").exists()  # its folder removed too


@pytest.mark.asyncio(loop_scope="module")
async def test_a_restarted_server_loads_the_newest_adapter_before_it_serves(pool, policy, chat_prompt):
    peft_model, _ = policy  # still at version 2
    server = pool.servers[0]
    server.kill()
    with pytest.raises(ServerUnavailable):
        await pool.generate(chat_prompt, SamplingParams(max_tokens=4))
    server.start()  # the same port; a new life with the base weights and no adapter
    await asyncio.to_thread(server.wait_ready, 600)
    await pool.revive()
    assert pool.report()["servers_revived"] == 1
    gen = await pool.generate(chat_prompt, SamplingParams(max_tokens=16, seed=1))
    assert gen.policy_version == 2
    assert max_diff(gen.logprobs, teacher_forced(peft_model, chat_prompt, gen.token_ids)) < TOLERANCE


@pytest.mark.asyncio(loop_scope="module")
async def test_a_full_weight_push_after_an_adapter_drops_the_adapter(pool, policy, chat_prompt):
    peft_model, _ = policy
    _move(peft_model, seed=3)
    merged = copy.deepcopy(peft_model).merge_and_unload()
    await pool.aupdate_weights(merged.state_dict(), 5)
    assert not any(m.startswith("policy-v") for m in await asyncio.to_thread(served_models, pool))
    assert pool.adapter is None and pool.report()["adapter"] is None
    gen = await pool.generate(chat_prompt, SamplingParams(max_tokens=16, seed=2))
    assert gen.policy_version == 5
    assert max_diff(gen.logprobs, teacher_forced(merged, chat_prompt, gen.token_ids)) < TOLERANCE


@pytest.mark.asyncio(loop_scope="module")
async def test_a_pool_of_servers_without_lora_refuses_adapters_clearly(policy):
    plain = VLLMServerPool(["http://127.0.0.1:9"])
    try:
        with pytest.raises(RuntimeError, match="enable_lora=True"):
            await plain.aupdate_adapter(export_adapter(policy[0]), 1)
    finally:
        await plain.aclose()


def test_training_through_a_server_pushes_adapters_and_runs_ahead(tmp_path):
    """The loop with `model.lora.sync=adapter`, `engine=vllm_server` and `trainer.max_staleness=1`: each step's
    push is the adapter's bytes, and the rollouts of a step may be served one version behind, never more."""
    import json

    import torch

    from trainers.loop import train
    from trainers.main import compose

    engine = ["engine=vllm_server", "engine.options.servers=1", "engine.options.dtype=float32"]
    engine += ["engine.options.max_model_len=2048", f"engine.options.kv_cache_memory_bytes={KV_BYTES}"]
    summary = train(compose([*adapter_run(engine, tmp_path / "run"), "trainer.max_staleness=1", "steps=2"]))
    assert summary["steps"] == 2 and summary["max_staleness"] == 1
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "latest.pt", weights_only=False)
    adapter_bytes = sum(v.numel() * v.element_size() for v in ckpt["model"].values())
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r.get("kind") == "train"]
    assert [r["weight_sync_bytes"] for r in train_rows] == [adapter_bytes, adapter_bytes]
    assert all(0 <= r["staleness_max"] <= 1 for r in train_rows)
