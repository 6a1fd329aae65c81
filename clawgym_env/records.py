"""ModelCall: what the proxy records per model call, and the durable append-only log it goes to.

One module, past 500 lines, because the record, its line format and its reader change together: a line a
writer makes must read back the same.

Two views of a call are kept apart: `request` is the harness view (the raw JSON it sent); the token
fields are the training view (exact ids the engine saw and generated, with the engine's logprobs).

The log is append-only, one line per call, so what is learnt about a call after its record was written
(whether the client took the reply whole) goes to a sibling file of receipts (`calls.receipts` next to
`calls.jsonl`) that `read_calls` folds back into the calls.

A line holds what its call adds to its rollout's earlier lines, not the whole call: every call of a harness
resends the whole conversation and its prompt begins with the previous call's ids, so whole lines would
make a rollout's log grow with the square of its calls (MBs for one long Claude Code rollout). The first
line a log writes for a rollout is whole (the fields of `ModelCall`); a later one may have instead of
- `prompt_ids`: `prompt_from` {"call": j, "length": n} and `prompt_tail`: the first n ids of call j's
  prompt + generated ids (j: the call `prefix.previous_call` names), then the tail;
- `segments`: `segments_from` {"call": j, "count": k} and `segments_tail`: call j's first k segments, then the
  tail;
- `request`: `request_from` {"call": i, "lists": {key: n}, "same": [key]} and `request_rest`: the request's
  keys in the order sent, with, for each key in `lists`, call i's (the rollout's previous line) first n
  items before the ones in `request_rest`, and each key in `same` (null there) as it was in call i's.
A line refers only to its rollout's last `REFERABLE_CALLS` lines, and when the proxy closes a rollout the
receipts file says after which line (`RolloutClosed`): a reader keeps a few calls per open rollout, not the
whole log. `read_calls` puts the calls back together; read the log through it (or `clawgym inspect`), not
line by line.
"""

from __future__ import annotations

import errno
import functools
import logging
import operator
import os
import stat
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from clawgym_env.specs import ApiStyle

log = logging.getLogger(__name__)

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
    """A span [start, end) of the prompt ids and where its tokens came from.

    Frozen: equal spans recur in every later call of a conversation (and across rollouts with the same
    system prompt), so the renderer hands out one shared instance per span (`segment`).
    """

    model_config = ConfigDict(frozen=True)

    start: int
    end: int
    kind: SegmentKind
    source_call: int | None = None  # for assistant_spliced: the call index whose generation this is


@functools.lru_cache(maxsize=1 << 16)
def segment(start: int, end: int, kind: SegmentKind, source_call: int | None = None) -> PromptSegment:
    """The shared PromptSegment for a span: the proxy makes ~20 per call, nearly all seen in an earlier call."""
    return PromptSegment(start=start, end=end, kind=kind, source_call=source_call)


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
    rewritten_turns: int = 0  # echoed turns spliced after undoing a known harness rewrite (clawgym_env.chat.splice)
    prefix: PrefixCheck | None = None  # did the prompt extend the previous call's ids (None: not checked)
    timings: CallTimings = Field(default_factory=CallTimings)
    error: str | None = None
    streamed: bool = False
    # None: not known (an older log, a call still being answered). False: the client never took the reply
    # whole (it hung up, or the proxy died first); such a sample was not seen by the harness.
    delivered: bool | None = None
    control_token_texts: int = 0  # control tokens written as text in user/tool/system text (kept as text)

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


class DeliveryReceipt(BaseModel):
    """Appended after a call's record once the proxy knows whether its reply reached the client whole."""

    rollout_id: str
    call_index: int
    delivered: bool


class RolloutClosed(BaseModel):
    """Appended to the receipts file when the proxy closes a rollout: no later line refers to its calls (a
    call that ends after the close is written whole), so a reader lets them go at `last_call`'s line."""

    rollout_id: str
    last_call: int  # the call index of the rollout's latest line in the log when it closed


class LineSpan(NamedTuple):
    """Where one call's line is in its log: what `read_lines` reads back without scanning the file."""

    offset: int
    length: int


