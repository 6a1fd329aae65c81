"""TransformersEngine on the tiny random Qwen3 model: exact logprobs, stops, seeds, batching, cache, updates."""

import asyncio

import pytest
import torch

from clawgym_env.engines.sampling import processed_logprobs
from clawgym_env.engines.transformers_engine import EngineTimeout, TransformersEngine
from clawgym_env.interfaces import InferenceEngine, SamplingParams


@pytest.fixture
def engine(tiny_model, qwen_tok):
    eng = TransformersEngine(tiny_model, qwen_tok, seed=0)
    yield eng
    eng.close()


def teacher_forced_logprobs(model, prompt, generated, sampling=None):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0]
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(generated)]
    if sampling is None:
        return [float(torch.log_softmax(r.float(), -1)[t]) for r, t in zip(rows, generated)]
    return [float(processed_logprobs(r, sampling)[t]) for r, t in zip(rows, generated)]


async def test_logprobs_equal_teacher_forced_recomputation(engine, tiny_model, chat_prompt):
    assert isinstance(engine, InferenceEngine)
    gen = await engine.generate(chat_prompt, SamplingParams(max_tokens=40, seed=7))
    assert len(gen.token_ids) == len(gen.logprobs) == 40 and gen.finish_reason == "length"
    ref = teacher_forced_logprobs(tiny_model, chat_prompt, gen.token_ids)
    assert max(abs(a - b) for a, b in zip(gen.logprobs, ref)) < 1e-4
    assert len(set(round(x, 3) for x in gen.logprobs)) > 10  # the test model's distributions are not flat


async def test_logprobs_are_of_the_distribution_sampled_from(engine, tiny_model, chat_prompt):
    sampling = SamplingParams(max_tokens=20, seed=3, temperature=0.7, top_k=50, top_p=0.9)
    gen = await engine.generate(chat_prompt, sampling)
    ref = teacher_forced_logprobs(tiny_model, chat_prompt, gen.token_ids, sampling)
    raw = teacher_forced_logprobs(tiny_model, chat_prompt, gen.token_ids)
    assert max(abs(a - b) for a, b in zip(gen.logprobs, ref)) < 1e-4
    assert max(abs(a - b) for a, b in zip(gen.logprobs, raw)) > 1e-2  # not the untempered ones


async def test_stop_token_ends_generation_and_is_kept(engine, chat_prompt):
    greedy = await engine.generate(chat_prompt, SamplingParams(max_tokens=12, temperature=0))
    stop_at = next(i for i in range(3, 12) if greedy.token_ids[i] not in greedy.token_ids[:i])
    stop_id = greedy.token_ids[stop_at]
    stopped = await engine.generate(
        chat_prompt, SamplingParams(max_tokens=12, temperature=0, stop_token_ids=(stop_id,))
    )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == greedy.token_ids[: stop_at + 1]
    assert stopped.logprobs == pytest.approx(greedy.logprobs[: stop_at + 1], abs=1e-5)


async def test_eos_is_a_default_stop(tiny_model, qwen_tok, chat_prompt):
    probe = TransformersEngine(tiny_model, qwen_tok, stop_token_ids=())
    first = (await probe.generate(chat_prompt, SamplingParams(max_tokens=1, temperature=0))).token_ids[0]
    probe.close()
    eng = TransformersEngine(tiny_model, stop_token_ids=[first])
    gen = await eng.generate(chat_prompt, SamplingParams(max_tokens=5, temperature=0))
    assert gen.token_ids == [first] and gen.finish_reason == "stop"
    eng.close()
    assert 151645 in TransformersEngine(tiny_model, qwen_tok).default_stop_ids


async def test_seeds_are_reproducible(engine, chat_prompt):
    a = await engine.generate(chat_prompt, SamplingParams(max_tokens=15, seed=11))
    b = await engine.generate(chat_prompt, SamplingParams(max_tokens=15, seed=11))
    c = await engine.generate(chat_prompt, SamplingParams(max_tokens=15, seed=12))
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert a.token_ids != c.token_ids


