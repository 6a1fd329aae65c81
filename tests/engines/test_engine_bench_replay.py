"""benchmarks/engine_bench.py's replay of recorded rollouts: every engine gets exactly the recorded work."""

import asyncio

import pytest

from benchmarks.engine_bench import recorded_rollouts, replay
from clawgym_env.engines.transformers_engine import TransformersEngine
from clawgym_env.records import CallLog, ModelCall, PrefixCheck
from clawgym_env.specs import ApiStyle


def write_calls(path, rollouts):
    """As the proxy logs them: a call whose prompt extends the previous call's ids is written as its tail."""
    with CallLog(path) as log:
        for rid, calls in rollouts.items():
            for index, (prompt, generated, error) in enumerate(calls):
                before = calls[index - 1][0] + calls[index - 1][1] if index else []
                extends = bool(before) and prompt[: len(before)] == before
                log.append(
                    ModelCall(
                        rollout_id=rid,
                        call_index=index,
                        api_style=ApiStyle.OPENAI_CHAT,
                        request={},
                        prompt_ids=prompt,
                        generated_ids=generated,
                        logprobs=[-1.0] * len(generated),
                        error=error,
                        prefix=PrefixCheck(previous_call=index - 1, extended=True, shared=len(before))
                        if extends
                        else None,
                    )
                )


def test_replay_takes_the_calls_that_generated_in_order_and_regenerates_their_lengths(tmp_path, tiny_model, qwen_tok):
    calls = tmp_path / "calls.jsonl"
    rows = {
        "failed": [([1, 2, 3], [], "engine: boom")],  # generated nothing: left out
        "a": [
            ([10, 11, 12], [5, 6], None),
            ([10, 11, 12, 5, 6, 7], [8, 9, 10], None),
            ([10, 11, 12, 5, 6, 7, 8, 9, 10, 11], [], "call_cap: refused"),  # past the call cap: left out
        ],
        "b": [([20, 21], [4], None)],
    }
    write_calls(calls, rows)
    recorded = recorded_rollouts(str(calls), 2)
    assert recorded == [[([10, 11, 12], 2), ([10, 11, 12, 5, 6, 7], 3)], [([20, 21], 1)]]
    with pytest.raises(SystemExit, match="only 2 rollouts that generated"):
        recorded_rollouts(str(calls), 3)

    every_token = range(len(qwen_tok))  # as end tokens: without ignore_eos each call would stop after one
    engine = TransformersEngine(tiny_model, qwen_tok, max_batch_size=2, stop_token_ids=every_token)
    wall, made = asyncio.run(replay(engine, recorded))
    engine.close()
    assert made == 2 + 3 + 1 and wall > 0  # each call generated exactly its recorded length


def test_ignore_eos_reaches_vllm_requests():
    from clawgym_env.engines.remote_engine import RemoteEngine
    from clawgym_env.engines.vllm_engine import vllm_sampling_kwargs
    from clawgym_env.interfaces import SamplingParams

    assert vllm_sampling_kwargs(SamplingParams(ignore_eos=True))["ignore_eos"] is True
    assert "ignore_eos" not in vllm_sampling_kwargs(SamplingParams())
    body = asyncio.run(
        RemoteEngine("http://127.0.0.1:9", api="vllm", model="m")._vllm_body([1, 2], SamplingParams(ignore_eos=True))
    )
    assert body["ignore_eos"] is True