def _fields_of(value: Any) -> dict[str, Any]:
    if type(value) is ModelCall:  # its segments (a few per turn) as dicts: orjson writes them without calling back
        return {**value.__dict__, "segments": [s.__dict__ for s in value.segments]}
    if isinstance(value, BaseModel):
        return value.__dict__
    raise TypeError(f"type is not JSON serializable: {type(value).__name__}")


def record_line(record: BaseModel) -> bytes:
    """One JSONL line of a record: the bytes of `orjson.dumps(record.model_dump(mode="json"))`, ~4x faster.

    orjson walks the record's own field dicts (the models here hold plain JSON values, enums and other such
    models: no aliases, computed fields or custom serializers), so pydantic builds no intermediate copy of
    the request and the ids; this runs once per model call on the proxy's event loop.
    """
    return orjson.dumps(record, default=_fields_of, option=orjson.OPT_APPEND_NEWLINE)


REFERABLE_CALLS = 4  # a line refers to no call older than its rollout's last 4 lines (what a reader keeps)


def _keep_latest(latest: dict[int, ModelCall], call: ModelCall) -> int:
    """Keep `call` among its rollout's latest REFERABLE_CALLS calls (oldest first), as both the writer and the
    reader of a log do, so a line refers only to calls its reader still holds; how many more are held now."""
    added = call.call_index not in latest
    latest[call.call_index] = call
    if len(latest) > REFERABLE_CALLS:
        del latest[next(iter(latest))]
        return 0
    return int(added)


def delta_line(call: ModelCall, written: Mapping[int, ModelCall]) -> bytes:
    """The log line of `call` given the rollout's calls written before it (by call index; the latest last):
    its prompt as a tail after an earlier call's ids, its request as what it adds to the previous line's
    (the module's docstring gives the format). What cannot be referred to is written whole."""
    fields = dict(call.__dict__)
    segments = call.segments
    prefix = call.prefix
    base = written.get(prefix.previous_call) if prefix is not None and prefix.previous_call is not None else None
    if base is not None and prefix is not None:
        if prefix.shared > 0 and _begins_with_ids(call.prompt_ids, base, prefix.shared):
            del fields["prompt_ids"]
            fields["prompt_from"] = {"call": base.call_index, "length": prefix.shared}
            fields["prompt_tail"] = call.prompt_ids[prefix.shared :]
        count = _shared_segments(base.segments, segments)
        if count:
            del fields["segments"]
            fields["segments_from"] = {"call": base.call_index, "count": count}
            fields["segments_tail"] = [s.__dict__ for s in segments[count:]]
    if "segments" in fields:
        fields["segments"] = [s.__dict__ for s in segments]
    if written:
        previous = next(reversed(written.values()))
        lists, same = _request_reuse(call.request, previous.request)
        if lists or same:
            del fields["request"]
            fields["request_from"] = {"call": previous.call_index, "lists": lists, "same": same}
            kept = set(same)
            fields["request_rest"] = {  # every key, in the order sent: a `same` key holds its place as null
                key: None if key in kept else value[lists[key] :] if key in lists else value
                for key, value in call.request.items()
            }
    return orjson.dumps(fields, default=_fields_of, option=orjson.OPT_APPEND_NEWLINE)


def _begins_with_ids(prompt: list[int], base: ModelCall, length: int) -> bool:
    """Whether `prompt` begins with the first `length` ids of `base`'s prompt + generated ids."""
    head = base.prompt_ids
    if length <= len(head):
        return len(prompt) >= length and prompt[:length] == head[:length]
    rest = length - len(head)
    return (
        len(prompt) >= length
        and rest <= len(base.generated_ids)
        and prompt[: len(head)] == head
        and prompt[len(head) : length] == base.generated_ids[:rest]
    )