async def test_concurrent_requests_batch_and_match_serial_runs(tiny_model, qwen_tok, chat_prompt):
    batched = TransformersEngine(tiny_model, qwen_tok, max_batch_size=8)
    serial = TransformersEngine(tiny_model, qwen_tok, max_batch_size=1, prefix_cache_entries=0)
    prompts = [chat_prompt + qwen_tok.encode(" x" * i) for i in range(10)]  # different lengths: left padding
    params = [SamplingParams(max_tokens=8 + i, seed=i) for i in range(10)]
    together = await asyncio.gather(*(batched.generate(p, s) for p, s in zip(prompts, params)))
    assert batched.stats.max_batch_seen > 1
    for p, s, got in zip(prompts, params, together):
        alone = await serial.generate(p, s)
        assert got.token_ids == alone.token_ids
        assert got.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert len(got.token_ids) == s.max_tokens
    batched.close()
    serial.close()


async def test_prefix_cache_reuse_gives_the_same_results(tiny_model, qwen_tok, chat_prompt):
    cached = TransformersEngine(tiny_model, qwen_tok)
    uncached = TransformersEngine(tiny_model, qwen_tok, prefix_cache_entries=0)
    prompt = chat_prompt
    suffix = qwen_tok.encode("<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")
    for turn in range(3):  # a rollout: each call's prompt extends the previous call's prompt + generation
        s = SamplingParams(max_tokens=10, seed=turn)
        a = await cached.generate(prompt, s)
        b = await uncached.generate(prompt, s)
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        prompt = prompt + a.token_ids + suffix
    assert cached.prefix_cache.stats.hits == 2
    # later calls prefill only what is new: the last generated token (never fed back) and the suffix
    assert cached.stats.prefill_tokens == len(chat_prompt) + 2 * (1 + len(suffix))
    assert uncached.stats.reused_tokens == 0
    cached.close()
    uncached.close()


async def test_concurrent_requests_share_a_common_prompt_prefix(tiny_model, qwen_tok, chat_prompt):
    """A group's rollouts start together with one system prompt: it is prefilled once, not per rollout."""
    cached = TransformersEngine(tiny_model, qwen_tok)
    uncached = TransformersEngine(tiny_model, qwen_tok, prefix_cache_entries=0)
    prompts = [chat_prompt + qwen_tok.encode(f"task {i}<|im_end|>\n<|im_start|>assistant\n") for i in range(4)]
    s = [SamplingParams(max_tokens=6, seed=i) for i in range(4)]
    got = await asyncio.gather(*(cached.generate(p, x) for p, x in zip(prompts, s)))
    want = await asyncio.gather(*(uncached.generate(p, x) for p, x in zip(prompts, s)))
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert cached.prefix_cache.stats.hits >= 3
    assert cached.stats.prefill_tokens < len(prompts[0]) + 3 * (len(prompts[0]) - len(chat_prompt) + 2)
    cached.close()
    uncached.close()


async def test_update_weights_changes_outputs_and_bumps_version(tiny_model, qwen_tok, chat_prompt):
    import copy

    model = copy.deepcopy(tiny_model)
    eng = TransformersEngine(model, qwen_tok)
    s = SamplingParams(max_tokens=10, temperature=0)
    before = await eng.generate(chat_prompt, s)
    assert before.policy_version == 0
    new = {k: v + 0.3 * torch.randn_like(v) for k, v in model.state_dict().items() if "layers.1.mlp" in k}
    await asyncio.to_thread(eng.update_weights, new, 5)
    after = await eng.generate(chat_prompt, s)
    assert eng.policy_version == 5 and after.policy_version == 5
    assert after.token_ids != before.token_ids or after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    assert torch.equal(
        model.state_dict()["model.layers.1.mlp.up_proj.weight"], new["model.layers.1.mlp.up_proj.weight"]
    )
    with pytest.raises(KeyError, match="not in the model"):
        eng.update_weights({"no.such.weight": torch.zeros(1)}, 6)
    assert eng.policy_version == 5
    eng.close()


async def test_update_weights_waits_for_in_flight_generation(tiny_model, qwen_tok, chat_prompt):
    import copy

    eng = TransformersEngine(copy.deepcopy(tiny_model), qwen_tok)
    running = asyncio.create_task(eng.generate(chat_prompt, SamplingParams(max_tokens=60, seed=1)))
    await asyncio.sleep(0.05)
    push = asyncio.create_task(asyncio.to_thread(eng.update_weights, {}, 1))
    await asyncio.sleep(0.05)
    # the next call of a rollout, made while the push waits for the call in flight: held until the push is
    # done, then served at the new version (not cut, not failed, not served by the old weights)
    waiting = asyncio.create_task(eng.generate(chat_prompt, SamplingParams(max_tokens=4, seed=2)))
    await push
    gen = await running
    assert gen.policy_version == 0 and len(gen.token_ids) == 60  # finished under the old version
    assert (await waiting).policy_version == 1
    assert (await eng.generate(chat_prompt, SamplingParams(max_tokens=1))).policy_version == 1
    eng.close()


