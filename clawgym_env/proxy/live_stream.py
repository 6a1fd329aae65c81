"""Live streaming: tokens from the engine become SSE events while the generation runs.

Two parts, both free of HTTP:

- `TokenFeed` reads an engine's token stream for one call under the proxy's deadline and the client's
  disconnect; on either it stops the engine and hands back what was generated (to be recorded).
- `StreamSplitter` decides which of the generated text may go out before the generation ends. The final
  answer is always `renderer.parse` of all the ids (as for a non-streamed call); the splitter only sends
  what that parse cannot take back: reasoning once `</think>` closes it, plain text up to where a tool call
  could begin (`<tool_call>`, a ```` ``` ```` fence, a `{`/`[` starting a line, or a prefix of one of these;
  trailing whitespace, since the answer is stripped), and each `<tool_call>…</tool_call>` block as soon as it
  closes and parses. Fenced and bare-JSON calls (Qwen2.5-Coder) are sent when the generation ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

from clawgym_env.chat.conversation import ToolCall
from clawgym_env.chat.renderers.base import ParsedOutput
from clawgym_env.chat.renderers.toolcall_parsing import calls_from_json, split_reasoning
from clawgym_env.engines.token_stream import can_abort, collect, stream_tokens
from clawgym_env.interfaces import Generation, SamplingParams, TokenChunk

MARKERS = ("<tool_call>", "```")
_CLOSED_TAG = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_LINE_STARTS_JSON = re.compile(r"\n[{\[]")  # a line that starts with `{` or `[` (the bracket is at start + 1)
MAX_PENDING_IDS = 8  # ids held while they decode to an incomplete UTF-8 character

Piece = tuple[Literal["reasoning", "text", "tool"], Any]


class StreamStopped(Exception):
    """The feed ended early: the client left (`disconnected`), the deadline passed, or the engine failed."""

    def __init__(self, why: Literal["disconnected", "timeout", "engine"], generation: Generation | None, cause=None):
        super().__init__(why)
        self.why, self.generation, self.cause = why, generation, cause


async def _wait_for_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    while True:
        if (await receive())["type"] == "http.disconnect":
            return


def disconnect_watch(
    receive: Callable[[], Awaitable[dict[str, Any]]], lost: asyncio.Future[None] | None
) -> asyncio.Future[None]:
    """A future done once the client leaves: the connection's own `lost` future when there is one (shared
    by its calls: never cancel it), else a task reading `receive()` until "http.disconnect" (cancel it)."""
    return lost if lost is not None else asyncio.ensure_future(_wait_for_disconnect(receive))


class TokenFeed:
    """One call's token stream, read under a deadline while watching for a disconnect.

    A pump task reads the engine's stream into a buffer; `next()` hands out everything decoded since the
    previous `next()` as one chunk. So the per-token cost is one event wake-up, not a task and a wait per
    token, and tokens that pile up while the proxy is busy (many streams, a slow client) go out in one
    send instead of one each. The deadline is one timer for the whole call.

    `min_gap_s` paces the hand-outs after the first: tokens that come sooner than that after the previous
    hand-out wait for the gap to end, and go out together. An engine streams one chunk per token per decode
    step, and each hand-out costs the proxy a wake-up, a decode, SSE events and a socket write, so at
    1,000 streams that per-token work, not the call, is what a proxy core spends. The first tokens, the end
    of the generation, a disconnect, the deadline and keep-alive ticks are never held back.
    """

    def __init__(
        self,
        engine: Any,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str,
        receive: Callable[[], Awaitable[dict[str, Any]]],
        deadline: float,
        tick_s: float = 0.0,
        lost: asyncio.Future[None] | None = None,
        min_gap_s: float = 0.0,
    ) -> None:
        self.engine, self.request_id, self.tick_s, self.min_gap_s = engine, request_id, tick_s, min_gap_s
        self.chunks: list[TokenChunk] = []  # as the engine gave them (the recorded generation)
        self.finished = False  # next() returns None from now on
        self._iter: AsyncIterator[TokenChunk] = stream_tokens(engine, prompt_ids, sampling, request_id)
        self._handed = 0  # chunks handed out by next()
        self._ended = False  # the engine's stream is over (finished, failed or exhausted)
        self._error: BaseException | None = None
        self._timed_out = False
        self._ticked = False
        self._wake = asyncio.Event()
        self._quiet_until = 0.0  # loop time before which new tokens wait (min_gap_s after a hand-out)
        self._paced: asyncio.TimerHandle | None = None  # the wake-up at `_quiet_until` for held tokens
        loop = self._loop = asyncio.get_running_loop()
        self._pump = asyncio.ensure_future(self._read())
        self._lost = lost
        self._watcher = disconnect_watch(receive, lost)
        self._watcher.add_done_callback(self._on_lost)
        self._timer = loop.call_at(deadline, self._time_out)
        self._tick = loop.call_later(tick_s, self._on_tick) if tick_s > 0 else None

    def generation(self) -> Generation:
        return collect(self.chunks)

    def _on_lost(self, _: asyncio.Future[None]) -> None:
        self._wake.set()

    def _end_quiet(self) -> None:
        self._paced = None
        self._wake.set()

    def _time_out(self) -> None:
        self._timed_out = True
        self._wake.set()

    def _on_tick(self) -> None:
        self._ticked = True
        self._wake.set()
        self._tick = asyncio.get_running_loop().call_later(self.tick_s, self._on_tick)

    async def _read(self) -> None:
        try:
            async for chunk in self._iter:
                self.chunks.append(chunk)
                if chunk.finish_reason is not None:
                    break  # `finally` wakes the reader: the end is never held back
                if self._loop.time() >= self._quiet_until:
                    self._wake.set()
                elif self._paced is None:
                    self._paced = self._loop.call_at(self._quiet_until, self._end_quiet)
        except Exception as exc:
            self._error = exc
        finally:
            self._ended = True
            self._wake.set()

    async def next(self) -> TokenChunk | None:
        """What was decoded since the last call (one chunk), or None once the stream is over; raises
        StreamStopped with the partial generation. With `tick_s`, once the first tokens are out, an empty
        chunk every `tick_s` seconds (the caller's chance to send a keep-alive)."""
        if self.finished:
            return None
        while True:
            if self._watcher.done():  # a gone client wins even if tokens came with it
                raise StreamStopped("disconnected", await self._stop())
            if self._timed_out and not self._ended:  # the deadline holds even while tokens keep coming
                raise StreamStopped("timeout", await self._stop())
            if self._handed < len(self.chunks) and (self._ended or self._loop.time() >= self._quiet_until):
                chunk = _merged(self.chunks[self._handed :])
                self._handed = len(self.chunks)
                self.finished = chunk.finish_reason is not None
                if self.min_gap_s:
                    self._quiet_until = self._loop.time() + self.min_gap_s
                if self._paced is not None:  # its gap is over: tokens from now on wait for the new one
                    self._paced.cancel()
                    self._paced = None
                return chunk
            if self._ended:
                self.finished = True
                if self._error is not None:
                    partial = getattr(self._error, "generation", None)
                    raise StreamStopped(
                        "engine", partial if isinstance(partial, Generation) else None, self._error
                    ) from self._error
                return None
            if self._ticked and self._handed:  # not before the first tokens: until then nothing is sent
                self._ticked = False
                return TokenChunk([], [])
            self._wake.clear()
            await self._wake.wait()

    def _cancel_timers(self) -> None:
        self._timer.cancel()
        if self._paced is not None:
            self._paced.cancel()
        if self._tick is not None:
            self._tick.cancel()

    async def _stop(self) -> Generation:
        """Stop the engine; an engine with abort() finishes the stream with what it generated (finish "abort")."""
        self.finished = True
        self._cancel_timers()
        if not self._ended and can_abort(self.engine) and self.engine.abort(self.request_id):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._pump), timeout=5)  # reads up to the abort chunk
        self._pump.cancel()
        return collect(self.chunks, "abort")

    async def aclose(self) -> None:
        self._cancel_timers()
        if self._lost is not None:
            self._lost.remove_done_callback(self._on_lost)
        else:
            self._watcher.cancel()
        if not self._pump.done():
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump
        with contextlib.suppress(Exception):
            await self._iter.aclose()  # type: ignore[attr-defined]


