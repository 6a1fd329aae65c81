"""LoRA adapters pushed to in-process vLLM as adapters (`model.lora.sync=adapter`): the served log-probs are
the trainer's (base + adapter), a new version replaces the old adapter, and the push is a small fraction of
the merged layers' bytes."""

import copy
import json

import pytest
import pytest_asyncio
import torch

from clawgym_env.engines.vllm_engine import VLLM_MISSING, VLLMEngine, vllm_available
from clawgym_env.interfaces import SamplingParams
from tests.engines.test_vllm_engine import KV_BYTES, LOGPROB_TOLERANCE, MODEL, max_diff, teacher_forced
from trainers.model import LoraSettings, apply_lora, export_adapter, export_weights

needs_vllm = pytest.mark.skipif(not vllm_available(), reason=VLLM_MISSING)
pytestmark = [pytest.mark.vllm, needs_vllm]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    eng = VLLMEngine(
        MODEL,
        dtype="float32",
        max_model_len=1024,
        seed=0,
        kv_cache_memory_bytes=KV_BYTES,
        enable_lora=True,
        max_lora_rank=8,
    )
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def policy():
    """The trainer's LoRA policy: peft adapters on q, k, v, o of the same base weights the engine loaded."""
    from clawgym_env.engines.models import load_policy_model

    base, _ = load_policy_model(MODEL)
    return apply_lora(copy.deepcopy(base), LoraSettings(enabled=True, r=8, alpha=16)), base


def _move(peft_model: torch.nn.Module, seed: int) -> None:
    """What training does to a LoRA policy: the adapters move away from zero."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn_like(p))


@pytest.mark.asyncio(loop_scope="module")
async def test_served_logprobs_after_an_adapter_push_are_the_trainers(engine, policy, chat_prompt):
    peft_model, base = policy
    sampling = SamplingParams(max_tokens=16, seed=1)
    before = await engine.generate(chat_prompt, sampling)  # the base weights, no adapter yet
    assert before.policy_version == 0
    for version in (1, 2):
        _move(peft_model, seed=version)
        adapter = export_adapter(peft_model)
        await engine.aupdate_adapter(adapter, version)
        gen = await engine.generate(chat_prompt, sampling)
        assert gen.policy_version == version == engine.policy_version
        served = teacher_forced(peft_model, chat_prompt, gen.token_ids)
        assert max_diff(gen.logprobs, served) < LOGPROB_TOLERANCE["float32"]
        assert max_diff(teacher_forced(base, chat_prompt, gen.token_ids), served) > 1e-2  # the adapter matters
        assert await engine.aloaded_adapters() == {version + 1}  # the previous version's adapter is unloaded
    merged = sum(t.numel() * t.element_size() for t in export_weights(peft_model).values())
    assert adapter.num_bytes * 4 < merged  # tiny-qwen3-h64 is narrow; for Qwen2.5-Coder-0.5B it is ~1/40


@pytest.mark.asyncio(loop_scope="module")
async def test_a_full_weight_push_after_an_adapter_drops_the_adapter(engine, policy, chat_prompt):
    """Full weights replace base + adapter (the merged policy): the adapter must not apply on top again."""
    peft_model, _ = policy
    _move(peft_model, seed=3)
    merged = copy.deepcopy(peft_model).merge_and_unload()
    await engine.aupdate_weights(merged.state_dict(), 5)
    assert await engine.aloaded_adapters() == set()
    gen = await engine.generate(chat_prompt, SamplingParams(max_tokens=16, seed=2))
    assert gen.policy_version == 5
    assert max_diff(gen.logprobs, teacher_forced(merged, chat_prompt, gen.token_ids)) < LOGPROB_TOLERANCE["float32"]


@pytest.mark.asyncio(loop_scope="module")
async def test_an_engine_without_enable_lora_refuses_adapters_clearly(policy):
    eng = object.__new__(VLLMEngine)
    eng.supports_adapters = False
    with pytest.raises(RuntimeError, match="enable_lora=True"):
        await eng._update_adapter(export_adapter(policy[0]), 1)


def adapter_run(engine: list[str], run_dir) -> list[str]:
    """A small white-box LoRA run with adapter sync on `engine` (its overrides): 2 rollouts a step, no eval."""
    return [
        "env=clawgym_whitebox",
        f"model={MODEL}",
        "model.lora.enabled=true",
        "model.lora.sync=adapter",
        *engine,
        "env.group_size=2",
        "env.tasks_per_step=1",
        "eval.at_start=false",
        "env.eval_tasks=1",
        "eval.repeats=1",
        "eval.every=0",
        "checkpoint.every=1",
        "logging.progress=false",
        "logging.tensorboard=false",
        f"run_dir={run_dir}",
    ]


def test_training_pushes_adapters_and_checkpoints_hold_only_the_adapter(tmp_path):
    """The loop with `model.lora.sync=adapter` on in-process vLLM: each step's push is the adapter's bytes,
    the checkpoint holds the adapter and the base's identity, and a resume loads it onto the base."""
    from trainers.loop import train
    from trainers.main import compose

    overrides = adapter_run(
        ["engine=vllm", "+engine.options.dtype=float32", "+engine.options.max_model_len=2048"]
        + [f"+engine.options.kv_cache_memory_bytes={KV_BYTES}"],
        tmp_path / "run",
    )
    train(compose([*overrides, "steps=1"]))
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "latest.pt", weights_only=False)
    assert ckpt["model_format"] == "adapter" and ckpt["base_model"]["name"] == "tiny-qwen3-h64"
    assert ckpt["model"] and all("lora_" in k for k in ckpt["model"])
    summary = train(compose([*overrides, "steps=2", "checkpoint.resume=auto"]))
    assert summary["steps"] == 2
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    pushed = [r["weight_sync_bytes"] for r in rows if r.get("kind") == "train"]
    adapter_bytes = sum(v.numel() * v.element_size() for v in ckpt["model"].values())
    assert pushed == [adapter_bytes, adapter_bytes]  # step 1, then step 2 after the resume