def _shared_segments(before: list[PromptSegment], after: list[PromptSegment]) -> int:
    """How many of `after`'s first segments are `before`'s very objects (the renderer hands out one shared
    instance per span, `segment`): usually all of `before`, or all but its generation prompt."""
    if len(before) <= len(after) and all(map(operator.is_, before, after)):
        return len(before)
    if 1 < len(before) <= len(after) + 1 and all(map(operator.is_, before[:-1], after)):
        return len(before) - 1
    return next((i for i, (a, b) in enumerate(zip(before, after)) if a is not b), min(len(before), len(after)))


def _request_reuse(request: dict[str, Any], previous: dict[str, Any]) -> tuple[dict[str, int], list[str]]:
    """The keys of `request` whose list begins with all of `previous`'s list items ({key: how many}) and those
    whose value is `previous`'s very object. The proxy shares the parts a request repeats with the previous
    request (`proxy.request_sharing`), so identity (checked in C) finds them without comparing any JSON."""
    lists: dict[str, int] = {}
    same: list[str] = []
    for key, value in request.items():
        before = previous.get(key, _ABSENT)
        if value is before:
            same.append(key)
        elif (
            type(value) is list
            and type(before) is list
            and 0 < len(before) <= len(value)
            and all(map(operator.is_, before, value))
        ):
            lists[key] = len(before)
    return lists, same


_ABSENT = object()  # a key the previous request did not have (None is a value: `{"x": null}`)


class _Unresolved(Exception):
    """A line refers to a call the reader has not read (its line was torn, or is in another file)."""


def _resolve(data: dict[str, Any], earlier: Mapping[int, ModelCall]) -> None:
    """Turn a line's references to earlier calls of its rollout back into `prompt_ids`, `segments` and `request`,
    in place; raises _Unresolved when the call referred to was not read."""

    def referred(key: str) -> tuple[ModelCall, dict[str, Any]] | None:
        """The call a reference (popped from the line) names, and the reference."""
        ref = data.pop(key, None)
        if ref is None:
            return None
        base = earlier.get(ref["call"])
        if base is None:
            raise _Unresolved(f"{key}: call {ref['call']} was not read")
        return base, ref

    if found := referred("prompt_from"):
        base, ref = found
        length, head = ref["length"], base.prompt_ids
        start = head[:length] if length <= len(head) else head + base.generated_ids[: length - len(head)]
        data["prompt_ids"] = start + data.pop("prompt_tail")
    if found := referred("segments_from"):
        base, ref = found
        data["segments"] = base.segments[: ref["count"]] + data.pop("segments_tail")
    if found := referred("request_from"):
        base, ref = found
        request = data.pop("request_rest")
        for key, count in ref["lists"].items():
            request[key] = base.request[key][:count] + request[key]
        for key in ref["same"]:
            value = base.request[key]
            request[key] = value[:] if type(value) is list else value
        data["request"] = request


def receipts_path(log_path: Path) -> Path:
    """Where a log's delivery receipts go: `calls.jsonl` -> `calls.receipts` (not `*.jsonl`, so globs for
    call logs do not pick it up)."""
    return Path(log_path).with_suffix(".receipts")


