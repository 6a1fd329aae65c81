"""A log line holds what its call adds to its rollout's earlier lines; `read_calls` puts the calls back.

A harness resends the whole conversation every call and its prompt begins with the previous call's ids, so
whole lines would make a rollout's log grow with the square of its calls. These tests write rollouts the
way the proxy records them (the request's repeated parts are the previous request's very objects, the
renderer's segments shared instances, `prefix` naming the call the prompt extends) and check that the lines
stay small, that every call reads back equal, and that what cannot be referred to is written whole.
"""

from __future__ import annotations

import subprocess
import sys

import orjson

from clawgym_env.records import (
    REFERABLE_CALLS,
    CallLog,
    ModelCall,
    PrefixCheck,
    read_calls,
    receipts_path,
    record_line,
    segment,
)
from clawgym_env.specs import ApiStyle

TOOLS = [{"type": "function", "function": {"name": f"tool{i}", "description": "d" * 200}} for i in range(8)]


def rollout(rollout_id: str, calls: int, *, share: bool = True) -> list[ModelCall]:
    """An append-only agent conversation: each call's prompt is the previous call's ids + a tool result."""
    messages: list[dict] = [{"role": "system", "content": "s" * 2000}, {"role": "user", "content": "task"}]
    prompt = list(range(1000, 1600))  # the system prompt and the task
    segments = [segment(0, 590, "system"), segment(590, 597, "user"), segment(597, 600, "template")]
    out: list[ModelCall] = []
    for index in range(calls):
        generated = [7000 + index * 10 + k for k in range(6)]
        request = {"model": "policy", "messages": messages, "tools": TOOLS, "stream": True}
        if not share:  # equal values, new objects: nothing may be referred to
            request = orjson.loads(orjson.dumps(request))
        previous = out[-1] if out else None
        prefix = PrefixCheck(
            previous_call=previous.call_index if previous else None,
            extended=True if previous else None,
            shared=len(previous.full_ids) if previous else 0,
            previous_length=len(previous.full_ids) if previous else 0,
        )
        call = ModelCall(
            rollout_id=rollout_id,
            call_index=index,
            api_style=ApiStyle.OPENAI_CHAT,
            request=request,
            prompt_ids=prompt,
            generated_ids=generated,
            logprobs=[-0.5] * len(generated),
            segments=segments,
            prefix=prefix,
        )
        out.append(call)
        start = len(prompt)
        prompt = prompt + generated + [5000 + index, 5001, 5002]
        segments = [
            *segments,
            segment(start, start + len(generated), "assistant_spliced", index),
            segment(start + len(generated), len(prompt), "tool"),
        ]
        messages = [*messages, {"role": "assistant", "content": f"call {index}"}, {"role": "tool", "content": "ok"}]
    return out


def write(path, calls: list[ModelCall]) -> list[bytes]:
    with CallLog(path) as log:
        for call in calls:
            log.append(call)
    return path.read_bytes().splitlines()


def test_lines_stay_small_as_a_rollout_grows_and_read_back_equal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    calls = rollout("r", 40)
    lines = write(tmp_path / "calls.jsonl", calls)
    first, second, last = (orjson.loads(lines[i]) for i in (0, 1, -1))
    assert "prompt_ids" in first and "request" in first and "segments" in first  # a rollout's first line: whole
    for line in (second, last):
        assert not {"prompt_ids", "request", "segments"} & line.keys()
        assert line["prompt_from"]["call"] == line["call_index"] - 1 and len(line["prompt_tail"]) == 3
        assert line["request_from"] == {
            "call": line["call_index"] - 1,
            "lists": {"messages": 2 * line["call_index"]},
            "same": ["model", "tools", "stream"],
        }
        assert [m["role"] for m in line["request_rest"]["messages"]] == ["assistant", "tool"]
        assert len(line["segments_tail"]) == 2
    assert len(lines[-1]) <= len(lines[1]) + 100  # what a call adds, not what came before it
    whole = sum(len(orjson.dumps(c.model_dump(mode="json"))) for c in calls)
    assert sum(map(len, lines)) < whole / 10
    back = list(read_calls(tmp_path / "calls.jsonl"))
    assert back == calls
    assert all(list(b.request) == list(c.request) for b, c in zip(back, calls))  # keys in the order sent


