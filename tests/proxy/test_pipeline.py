"""The call pipeline without HTTP (clawgym_env.proxy.pipeline): a call goes from a parsed body to its record
and its answer, and every failure to its API error and its record, with no server, socket or request."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from clawgym_env.interfaces import Policy, RolloutLimits, RolloutRoute
from clawgym_env.proxy.apis import AnthropicAdapter, ChatAdapter
from clawgym_env.proxy.errors import ProxyError
from clawgym_env.proxy.guards import GuardStats, ProxyGuards
from clawgym_env.proxy.pipeline import Answer, Caller, CallPipeline, ClientDisconnected
from clawgym_env.proxy.recorder import Recorder
from clawgym_env.proxy.rollout_state import RolloutState, RolloutStats
from clawgym_env.records import ModelCall, read_calls
from clawgym_env.specs import ApiStyle

from .conftest import tagged
from .test_faults_and_isolation import SlowTestEngine

CHAT_BODY = {"model": "p", "messages": [{"role": "user", "content": "hi"}]}


def rollout(policy, rollout_id: str = "r1", **limits) -> RolloutState:
    route = RolloutRoute(rollout_id=rollout_id, path_prefix=f"/rollouts/{rollout_id}", api_key="k")
    return RolloutState(
        route=route, policy=policy, limits=RolloutLimits(**limits), stats=RolloutStats(rollout_id=rollout_id)
    )


def pipeline(tmp_path, **options) -> CallPipeline:
    return CallPipeline(Recorder(tmp_path / "calls.jsonl", fsync=False, stats=GuardStats()), ProxyGuards(), **options)


def stays() -> Caller:
    """A caller that never leaves and is never asked about delivery (what an in-process test needs)."""
    return Caller(receive=asyncio.get_running_loop().create_future)


async def call(pipe: CallPipeline, state: RolloutState, body, adapter=None, caller=None, in_flight=0) -> Answer:
    async def read():
        if isinstance(body, Exception):
            raise body
        return body

    return await pipe.run(
        state,
        adapter or ChatAdapter(),
        read,
        caller or stays(),
        in_flight=in_flight,
        received_at=time.time(),
        t0=time.perf_counter(),
    )


async def test_a_call_is_answered_recorded_and_spliced_without_http(tmp_path, scripted_policy):
    pipe = pipeline(tmp_path)
    state = rollout(scripted_policy(["hello there"]))
    answer = await call(pipe, state, CHAT_BODY)
    assert answer.status == 200 and answer.pump is None
    assert orjson.loads(answer.body)["choices"][0]["message"]["content"] == "hello there"
    (record,) = list(read_calls(tmp_path / "calls.jsonl"))
    assert record.error is None and record.generated_ids and record.prompt_ids
    assert len(state.memory) == 1  # the generation is remembered for the next call's splice
    assert state.stats.completed_calls == 1 and state.stats.new_tokens == len(record.full_ids)


async def test_a_streamed_call_is_a_pump_that_writes_its_events_after_the_record(tmp_path, scripted_policy):
    pipe = pipeline(tmp_path)
    state = rollout(scripted_policy([tagged("write", {"path": "a", "content": "b"})]))
    answer = await call(pipe, state, {**CHAT_BODY, "stream": True})
    assert answer.status == 200 and answer.pump is not None and answer.media_type == "text/event-stream"
    sent: list[tuple[bytes, bool]] = []

    async def send(data: bytes, last: bool = False) -> None:
        if last:  # the final events go out only once the call is in the log
            assert len(list(read_calls(tmp_path / "calls.jsonl"))) == 1
        sent.append((data, last))

    await answer.pump(send)
    assert sent[-1][1] and b"[DONE]" in sent[-1][0] and b"tool_calls" in b"".join(d for d, _ in sent)


@pytest.mark.parametrize(
    ("failure", "status", "kind"),
    [
        (ProxyError("too_deep", "nested too deep"), 400, "too_deep"),
        (ProxyError("request_too_large", "big", request={"_omitted": "request_too_large"}), 413, "request_too_large"),
        (ClientDisconnected(), 499, "client_disconnected"),
        (RuntimeError("a bug"), 500, "internal"),
    ],
)
async def test_every_failure_is_answered_in_the_api_format_and_recorded(
    tmp_path, scripted_policy, failure, status, kind
):
    pipe = pipeline(tmp_path)
    state = rollout(scripted_policy(["never"]))
    answer = await call(pipe, state, failure, adapter=AnthropicAdapter())
    assert answer.status == status
    if status != 499:
        assert orjson.loads(answer.body)["type"] == "error"  # Anthropic's error shape, not OpenAI's
    (record,) = list(read_calls(tmp_path / "calls.jsonl"))
    assert record.error is not None and record.error.startswith(kind)
    assert state.stats.error_kinds == {kind: 1} and not record.generated_ids
    if kind == "request_too_large":
        assert record.request == {"_omitted": "request_too_large"}


async def test_caps_refuse_before_the_body_is_read(tmp_path, scripted_policy):
    pipe = pipeline(tmp_path)
    state = rollout(scripted_policy(["a", "b"]), max_calls=1)
    assert (await call(pipe, state, CHAT_BODY)).status == 200
    refused = await call(pipe, state, RuntimeError("the body must not be read"))
    assert refused.status == 400 and "cap of 1 model calls" in orjson.loads(refused.body)["error"]["message"]
    busy = await call(pipe, rollout(scripted_policy(["x"]), "r2"), RuntimeError("unread"), in_flight=10**6)
    assert busy.status == 429


async def test_a_caller_that_leaves_mid_generation_stops_the_engine_and_is_recorded(tmp_path, renderer):
    pipe = pipeline(tmp_path)
    engine = SlowTestEngine(delay_s=30)
    state = rollout(Policy(engine=engine, renderer=renderer))
    left = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.2, left.set_result, None)
    answer = await call(pipe, state, CHAT_BODY, caller=Caller(receive=asyncio.Event().wait, lost=left))
    assert answer.status == 499
    (record,) = list(read_calls(tmp_path / "calls.jsonl"))
    assert record.error.startswith("client_disconnected") and record.delivered is False
    for _ in range(3):
        await asyncio.sleep(0)  # the cancellation reaches the engine's coroutine on the loop's next turns
    assert engine.cancelled == 1  # the engine's slot is freed, not left generating for nobody


async def test_in_process_calls_share_the_budget_and_the_record(tmp_path, scripted_policy):
    """The white-box loop's path: admitted under the same token budget, recorded with the same counters."""
    pipe = pipeline(tmp_path)
    state = rollout(scripted_policy(["x"]), max_tokens=50)
    prompt = list(range(100, 130))
    admitted = pipe.admit_in_process(state, prompt)
    assert admitted.refused is None and admitted.max_new_tokens == 50 - len(prompt)
    done = ModelCall(
        rollout_id="r1",
        call_index=0,
        api_style=ApiStyle.IN_PROCESS,
        request={},
        prompt_ids=prompt,
        generated_ids=list(range(10)),
        logprobs=[0.0] * 10,
    )
    pipe.record_in_process(state, done)
    assert state.stats.new_tokens == len(prompt) + 10
    refused = pipe.admit_in_process(state, prompt + list(range(10)) + list(range(20)))
    assert refused.refused is not None and refused.refused.startswith("token_cap")
    records = list(read_calls(tmp_path / "calls.jsonl"))
    assert [r.error.split(":")[0] if r.error else None for r in records] == [None, "token_cap"]
