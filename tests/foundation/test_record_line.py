"""`record_line` writes exactly what `orjson.dumps(record.model_dump(mode="json"))` wrote, faster."""

from __future__ import annotations

import math

import orjson
import pytest

from clawgym_env.records import (
    CallLog,
    CallTimings,
    DeliveryReceipt,
    ModelCall,
    PrefixCheck,
    PromptSegment,
    read_calls,
    record_line,
)
from clawgym_env.specs import ApiStyle


def full_call(**overrides: object) -> ModelCall:
    """A call with every field away from its default: nested models, an enum, unicode and nesting in the request."""
    fields: dict[str, object] = dict(
        rollout_id="r-ü",
        call_index=3,
        api_style=ApiStyle.ANTHROPIC_MESSAGES,
        request={
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": 'héllo\n"x"'}]}],
            "max_tokens": 7,
            "temperature": 0.25,
            "stream": True,
            "meta": None,
        },
        prompt_ids=[151644, 8948, 198, 2],
        generated_ids=[1, 2, 151645],
        logprobs=[-0.5, -1e-9, -12.25],
        finish_reason="length",
        policy_version=4,
        segments=[
            PromptSegment(start=0, end=3, kind="system"),
            PromptSegment(start=3, end=4, kind="assistant_spliced", source_call=1),
        ],
        drift_events=1,
        rewritten_turns=2,
        prefix=PrefixCheck(previous_call=2, extended=False, shared=3, previous_length=9, reason="drift"),
        timings=CallTimings(
            received_at=1796134842.125, render_s=1e-4, generate_s=0.5, total_s=0.75, first_token_s=0.01
        ),
        error="engine_error: boom",
        streamed=True,
        delivered=False,
        control_token_texts=1,
    )
    fields.update(overrides)
    return ModelCall(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "record",
    [
        full_call(),
        ModelCall(rollout_id="r", call_index=0, api_style=ApiStyle.OPENAI_CHAT, request={}, prompt_ids=[]),
        full_call(timings=CallTimings(total_s=math.inf, first_token_s=math.nan)),
        DeliveryReceipt(rollout_id="r", call_index=2, delivered=True),
    ],
    ids=["every-field", "defaults", "non-finite-timings", "receipt"],
)
def test_record_line_is_the_model_dump_bytes(record: ModelCall | DeliveryReceipt) -> None:
    assert record_line(record) == orjson.dumps(record.model_dump(mode="json")) + b"\n"


def test_a_logged_call_reads_back_equal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    call = full_call(delivered=None)
    with CallLog(tmp_path / "calls.jsonl") as log:
        log.append(call)
        log.append_receipt(DeliveryReceipt(rollout_id=call.rollout_id, call_index=call.call_index, delivered=True))
    [back] = read_calls(tmp_path / "calls.jsonl")
    assert back == call.model_copy(update={"delivered": True})


def test_a_value_that_is_not_json_is_refused_before_anything_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    call = full_call(request={"x": object()})
    with CallLog(tmp_path / "calls.jsonl") as log, pytest.raises(TypeError, match="not JSON serializable"):
        log.append(call)
    assert (tmp_path / "calls.jsonl").read_bytes() == b""
