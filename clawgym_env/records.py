"""ModelCall: what the proxy records per model call, and the durable append-only log it goes to.

Two views of a call are kept apart: `request` is the harness view (the raw JSON it sent); the token
fields are the training view (exact ids the engine saw and generated, with the engine's logprobs).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field, model_validator

from clawgym_env.specs import ApiStyle

SegmentKind = Literal[
    "system",  # system prompt (including the template's tool section)
    "tools",  # tool definitions
    "user",  # user text
    "tool",  # tool output / environment feedback
    "assistant_spliced",  # an earlier generation, spliced back as its raw ids
    "assistant_rendered",  # an earlier assistant turn that matched no generation (drift): re-tokenized
    "template",  # role headers, separators, the generation prompt
]


class PromptSegment(BaseModel):
    """A span [start, end) of the prompt ids and where its tokens came from."""

    start: int
    end: int
    kind: SegmentKind
    source_call: int | None = None  # for assistant_spliced: the call index whose generation this is


PrefixReason = Literal[
    "drift",  # an echoed assistant turn differs from what was generated there (re-tokenized, or another generation)
    "edited_history",  # an earlier user or tool message was changed, removed or inserted
    "harness_rewrite",  # the harness changed its own instructions (a mid-conversation system message)
    "compaction",  # the harness replaced its history with a much shorter one (a summary)
    "retry",  # the harness re-sent an earlier prompt, or did not echo the previous generation
    "new_root",  # the first call of another system prompt / tool set (a subagent or side call): nothing to extend
]


class PrefixCheck(BaseModel):
    """Whether a call's prompt began with the full ids (prompt + generation) of the previous call of its agent.

    The previous call is the latest completed call with the same leading system / tools ids (the same
    agent, as reconstruction groups calls). When the prompt does not extend it, `shared` is where it broke
    and `reason` says why (see clawgym_env.prefix).
    """

    previous_call: int | None = None  # None: no earlier call of this agent to extend
    extended: bool | None = None  # None when there is no previous call
    shared: int = 0  # common prefix with the previous call's full ids: the break position when not extended
    previous_length: int = 0  # length of the previous call's full ids
    reason: PrefixReason | None = None
    detail: str = ""


class CallTimings(BaseModel):
    received_at: float = 0.0  # unix time the request arrived
    render_s: float = 0.0
    queue_s: float = 0.0
    generate_s: float = 0.0
    total_s: float = 0.0
    first_token_s: float | None = None


class ModelCall(BaseModel):
    rollout_id: str
    call_index: int
    api_style: ApiStyle
    request: dict[str, Any]
    prompt_ids: list[int]
    generated_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    finish_reason: str = "stop"
    policy_version: int = 0
    segments: list[PromptSegment] = Field(default_factory=list)
    drift_events: int = 0  # assistant turns echoed by the harness that matched no recorded generation
    rewritten_turns: int = 0  # echoed turns spliced after undoing a known harness rewrite (clawgym_env.proxy.splice)
    prefix: PrefixCheck | None = None  # did the prompt extend the previous call's ids (None: not checked)
    timings: CallTimings = Field(default_factory=CallTimings)
    error: str | None = None
    streamed: bool = False

    @model_validator(mode="after")
    def _aligned(self) -> ModelCall:
        if len(self.generated_ids) != len(self.logprobs):
            raise ValueError(
                f"call {self.rollout_id}#{self.call_index}: {len(self.generated_ids)} generated ids but "
                f"{len(self.logprobs)} logprobs"
            )
        return self

    @property
    def full_ids(self) -> list[int]:
        return self.prompt_ids + self.generated_ids

    @property
    def spliced_spans(self) -> list[PromptSegment]:
        return [s for s in self.segments if s.kind == "assistant_spliced"]


class CallLog:
    """Append-only JSONL of ModelCalls, one line per completed call, flushed as each call completes.

    A killed process loses no completed call (the line is in the OS before the response is sent);
    `fsync=True` also survives a machine crash at a per-call cost. Readers may load it while it grows:
    a torn last line (the writer died mid-write) is skipped and counted.
    """

    def __init__(self, path: Path, fsync: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115 - kept open for the run

    def append(self, call: ModelCall) -> None:
        line = orjson.dumps(call.model_dump(mode="json")) + b"\n"
        with self._lock:
            self._fh.write(line)
            if self.fsync:
                os.fsync(self._fh.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()

    def __enter__(self) -> CallLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_calls(path: Path, rollout_id: str | None = None) -> Iterator[ModelCall]:
    """Yield the calls of a log (optionally of one rollout), skipping a torn final line."""
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break  # a writer died mid-line; everything before it is complete
            data = orjson.loads(raw)
            if rollout_id is None or data.get("rollout_id") == rollout_id:
                yield ModelCall.model_validate(data)