def test_rollouts_interleaved_read_back_each_and_filtered(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a, b = rollout("a", 6), rollout("b", 6)
    write(tmp_path / "calls.jsonl", [c for pair in zip(a, b) for c in pair])
    assert list(read_calls(tmp_path / "calls.jsonl", "b")) == b
    assert list(read_calls(tmp_path / "calls.jsonl")) == [c for pair in zip(a, b) for c in pair]


def test_what_cannot_be_referred_to_is_written_whole(tmp_path) -> None:  # type: ignore[no-untyped-def]
    calls = rollout("r", 4, share=False)  # the request's parts are equal but not the previous request's objects
    # call 3's prefix check claims it extends call 2, but its first ids differ: its ids are written whole
    calls[3] = calls[3].model_copy(update={"prompt_ids": [1, 2, *calls[3].prompt_ids[2:]]})
    lines = [orjson.loads(line) for line in write(tmp_path / "calls.jsonl", calls)]
    assert calls[3].prefix is not None and calls[3].prefix.shared == len(calls[2].full_ids)
    assert "prompt_ids" in lines[3] and "prompt_from" not in lines[3]
    assert "prompt_from" in lines[2]
    for line in lines[1:]:  # only singletons (`True`) are the very same objects: every list is written whole
        assert line["request_from"]["lists"] == {} and "messages" in line["request_rest"]
        assert len(line["request_rest"]["messages"]) == 2 * line["call_index"] + 2
    assert list(read_calls(tmp_path / "calls.jsonl")) == calls


def test_a_key_the_previous_request_lacked_is_written_even_when_null(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`None` is one object: a new `"x": null` is `previous.get("x")`, but not a value the previous request had."""
    calls = rollout("r", 2)
    calls[1] = calls[1].model_copy(update={"request": {**calls[1].request, "metadata": None, "stop": True}})
    lines = [orjson.loads(line) for line in write(tmp_path / "calls.jsonl", calls)]
    assert lines[1]["request_rest"]["metadata"] is None and lines[1]["request_rest"]["stop"] is True
    assert "metadata" not in lines[1]["request_from"]["same"]
    assert list(read_calls(tmp_path / "calls.jsonl")) == calls


def test_a_forgotten_rollout_and_a_reopened_log_write_whole_lines(tmp_path) -> None:  # type: ignore[no-untyped-def]
    calls = rollout("r", 5)
    path = tmp_path / "calls.jsonl"
    with CallLog(path) as log:
        log.append(calls[0])
        log.append(calls[1])
        log.forget("r")  # the proxy closed the rollout; a call that finishes after that comes whole
        log.append(calls[2])
    with CallLog(path) as log:  # a restarted proxy knows none of the earlier lines
        log.append(calls[3])
        log.append(calls[4])
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert ["prompt_ids" in line for line in lines] == [True, False, True, True, False]
    notes = [orjson.loads(line) for line in receipts_path(path).read_bytes().splitlines()]
    assert notes == [{"rollout_id": "r", "last_call": 1}]  # readers let the rollout's calls go after call 1
    reader = read_calls(path)
    assert list(reader) == calls and reader.torn_lines == 0


def test_a_line_refers_only_to_its_rollouts_latest_lines(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A prompt that extends a call older than the rollout's last REFERABLE_CALLS lines is written whole
    (a subagent's calls came between): a reader keeps no more than those."""
    calls = rollout("r", 12)
    for call in calls[5:]:  # call 5 extends the call 4 lines back, the later ones the call 5 lines back
        base = calls[call.call_index - REFERABLE_CALLS - (call.call_index > 5)]
        full = len(base.prompt_ids) + len(base.generated_ids)
        call.prefix = PrefixCheck(previous_call=base.call_index, extended=True, shared=full, previous_length=full)
    lines = [orjson.loads(line) for line in write(tmp_path / "calls.jsonl", calls)]
    assert lines[5]["prompt_from"]["call"] == 5 - REFERABLE_CALLS
    assert [("prompt_from" in line) for line in lines[6:]] == [False] * 6
    reader = read_calls(tmp_path / "calls.jsonl")
    assert list(reader) == calls and reader.torn_lines == 0


def test_a_reader_keeps_a_few_calls_per_open_rollout_not_the_log(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """200 rollouts of 10 calls, 8 open at a time (their lines interleaved, each closed when done): the
    reader holds at most REFERABLE_CALLS calls of each open rollout, whatever the log's length."""
    path = tmp_path / "calls.jsonl"
    written: list[ModelCall] = []
    with CallLog(path) as log:
        for wave in range(25):
            group = [rollout(f"w{wave}r{k}", 10) for k in range(8)]
            for index in range(10):
                for calls in group:
                    log.append(calls[index])
                    written.append(calls[index])
            for calls in group:
                log.forget(calls[0].rollout_id)
    reader = read_calls(path)
    assert list(reader) == written and reader.torn_lines == 0
    assert reader.most_held == 8 * REFERABLE_CALLS


def test_a_line_that_refers_to_a_torn_line_is_skipped_and_counted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a, b = rollout("a", 3), rollout("b", 2)
    path = tmp_path / "calls.jsonl"
    lines = write(path, [a[0], b[0], a[1], b[1], a[2]])
    lines[2] = lines[2][: len(lines[2]) // 2]  # a's call 1 torn (a writer died mid-line, before repair existed)
    path.write_bytes(b"\n".join(lines) + b"\n")
    reader = read_calls(path)
    # a#2 refers to a#1: it cannot be put back together either; b is whole
    assert [(c.rollout_id, c.call_index) for c in reader] == [("a", 0), ("b", 0), ("b", 1)]
    assert reader.torn_lines == 2


def test_clawgym_calls_prints_every_call_whole(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """For jq and users' own scripts, which read lines one by one: `clawgym calls RUN_DIR [--rollout ID]`."""
    a, b = rollout("a", 4), rollout("b", 3)
    write(tmp_path / "calls.jsonl", [*a, *b])
    cli = [sys.executable, "-c", "from clawgym_cli.app import app; app()", "calls"]
    whole = subprocess.run([*cli, str(tmp_path)], capture_output=True, check=True).stdout.splitlines()
    assert [orjson.loads(line) for line in whole] == [orjson.loads(record_line(c)) for c in [*a, *b]]
    assert ModelCall.model_validate_json(whole[3]) == a[3]  # a whole line, on its own
    only_b = subprocess.run([*cli, str(tmp_path / "calls.jsonl"), "--rollout", "b"], capture_output=True, check=True)
    assert [orjson.loads(line) for line in only_b.stdout.splitlines()] == [c.model_dump(mode="json") for c in b]


CUT_SHORT = """
import resource, signal, sys
from pathlib import Path
from tests.foundation.test_call_log_lines import rollout
from clawgym_env.records import CallLog

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: write() returns short, then fails with EFBIG
path = Path(sys.argv[1])
calls = rollout("r", 3)
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
with CallLog(path) as log:
    log.append(calls[0])
    resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 500, hard))  # call 1's line does not fit
    try:
        log.append(calls[1])
    except OSError as exc:
        print("refused:", exc.errno, path.stat().st_size)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # room again
    log.append(calls[2])
"""


def test_a_write_the_disk_cuts_short_leaves_no_fragment(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A full disk takes part of a line without an error: the log is cut back, the call refused (the proxy
    answers 500 record_failed), and the next call's line neither glues to a fragment nor refers to it."""
    path = tmp_path / "calls.jsonl"
    out = subprocess.run([sys.executable, "-c", CUT_SHORT, str(path)], capture_output=True, text=True, check=True)
    first = len(record_line(rollout("r", 1)[0]))
    assert out.stdout.split() == ["refused:", "27", str(first)]  # EFBIG; the file ends where call 0's line ends
    reader = read_calls(path)
    calls = rollout("r", 3)
    assert list(reader) == [calls[0], calls[2]] and reader.torn_lines == 0
    line = orjson.loads(path.read_bytes().splitlines()[1])  # call 2's: it extends call 1, which is not logged
    assert "prompt_ids" in line and line["request_from"]["call"] == 0  # so its ids are whole; never refer to 1