class CallLog:
    """Append-only JSONL of ModelCalls, one line per call, written as each call completes.

    A line holds what its call adds to the latest lines of its rollout (`delta_line`), so the log keeps the
    last `REFERABLE_CALLS` calls it wrote of each rollout until `forget(rollout_id)` (the proxy forgets a
    rollout when it closes it, and the receipts file says so; a call written after that is written whole).

    A killed process loses no completed call (the line is in the OS before the response is sent);
    `fsync=True` also survives a machine crash at a per-call cost (the serving proxy instead batches
    fsyncs off its event loop with `sync()`: clawgym_env.proxy.durability). A process killed mid-write leaves a torn
    last line: opening the log cuts it off (`repaired_bytes` says how much), so the next record starts on
    a line of its own. Readers may load the log while it grows (`read_calls` skips and counts torn lines).
    Delivery receipts go to `receipts_path(path)`, opened on the first receipt and repaired the same way.
    """

    def __init__(self, path: Path, fsync: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fh = open(self.path, "a+b", buffering=0)  # noqa: SIM115 - kept open for the run (read too: tail repair)
        self.repaired_bytes = _repair_torn_tail(self._fh.fileno())
        self._receipts: Any = None  # the receipts file, opened on first use
        self._written: dict[str, dict[int, ModelCall]] = {}  # per rollout, its calls written here, in order

    def append(self, call: ModelCall) -> LineSpan:
        """Write one record and say where its line is (for `read_lines`); serialization errors raise before
        anything is written."""
        written = self._written.get(call.rollout_id)
        line = delta_line(call, written) if written else record_line(call)
        end = self._write(self._fh, line)
        with self._lock:
            _keep_latest(self._written.setdefault(call.rollout_id, {}), call)
        return LineSpan(offset=end - len(line), length=len(line))

    def forget(self, rollout_id: str) -> None:
        """Stop keeping a rollout's calls (its later calls, if any, are written whole) and note that it closed
        (`RolloutClosed`), so readers stop keeping them too. Without that note (it could not be written) a
        reader keeps them to the end of the log: memory, never a call."""
        with self._lock:
            held = self._written.pop(rollout_id, None)
        if held:
            try:
                self.append_receipt(RolloutClosed(rollout_id=rollout_id, last_call=next(reversed(held))))
            except (OSError, ValueError) as exc:  # ValueError: the log was closed (the proxy stopped)
                log.warning("could not note that rollout %s closed in %s: %s", rollout_id, self.path, exc)

    def append_receipt(self, receipt: DeliveryReceipt | RolloutClosed) -> None:
        with self._lock:
            if self._receipts is None:
                self._receipts = open(receipts_path(self.path), "a+b", buffering=0)  # noqa: SIM115 - kept open
                self.repaired_bytes += _repair_torn_tail(self._receipts.fileno())
        self._write(self._receipts, record_line(receipt))

    def sync(self) -> None:
        """fsync what was written so far (calls and receipts) to disk; safe from a worker thread."""
        for fh in (self._fh, self._receipts):
            if fh is not None and not fh.closed:
                os.fsync(fh.fileno())

    def _write(self, fh: Any, line: bytes) -> int:
        """Write the whole line or nothing, and return where the file ends after it. A write the disk cuts
        short (full, over a size limit) returns how much it took without raising; the rest is retried, and if
        that fails the file is cut back to where the line began (its size less what this line put there: only
        a failed line pays for the `fstat`), so no fragment is left for the next line to be glued to (or to
        refer to)."""
        with self._lock:
            fd = fh.fileno()
            taken = 0
            try:
                view = memoryview(line)
                while view:
                    written = fh.write(view)  # unbuffered: one write(2), which takes bytes or raises
                    if not written:
                        raise OSError(errno.ENOSPC, "the log's file took no more bytes")
                    taken += written
                    view = view[written:]
                if self.fsync:
                    os.fsync(fd)
                return fh.tell()  # appended: the position is the file's end
            except BaseException:
                end = os.fstat(fd)
                if stat.S_ISREG(end.st_mode):
                    os.ftruncate(fd, end.st_size - taken)
                raise

    def close(self) -> None:
        with self._lock:
            for fh in (self._fh, self._receipts):
                if fh is not None and not fh.closed:
                    fh.close()

    def __enter__(self) -> CallLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _repair_torn_tail(fd: int) -> int:
    """Truncate a log to its last complete line; return how many bytes were cut."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return 0  # a pipe or device: nothing to repair
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return 0
    end, step = size, 1 << 16
    while end > 0:
        start = max(0, end - step)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    os.ftruncate(fd, end)
    return size - end


def _call_of(data: dict[str, Any], earlier: Mapping[int, ModelCall]) -> ModelCall:
    """The call a parsed line holds, its references to `earlier` calls of its rollout resolved."""
    if "prompt_from" in data or "request_from" in data or "segments_from" in data:
        _resolve(data, earlier)
    return ModelCall.model_validate(data)


def read_lines(
    path: Path, spans: Sequence[LineSpan], receipts: Mapping[int, bool | None] | None = None
) -> list[ModelCall]:
    """One rollout's calls read back from its lines of a log (`CallLog.append` said where each one is, in the
    order written), whole, with `receipts` (call index -> delivered, None while awaited) put on them: how the
    proxy hands out a rollout's calls, so they are always what was recorded. Raises ValueError if a line does
    not read back."""
    earlier: dict[int, ModelCall] = {}
    calls = []
    with open(path, "rb") as fh:
        for span in spans:
            fh.seek(span.offset)
            raw = fh.read(span.length)
            try:
                call = _call_of(orjson.loads(raw), earlier)
            except (orjson.JSONDecodeError, ValidationError, _Unresolved, KeyError, TypeError) as exc:
                raise ValueError(f"{path}: the line at byte {span.offset} does not read back as a call: {exc}") from exc
            _keep_latest(earlier, call)
            if receipts and call.call_index in receipts:
                call.delivered = receipts[call.call_index]
            calls.append(call)
    return calls


class read_calls(Iterator[ModelCall]):  # lower case: used like a function, `for call in read_calls(path)`
    """The calls of a log (optionally of one rollout), whole, with their delivery receipts folded in.

    A line that does not parse (torn by a writer that died mid-line, anywhere in the file) is skipped and
    counted in `torn_lines` once the iteration is done; a final line without a newline is torn too, and so
    is a line that refers to a call whose line was torn. The reader keeps each open rollout's last
    `REFERABLE_CALLS` calls while it reads (later lines refer to them) and lets them go at the rollout's last
    line before it closed (`RolloutClosed`); `most_held` says the most calls it held at once.
    """

    def __init__(self, path: Path, rollout_id: str | None = None) -> None:
        self.path = Path(path)
        self.rollout_id = rollout_id
        self.torn_lines = 0
        self.most_held = 0  # the most calls kept at once for later lines to refer to
        self._calls = self._read()

    def __iter__(self) -> read_calls:
        return self

    def __next__(self) -> ModelCall:
        return next(self._calls)

    def _receipts(self) -> tuple[dict[tuple[str, int], bool], dict[str, int]]:
        """Whether each call's reply was delivered; after which call each closed rollout's lines end."""
        receipts: dict[tuple[str, int], bool] = {}
        closed: dict[str, int] = {}
        path = receipts_path(self.path)
        if not path.is_file():
            return receipts, closed
        with open(path, "rb") as fh:
            for raw in fh:
                try:
                    if not raw.endswith(b"\n"):
                        raise ValueError("torn")
                    if b'"last_call"' in raw:
                        ended = RolloutClosed.model_validate_json(raw)
                        closed[ended.rollout_id] = ended.last_call
                        continue
                    receipt = DeliveryReceipt.model_validate_json(raw)
                except ValueError:  # pydantic's ValidationError is a ValueError
                    self.torn_lines += 1
                    continue
                receipts[(receipt.rollout_id, receipt.call_index)] = receipt.delivered
        return receipts, closed

    def _read(self) -> Iterator[ModelCall]:
        receipts, closed = self._receipts()
        earlier: dict[str, dict[int, ModelCall]] = {}  # per open rollout, its latest calls read
        held = 0
        with open(self.path, "rb") as fh:
            for raw in fh:
                if not raw.endswith(b"\n"):
                    self.torn_lines += 1  # a writer died mid-line (or is writing it now)
                    break
                if not raw.strip():
                    continue
                try:
                    data = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    self.torn_lines += 1
                    continue
                if not isinstance(data, dict) or (
                    self.rollout_id is not None and data.get("rollout_id") != self.rollout_id
                ):
                    continue
                try:
                    call = _call_of(data, earlier.get(data.get("rollout_id"), {}))
                except (ValidationError, _Unresolved, KeyError, TypeError):
                    self.torn_lines += 1
                    continue
                held += _keep_latest(earlier.setdefault(call.rollout_id, {}), call)
                self.most_held = max(self.most_held, held)
                if closed.get(call.rollout_id) == call.call_index:  # its last line before the proxy closed it
                    held -= len(earlier.pop(call.rollout_id))
                delivered = receipts.get((call.rollout_id, call.call_index))
                if delivered is not None:
                    call.delivered = delivered
                yield call