async def test_abort_returns_partial_generation_and_frees_the_slot(engine, chat_prompt):
    task = asyncio.create_task(engine.generate(chat_prompt, SamplingParams(max_tokens=5000), request_id="r1"))
    while not engine.stats.decode_steps:
        await asyncio.sleep(0.01)
    assert engine.abort("r1") and not engine.abort("unknown")
    gen = await task
    assert gen.finish_reason == "abort" and 0 < len(gen.token_ids) < 5000
    assert len(gen.logprobs) == len(gen.token_ids)
    assert engine._active == 0


async def test_cancelled_caller_frees_the_slot(engine, chat_prompt):
    task = asyncio.create_task(engine.generate(chat_prompt, SamplingParams(max_tokens=5000)))
    while not engine.stats.decode_steps:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    nxt = await asyncio.wait_for(engine.generate(chat_prompt, SamplingParams(max_tokens=3)), timeout=20)
    assert len(nxt.token_ids) == 3 and engine._active == 0


async def test_timeout_raises_with_partial_generation(engine, chat_prompt):
    with pytest.raises(EngineTimeout) as info:
        await engine.generate(chat_prompt, SamplingParams(max_tokens=5000), timeout_s=0.3)
    assert info.value.generation.finish_reason == "abort"
    assert 0 < len(info.value.generation.token_ids) < 5000


async def test_bad_prompts_are_refused_clearly(engine):
    with pytest.raises(ValueError, match="empty"):
        await engine.generate([], SamplingParams())
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        await engine.generate([1, 10**7], SamplingParams())


async def test_stream_hands_out_tokens_from_inside_the_batch(tiny_model, qwen_tok, chat_prompt):
    """Streamed requests share the batch with generate() ones and yield what generate() would return."""
    streaming = TransformersEngine(tiny_model, qwen_tok, max_batch_size=4, prefix_cache_entries=0)
    serial = TransformersEngine(tiny_model, qwen_tok, max_batch_size=1, prefix_cache_entries=0)
    prompts = [chat_prompt + qwen_tok.encode(" y" * i) for i in range(3)]
    params = [SamplingParams(max_tokens=12 + i, seed=10 + i) for i in range(3)]

    async def streamed(prompt, sampling):
        return [chunk async for chunk in streaming.stream(prompt, sampling)]

    together = await asyncio.gather(
        streamed(prompts[0], params[0]), streamed(prompts[1], params[1]), streaming.generate(prompts[2], params[2])
    )
    assert streaming.stats.max_batch_seen > 1
    for prompt, sampling, chunks in zip(prompts[:2], params[:2], together[:2]):
        alone = await serial.generate(prompt, sampling)
        assert len(chunks) > 2 and all(c.finish_reason is None for c in chunks[:-1])
        assert chunks[-1].finish_reason == alone.finish_reason == "length"
        assert [t for c in chunks for t in c.token_ids] == alone.token_ids
        assert [lp for c in chunks for lp in c.logprobs] == pytest.approx(alone.logprobs, abs=1e-4)
    streaming.close()
    serial.close()


async def test_closing_a_stream_early_frees_the_slot(engine, chat_prompt):
    stream = engine.stream(chat_prompt, SamplingParams(max_tokens=5000), request_id="s1")
    first = await anext(stream)
    assert first.token_ids and first.finish_reason is None
    await stream.aclose()
    nxt = await asyncio.wait_for(engine.generate(chat_prompt, SamplingParams(max_tokens=3)), timeout=20)
    assert len(nxt.token_ids) == 3 and engine._active == 0


async def test_abort_ends_a_stream_with_the_partial_generation(engine, chat_prompt):
    chunks = []
    async for chunk in engine.stream(chat_prompt, SamplingParams(max_tokens=5000), request_id="s2"):
        chunks.append(chunk)
        if len(chunks) == 3:
            assert engine.abort("s2")
    assert chunks[-1].finish_reason == "abort"
    assert 3 <= sum(len(c.token_ids) for c in chunks) < 5000 and engine._active == 0
