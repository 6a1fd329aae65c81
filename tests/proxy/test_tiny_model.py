"""Through the proxy with a real (tiny, random) Qwen3 model on the TransformersEngine.

Recorded logprobs must equal a teacher-forced pass of the same model over the recorded ids, and a
harness hanging up mid-generation must free the engine and leave the partial generation in the record.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import torch

from clawgym_env.interfaces import RolloutLimits


def teacher_forced_logprobs(model, prompt_ids: list[int], generated_ids: list[int]) -> list[float]:
    ids = torch.tensor([prompt_ids + generated_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(prompt_ids)
    return [logprobs[start - 1 + i, tok].item() for i, tok in enumerate(generated_ids)]


async def test_recorded_logprobs_equal_teacher_forced_recomputation(proxy, tiny_policy, tiny_model):
    route = proxy.open_rollout("tiny", tiny_policy, RolloutLimits(max_new_tokens=12))
    messages = [{"role": "system", "content": "You are tiny."}, {"role": "user", "content": "Say something."}]
    async with openai.AsyncOpenAI(
        base_url=proxy.base_url(route) + "/v1", api_key=route.api_key, max_retries=0
    ) as client:
        for turn in range(2):
            chunks = await client.chat.completions.create(model="tiny", messages=messages, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"More, {turn}."}]
    calls = proxy.close_rollout("tiny")
    assert len(calls) == 2 and all(c.error is None for c in calls)
    for call in calls:
        assert len(call.generated_ids) > 0
        expected = teacher_forced_logprobs(tiny_model, call.prompt_ids, call.generated_ids)
        assert call.logprobs == pytest.approx(expected, abs=1e-4)
    # random-model output is echoed back as text and still spliced as the ids that were sampled
    assert calls[1].prompt_ids[: len(calls[0].full_ids)] == calls[0].full_ids
    assert calls[1].drift_events == 0


async def test_disconnect_mid_generation_records_partial_ids_and_frees_the_engine(proxy, tiny_policy):
    engine = tiny_policy.engine
    engine.default_stop_ids = frozenset()  # never stop early: the disconnect must cut it short
    route = proxy.open_rollout("hangup", tiny_policy, RolloutLimits(max_new_tokens=4000))
    body = {"model": "tiny", "input": "Go on forever.", "stream": True}
    async with httpx.AsyncClient(base_url=proxy.base_url(route)) as client:
        task = asyncio.create_task(client.post("/v1/responses", json=body, headers={"x-api-key": route.api_key}))
        while engine.stats.requests == 0 or not engine._active:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    for _ in range(200):
        if proxy.stats("hangup").disconnects:
            break
        await asyncio.sleep(0.05)
    (call,) = proxy.close_rollout("hangup")
    assert call.error.startswith("client_disconnected")
    assert call.finish_reason == "abort" and 0 < len(call.generated_ids) < 4000
    assert len(call.logprobs) == len(call.generated_ids)
    assert engine._active == 0  # the slot is free