def _merged(chunks: list[TokenChunk]) -> TokenChunk:
    if len(chunks) == 1:
        return chunks[0]
    last = chunks[-1]
    ids = [t for c in chunks for t in c.token_ids]
    logprobs = [lp for c in chunks for lp in c.logprobs]
    return TokenChunk(ids, logprobs, last.finish_reason, last.policy_version)


class StreamSplitter:
    """Incremental decoding of one generation into the pieces that may be sent before it ends."""

    def __init__(self, decode: Callable[[list[int]], str], stop_ids: set[int], mint_id: Callable[[], str]) -> None:
        self._decode, self._stop_ids, self._mint_id = decode, stop_ids, mint_id
        self.text = ""  # decoded so far (stop tokens left out, as parse does)
        self._pending: list[int] = []
        self._mode: Literal["start", "text", "held"] = "start"
        self._head = -1  # where the first non-space character is (start: is it <think>?)
        self._body_start = 0  # where the answer begins (after a closed reasoning block)
        self._lead = -1  # the answer's first non-space character
        self._sent_end = 0  # text up to here went out
        self._scan = 0  # searched up to here (for </think>, a hazard, or </tool_call>, by mode)
        self._tags_from = -1  # in "held": where a run of <tool_call> blocks starts, or -1 (hold all)
        self.reasoning: str | None = None
        self.sent_text = ""
        self.calls: list[ToolCall] = []  # sent, with their ids

    def feed(self, ids: list[int]) -> list[Piece]:
        self._pending += [t for t in ids if t not in self._stop_ids]
        if not self._pending:
            return []
        piece = self._decode(self._pending)
        if piece.endswith("\ufffd") and len(self._pending) < MAX_PENDING_IDS:
            return []  # a multi-byte character split across tokens: wait for its other bytes
        self.text += piece
        self._pending = []
        return self._advance()

    def _advance(self) -> list[Piece]:
        """Look at the newly decoded text only (indices into `self.text`), so a long generation stays linear."""
        out: list[Piece] = []
        text = self.text
        if self._mode == "start":
            if self._head < 0:
                stripped = len(text.lstrip())
                if not stripped:
                    return out
                self._head = len(text) - stripped
            if text.startswith("<think>", self._head):
                close = text.find("</think>", max(self._head, self._scan))
                self._scan = max(self._head, len(text) - len("</think>"))
                if close < 0:
                    return out
                self.reasoning = split_reasoning(text)[0]
                out.append(("reasoning", self.reasoning))
                self._body_start = close + len("</think>")
            elif len(text) - self._head < len("<think>") and "<think>".startswith(text[self._head :]):
                return out  # may still open a reasoning block
            self._mode, self._scan = "text", self._body_start
        if self._mode == "text":
            if self._lead < 0:
                stripped = len(text) - self._body_start - len(text[self._body_start :].lstrip())
                if self._body_start + stripped == len(text):
                    return out  # only whitespace so far
                self._lead = self._sent_end = self._scan = self._body_start + stripped
            hazard = _first_hazard(text, self._lead, self._scan)
            self._scan = max(self._lead, len(text) - 16)  # nothing before this can start a hazard any more
            end = hazard if hazard is not None else len(text) - _marker_prefix_len(text)
            delta = text[self._sent_end : end].rstrip()
            if delta:
                out.append(("text", delta))
                self.sent_text += delta
                self._sent_end += len(delta)
            if hazard is None:
                return out
            self._mode = "held"
            self._tags_from = self._scan = hazard if text.startswith("<tool_call>", hazard) else -1
        if self._tags_from >= 0 and text.find("</tool_call>", self._scan) >= 0:
            self._scan = len(text)
            for match in list(_CLOSED_TAG.finditer(text, self._tags_from))[len(self.calls) :]:
                try:
                    found = calls_from_json(json.loads(match.group(1)), None, strict=False)
                except json.JSONDecodeError:
                    found = None
                if not found or len(found) != 1:
                    self._tags_from = -1  # unusual: leave the rest to the final parse
                    break
                call = found[0]
                call.id = self._mint_id()
                self.calls.append(call)
                out.append(("tool", call))
        elif self._tags_from >= 0:
            self._scan = max(self._tags_from, len(text) - len("</tool_call>"))
        return out

    def finish(self, parsed: ParsedOutput) -> tuple[list[Piece], list[ToolCall], bool]:
        """What is left to send once `parsed` (the whole generation's parse) is known, every tool call of the
        answer (ids of sent ones kept), and whether what was sent agrees with `parsed`."""
        rest: list[Piece] = []
        agrees = True
        if parsed.reasoning != self.reasoning:
            if self.reasoning is None and not self.sent_text and not self.calls:
                rest.append(("reasoning", parsed.reasoning))
            else:
                agrees = False
        if parsed.text.startswith(self.sent_text):
            if len(parsed.text) > len(self.sent_text):
                rest.append(("text", parsed.text[len(self.sent_text) :]))
        else:
            agrees = False
        sent = [(c.name, c.arguments) for c in self.calls]
        if [(c.name, c.arguments) for c in parsed.tool_calls[: len(sent)]] != sent:
            agrees = False
            return rest, list(self.calls), agrees
        calls = list(self.calls)
        for call in parsed.tool_calls[len(sent) :]:
            call.id = self._mint_id()
            calls.append(call)
            rest.append(("tool", call))
        return rest, calls, agrees


def _first_hazard(body: str, lead: int, since: int) -> int | None:
    """Where a tool call could begin (from `since` on): a marker, or `{` / `[` starting a line (bare JSON)
    or starting the answer (at `lead`). Searched by `str.find` and a regex, not character by character."""
    found = [i for i in (body.find(m, since) for m in MARKERS) if i >= 0]
    if since <= lead < len(body) and body[lead] in "{[":
        found.append(lead)
    line = _LINE_STARTS_JSON.search(body, max(since - 1, 0))
    if line is not None:
        found.append(line.start() + 1)
    return min(found) if found else None


def _marker_prefix_len(body: str) -> int:
    """Length of the longest end of `body` that is a proper prefix of a marker (it may still become one)."""
    best = 0
    for marker in MARKERS:
        for k in range(min(len(marker) - 1, len(body)), best, -1):
            if body.endswith(marker[:k]):
                best = k
                break
    return best
