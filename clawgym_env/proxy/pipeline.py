"""One model call, from its request to its record and its answer, with no HTTP in it.

`CallPipeline.run` is the whole life of a call inside the proxy, read top to bottom:

    admit (call cap, calls in flight) -> body (read and parsed by the transport) -> the API's request
    -> render (splicing earlier generations) -> context and token budget -> engine (timeout, caller gone)
    -> parse the generation -> count its tokens -> record -> remember it for splicing -> the answer

Its result is an `Answer`: a status with a JSON or event-stream body, or, for a live stream, a `pump` that
writes the events while the engine decodes (the 200 and the first events leave with the first tokens; the
final events only after the call is recorded). Every failure ends in `_failed`, the one place that maps it to
its API error and records the call with whatever was generated before it. So a killed proxy loses no
completed call, and a generation that cannot be recorded is neither returned nor spliced.

The HTTP server (`server.py`) checks the key, reads the body and sends the answer. The white-box loop, which
calls its engine in-process, asks `admit_in_process` for its token budget and records through
`record_in_process`: the same counters, the same log, one token budget for both kinds of call.

Longer than this package's other modules on purpose: one call's whole life, live streams included, is meant to
be read in one place, top to bottom (docs/life_of_a_token.md follows it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from clawgym_env.chat import jsonio
from clawgym_env.chat.conversation import Conversation
from clawgym_env.chat.renderers.base import ParsedOutput, RenderedPrompt
from clawgym_env.engines.token_stream import can_abort, generate
from clawgym_env.interfaces import Generation, InProcessAdmission, SamplingParams
from clawgym_env.prefix import common_prefix_length
from clawgym_env.proxy.apis import ApiAdapter, CallOutput
from clawgym_env.proxy.apis.base import EventWriter, mint_id
from clawgym_env.proxy.errors import ProxyError, error_body
from clawgym_env.proxy.guards import ProxyGuards
from clawgym_env.proxy.live_stream import Piece, StreamSplitter, StreamStopped, TokenFeed, disconnect_watch
from clawgym_env.proxy.recorder import Recorder
from clawgym_env.proxy.rollout_state import RolloutState
from clawgym_env.records import ModelCall
from clawgym_env.specs import ApiStyle

log = logging.getLogger("clawgym.proxy")

RECORDED_REFUSALS_PAST_CAP = 8  # past max_calls, later refusals are counted in RolloutStats, not logged
DISCONNECTED = "client_disconnected: the harness closed the connection before the generation finished"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}

Send = Callable[..., Awaitable[None]]  # send(data: bytes, last: bool = False)


class ClientDisconnected(Exception):
    """The caller hung up while its call was being generated; carries the partial generation if any."""

    def __init__(self, generation: Generation | None = None) -> None:
        super().__init__("client disconnected")
        self.generation = generation


class RecordFailed(Exception):
    """The call log could not take a generated call: it is not returned, not spliced, and counted."""


@dataclass(slots=True)
class Caller:
    """Whoever sent the call, as far as the pipeline must know: how to notice that they left (an ASGI-style
    `receive` that yields "http.disconnect", or their connection's `lost` future, shared by its calls) and how
    to learn whether the answer reached them (`when_delivered`, for the delivery receipt)."""

    receive: Callable[[], Awaitable[dict[str, Any]]]
    lost: asyncio.Future[None] | None = None
    when_delivered: Callable[[Callable[[bool], None]], None] | None = None


@dataclass(slots=True)
class Answer:
    """What goes back to the caller: a status and body, or a live stream's `pump` that writes its events."""

    status: int
    body: bytes = b""
    media_type: str | None = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    pump: Callable[[Send], Awaitable[None]] | None = None

    @classmethod
    def json(cls, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Answer:
        return cls(status, jsonio.dumps(body), "application/json", headers or {})

    @classmethod
    def error(cls, style: ApiStyle, err: ProxyError) -> Answer:
        return cls.json(err.body(style), err.status)


@dataclass(slots=True)
class CallPlan:
    """What a generation call is about to run: its conversation, rendered prompt and sampling."""

    conversation: Conversation
    rendered: RenderedPrompt
    new_prompt: int  # prompt tokens beyond the previous call's full ids (for the token budget)
    sampling: SamplingParams
    request_id: str


class CallPipeline:
    """One call from request to record and answer (module docstring); one per proxy, shared by its rollouts.

    engine_timeout_s: a generation still running this long is stopped (engine_timeout). live_streaming: a
    `stream: true` call is sent as the engine decodes, else whole at the end. stream_keepalive_s: a live stream
    silent this long gets a keep-alive event. stream_min_gap_s: tokens decoded within this long of the previous
    send go out together (`TokenFeed.min_gap_s`).
    """

    def __init__(
        self,
        recorder: Recorder,
        guards: ProxyGuards,
        *,
        engine_timeout_s: float = 600.0,
        live_streaming: bool = True,
        stream_keepalive_s: float = 10.0,
        stream_min_gap_s: float = 0.05,
    ) -> None:
        self.recorder = recorder
        self.guards = guards
        self.engine_timeout_s = engine_timeout_s
        self.live_streaming = live_streaming
        self.stream_keepalive_s = stream_keepalive_s
        self.stream_min_gap_s = stream_min_gap_s

    # ------------------------------------------------------------------------------ the call
    async def run(
        self,
        state: RolloutState,
        adapter: ApiAdapter,
        body: Callable[[], Awaitable[Any]],
        caller: Caller,
        *,
        in_flight: int,
        received_at: float,
        t0: float,
    ) -> Answer:
        """Admit, parse, generate, record and answer one call. `body()` reads and parses the request body
        (the transport's guards: size and depth); it is not awaited for a call refused before it."""
        rollout_id, limits, stats = state.route.rollout_id, state.limits, state.stats
        past_cap = state.next_index >= limits.max_calls
        if past_cap and state.next_index >= limits.max_calls + RECORDED_REFUSALS_PAST_CAP:
            stats.calls += 1  # counted, not logged: a harness looping past its cap cannot grow the log
            stats.count_error("call_cap")
            return Answer.error(adapter.style, _call_cap(rollout_id, limits.max_calls))
        call = ModelCall(
            rollout_id=rollout_id, call_index=state.take_index(), api_style=adapter.style, request={}, prompt_ids=[]
        )
        call.timings.received_at = received_at
        try:
            # A refusal may come before the body is read: the transport then drops the rest of it.
            if past_cap:
                raise _call_cap(rollout_id, limits.max_calls, request={"_omitted": "call_cap"})
            if in_flight >= self.guards.max_calls_in_flight_per_rollout:
                raise ProxyError(
                    "too_many_in_flight",
                    f"clawgym: rollout {rollout_id} already has {in_flight} calls in flight (the limit is "
                    f"{self.guards.max_calls_in_flight_per_rollout}); wait for one to finish",
                    request={"_omitted": "too_many_in_flight"},
                )
            parsed_body = await body()
            call.request = parsed_body if isinstance(parsed_body, dict) else {"_body": parsed_body}
            request = adapter.parse_request(parsed_body, state.validated)
            call.streamed = adapter.wants_stream(request)
            answer = await self._generate(state, adapter, request, call, caller, t0)
        except Exception as exc:
            answer, _ = self._failed(state, call, t0, exc, adapter.style)
        if answer.pump is None and self.recorder.group is not None:  # fsync=True; a live stream waits itself
            try:
                await self.recorder.durable()
            except OSError as exc:
                self.recorder.failed(state, f"{rollout_id}#{call.call_index} durably", exc)
                message = (
                    f"clawgym proxy could not make this call's record durable ({exc}); its generation is not returned"
                )
                return Answer.json(error_body(adapter.style, "engine_error", message), 500)
        return answer

    def _failed(
        self,
        state: RolloutState,
        call: ModelCall,
        t0: float,
        failure: Exception,
        style: ApiStyle,
        partial: Generation | None = None,
    ) -> tuple[Answer, str | None]:
        """The one place a failure becomes its API error and its record: the answer, and the message a live
        stream ends with (None when the caller is gone). What was generated before the failure is kept."""
        stats = state.stats
        if isinstance(failure, RecordFailed):  # the generated call could not be recorded: nothing to record
            self.recorder.failed(state, f"{call.rollout_id}#{call.call_index}", failure)
            message = f"clawgym proxy could not record this call ({failure}); its generation is not returned"
            return Answer.json(error_body(style, "engine_error", message), 500), message
        message: str | None
        if isinstance(failure, ProxyError):
            call.error, message = f"{failure.kind}: {failure.message}", failure.message
            call.request = failure.request if failure.request is not None else call.request
            _attach_partial(call, failure.generation or partial)
            stats.count_error(failure.kind)
            answer = Answer.error(style, failure)
        elif isinstance(failure, ClientDisconnected):
            call.error, message = DISCONNECTED, None
            _attach_partial(call, failure.generation or partial)
            call.delivered = False
            stats.disconnects += 1
            stats.count_error("client_disconnected")
            answer = Answer(499, media_type=None)
        else:  # a proxy bug
            log.error("proxy failure in %s#%d", call.rollout_id, call.call_index, exc_info=failure)
            call.error = f"internal: {type(failure).__name__}: {failure}"
            message = f"clawgym proxy internal error: {failure}"
            _attach_partial(call, partial)
            stats.count_error("internal")
            answer = Answer.json(error_body(style, "engine_error", message), 500)
        try:
            self._finish_record(state, call, t0)
        except OSError as exc:
            self.recorder.failed(state, f"the failed call {call.rollout_id}#{call.call_index}", exc)
            message = f"clawgym proxy could not record this call ({exc})"
            return Answer.json(error_body(style, "engine_error", message), 500), message
        return answer, message

    def _finish_record(self, state: RolloutState, call: ModelCall, t0: float) -> None:
        call.timings.total_s = time.perf_counter() - t0
        self.recorder.record(state, call)

    async def _generate(
        self,
        state: RolloutState,
        adapter: ApiAdapter,
        request: Any,
        call: ModelCall,
        caller: Caller,
        t0: float,
    ) -> Answer:
        policy, stats = state.policy, state.stats
        renderer = policy.renderer
        _budget_left(state)
        conversation = adapter.to_conversation(request, state.validated)
        rendered = renderer.render(conversation, splice=state.memory.find, resume=state.render_resumes)
        state.keep_resume(rendered)
        stats.resumed_renders += rendered.resumed is not None
        call.prompt_ids, call.segments, call.drift_events = (
            rendered.prompt_ids,
            rendered.segments,
            rendered.drift_events,
        )
        call.control_token_texts = rendered.control_token_texts
        stats.control_token_texts += rendered.control_token_texts
        stats.drift_events += rendered.drift_events
        stats.spliced_turns += rendered.spliced_turns
        call.rewritten_turns, call.prefix = rendered.rewritten_turns, state.check_prefix(call)
        stats.rewritten_turns += rendered.rewritten_turns
        call.timings.render_s = time.perf_counter() - t0

        new_prompt, max_new = self._budget(state, rendered.prompt_ids, adapter.requested_max_tokens(request))
        sampling = SamplingParams(
            max_tokens=max_new, temperature=state.limits.temperature, stop_token_ids=tuple(renderer.stop_token_ids)
        )
        plan = CallPlan(conversation, rendered, new_prompt, sampling, f"{state.route.rollout_id}#{call.call_index}")
        if call.streamed and self.live_streaming:
            return await self._start_live_stream(state, adapter, request, call, caller, t0, plan)
        generation = await self._engine(state, plan, caller)
        parsed = self._account(state, call, plan, generation, t0)
        output = adapter.finish_output(_call_output(state, call, request, parsed, generation))
        headers = {"x-request-id": output.response_id}
        if call.streamed:
            answer = Answer(
                200, b"".join(adapter.stream(output, request)), "text/event-stream", {**SSE_HEADERS, **headers}
            )
        else:
            answer = Answer.json(adapter.response(output, request), headers=headers)
        self._commit(state, call, t0, plan, parsed, caller)
        return answer

    @staticmethod
    def _budget(state: RolloutState, prompt_ids: list[int], requested: int | None) -> tuple[int, int]:
        """(new prompt tokens, the most tokens this call may generate): the policy's context, the rollout's
        token budget (new prompt + generated tokens over the rollout) and the API's max_tokens. Raises
        context_length or token_cap."""
        limits, stats, policy = state.limits, state.stats, state.policy
        room = policy.max_context - len(prompt_ids)
        if room < 1:
            raise ProxyError(
                "context_length",
                f"prompt is too long: {len(prompt_ids)} tokens > {policy.max_context - 1} maximum "
                f"(the policy's context is {policy.max_context} tokens)",
                "messages",
            )
        new_prompt = len(prompt_ids) - common_prefix_length(prompt_ids, state.last_full_ids)
        budget = limits.max_tokens - stats.new_tokens - new_prompt
        if budget < 1:
            raise ProxyError(
                "token_cap",
                f"clawgym: rollout {state.route.rollout_id} would exceed its {limits.max_tokens}-token budget "
                f"({stats.new_tokens} used, {new_prompt} new prompt tokens)",
            )
        return new_prompt, min(limits.max_new_tokens, room, budget, requested or limits.max_new_tokens)

    async def _engine(self, state: RolloutState, plan: CallPlan, caller: Caller) -> Generation:
        """Generate, but stop on engine timeout or when the caller leaves, and free the engine's slot.

        Engines with `abort(request_id)` (TransformersEngine) hand back what they generated so far; it is
        attached to the raised error so the call record keeps it. Other engines are cancelled.
        """
        engine = state.policy.engine
        prompt_ids, request_id = plan.rendered.prompt_ids, plan.request_id
        generation = asyncio.ensure_future(generate(engine, prompt_ids, plan.sampling, request_id))
        watcher = disconnect_watch(caller.receive, caller.lost)
        try:
            done, _ = await asyncio.wait(
                (generation, watcher), timeout=self.engine_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:
            generation.cancel()
            raise
        finally:
            if watcher is not caller.lost:
                watcher.cancel()
        if generation in done:
            try:
                return generation.result()
            except Exception as exc:  # the engine failed: a non-retryable error (see errors.py)
                raise _engine_failed(exc, getattr(exc, "generation", None)) from exc
        partial = await _stop_generation(engine, generation, request_id)
        if watcher in done:
            raise ClientDisconnected(partial)
        raise ProxyError(
            "engine_timeout",
            f"clawgym: the inference engine did not answer within {self.engine_timeout_s:g} s",
            generation=partial,
        )

    def _account(
        self, state: RolloutState, call: ModelCall, plan: CallPlan, generation: Generation, t0: float
    ) -> ParsedOutput:
        """Put a finished generation on the call and the rollout's counters; its parse (text, tool calls)."""
        call.timings.generate_s = time.perf_counter() - t0 - call.timings.render_s
        call.generated_ids, call.logprobs = generation.token_ids, generation.logprobs
        call.finish_reason, call.policy_version = generation.finish_reason, generation.policy_version
        _count_tokens(state, call, plan.new_prompt)
        return state.policy.renderer.parse(generation.token_ids, plan.conversation.tool_names)

    def _commit(
        self, state: RolloutState, call: ModelCall, t0: float, plan: CallPlan, parsed: ParsedOutput, caller: Caller
    ) -> None:
        """Record the call (raises RecordFailed), then let later calls splice it, then ask for a delivery receipt.

        The log line says "not delivered" until a receipt says otherwise; read back before the receipt, the
        call says "not known yet" (None).
        """
        call.delivered = False
        try:
            self._finish_record(state, call, t0)
        except OSError as exc:
            raise RecordFailed(str(exc)) from exc
        state.memory.remember(
            call.call_index,
            plan.rendered.prompt_ids,
            call.generated_ids,
            parsed,
            state.policy.renderer.end_of_turn_id,
            position=plan.rendered.assistant_turns,
        )
        state.completed(call)  # only a recorded generation is what later prompts are compared with
        if caller.when_delivered is not None:
            receipts = state.receipts  # the callback holds this and the call only, not a closed rollout's state
            receipts[call.call_index] = None  # awaited: the call reads back as "not known yet" until then
            caller.when_delivered(lambda delivered: self.recorder.receipt(receipts, call, delivered))

    # ------------------------------------------------------------------------------ live streams
    async def _start_live_stream(
        self,
        state: RolloutState,
        adapter: ApiAdapter,
        request: Any,
        call: ModelCall,
        caller: Caller,
        t0: float,
        plan: CallPlan,
    ) -> Answer:
        """Wait for the engine's first tokens, then answer 200 and stream the rest as it decodes.

        A failure before the first token (engine error, timeout, disconnect) is answered like a non-streamed
        one; after it, an error event ends the stream. Either way the call is recorded with its partial ids.
        """
        loop = asyncio.get_running_loop()
        feed = TokenFeed(
            state.policy.engine,
            plan.rendered.prompt_ids,
            plan.sampling,
            plan.request_id,
            caller.receive,
            loop.time() + self.engine_timeout_s,
            tick_s=self.stream_keepalive_s / 2,
            lost=caller.lost,
            min_gap_s=self.stream_min_gap_s,
        )
        try:
            first = await feed.next()
        except StreamStopped as stopped:
            await feed.aclose()
            raise _stopped_error(stopped, self.engine_timeout_s) from stopped.cause
        except BaseException:
            await feed.aclose()
            raise
        call.timings.first_token_s = time.perf_counter() - t0
        output = adapter.finish_output(_call_output(state, call, request, None, None))
        writer = adapter.events(output, request)
        renderer = state.policy.renderer
        tool_prefix = adapter.tool_call_id_prefix
        splitter = StreamSplitter(renderer.decode, set(renderer.stop_token_ids), lambda: mint_id(tool_prefix))

        async def pump(send: Send) -> None:
            head: list[bytes] = []  # the opening events while they wait to go out with the end
            try:
                head = writer.start()
                if not feed.finished:  # more to come: the first tokens go out now
                    await send(b"".join(head + _write(writer, splitter.feed(first.token_ids if first else []))))
                    head = []
                # else the generation is whole already: nothing can go out early, so the splitter is skipped
                # and the final parse is sent with the opening events, in one write
                last_sent = loop.time()
                while (chunk := await feed.next()) is not None:
                    events = _write(writer, splitter.feed(chunk.token_ids))
                    if not events and self.stream_keepalive_s and loop.time() - last_sent >= self.stream_keepalive_s:
                        events = writer.keepalive()  # text held back (a tool call being generated): say we live
                        state.stats.stream_keepalives += 1
                    if events:
                        await send(b"".join(events))
                        last_sent = loop.time()
                generation = feed.generation()
                parsed = self._account(state, call, plan, generation, t0)
                rest, calls, agrees = splitter.finish(parsed)
                if not agrees:
                    state.stats.stream_mismatches += 1
                    log.warning("%s: the streamed pieces differ from the final parse", plan.request_id)
                final = _call_output(state, call, request, parsed, generation)
                final.response_id, final.tool_calls, final.extra = output.response_id, calls, output.extra
                events = head + _write(writer, rest) + writer.finish(final)
                self._commit(state, call, t0, plan, parsed, caller)
                try:  # fsync=True: the final events wait until the record is on disk
                    await self.recorder.durable()
                except OSError as exc:
                    raise RecordFailed(f"the call log could not be made durable: {exc}") from exc
                await send(b"".join(events), last=True)
            except Exception as exc:
                failure = _stopped_error(exc, self.engine_timeout_s) if isinstance(exc, StreamStopped) else exc
                _, message = self._failed(state, call, t0, failure, adapter.style, partial=feed.generation())
                if message is not None:  # else the caller left: nobody to tell
                    await send(b"".join(head + writer.error(message)), last=True)
            finally:
                await feed.aclose()

        return Answer(
            200, media_type="text/event-stream", headers={**SSE_HEADERS, "x-request-id": output.response_id}, pump=pump
        )

    # ------------------------------------------------------------------------------ in-process calls
    def admit_in_process(self, state: RolloutState, prompt_ids: list[int]) -> InProcessAdmission:
        """The token budget of an in-process call (the white-box loop) about to generate from `prompt_ids`:
        the same context and budget checks as an HTTP call; a refusal is recorded as a failed call."""
        try:
            _budget_left(state)
            _, max_new = self._budget(state, prompt_ids, None)
        except ProxyError as err:
            call = ModelCall(
                rollout_id=state.route.rollout_id,
                call_index=state.take_index(),
                api_style=ApiStyle.IN_PROCESS,
                request={"_omitted": err.kind, "_prompt_tokens": len(prompt_ids)},
                prompt_ids=[],
            )
            call.timings.received_at = time.time()
            self._failed(state, call, time.perf_counter(), err, ApiStyle.IN_PROCESS)
            return InProcessAdmission(refused=f"{err.kind}: {err.message}")
        return InProcessAdmission(max_new_tokens=max_new)

    def record_in_process(self, state: RolloutState, call: ModelCall) -> ModelCall:
        """Record a call an in-process loop made without HTTP: the rollout's next index, the same log, the same
        counters (the token budget included) and the same prefix checks as a harness's HTTP call."""
        call = call.model_copy(
            update={"call_index": state.take_index(), "rollout_id": state.route.rollout_id, "delivered": True}
        )
        call.prefix = state.check_prefix(call)
        new_prompt = len(call.prompt_ids) - common_prefix_length(call.prompt_ids, state.last_full_ids)
        _count_tokens(state, call, new_prompt)
        self.recorder.record(state, call)
        if self.recorder.fsync and self.recorder.log is not None:
            self.recorder.log.sync()  # no answer to hold back here: sync now, as CallLog(fsync=True) would
        if call.generated_ids and call.error is None:
            state.completed(call)  # after the record, as for an HTTP call: its line may refer to the previous one
        return call


def _budget_left(state: RolloutState) -> None:
    """Raise token_cap when the rollout has spent its whole token budget (checked before rendering)."""
    if state.stats.new_tokens >= state.limits.max_tokens:
        raise ProxyError(
            "token_cap", f"clawgym: rollout {state.route.rollout_id} used its {state.limits.max_tokens}-token budget"
        )


def _count_tokens(state: RolloutState, call: ModelCall, new_prompt: int) -> None:
    """A generated call's tokens on the rollout's counters; `new_tokens` is what the token budget spends."""
    stats = state.stats
    state.last_full_ids = call.prompt_ids + call.generated_ids
    stats.completed_calls += 1
    stats.prompt_tokens += len(call.prompt_ids)
    stats.generated_tokens += len(call.generated_ids)
    stats.new_tokens += new_prompt + len(call.generated_ids)


def _call_output(
    state: RolloutState, call: ModelCall, request: Any, parsed: ParsedOutput | None, generation: Generation | None
) -> CallOutput:
    """The answer's summary; without a parse yet (a live stream's start) it holds the ids and sizes only."""
    finish = "stop"
    if parsed is not None and generation is not None:
        finish = "tool_calls" if parsed.tool_calls else ("length" if generation.finish_reason == "length" else "stop")
    return CallOutput(
        model=getattr(request, "model", None) or state.policy.name,
        created=int(call.timings.received_at),
        text=parsed.text if parsed else "",
        reasoning=parsed.reasoning if parsed else None,
        tool_calls=parsed.tool_calls if parsed else [],
        finish=finish,  # type: ignore[arg-type]
        prompt_tokens=len(call.prompt_ids),
        completion_tokens=len(generation.token_ids) if generation else 0,
    )


def _attach_partial(call: ModelCall, generation: Generation | None) -> None:
    """Keep what the engine generated before a failure (finish "abort"), for inspection and accounting."""
    if generation is not None:
        call.generated_ids, call.logprobs = generation.token_ids, generation.logprobs
        call.finish_reason, call.policy_version = "abort", generation.policy_version


async def _stop_generation(engine: Any, generation: asyncio.Future[Generation], request_id: str) -> Generation | None:
    if can_abort(engine) and engine.abort(request_id):
        try:
            return await asyncio.wait_for(asyncio.shield(generation), timeout=5)
        except Exception:
            pass
    generation.cancel()
    return None


def _engine_failed(exc: BaseException, partial: Any) -> ProxyError:
    log.warning("engine failed: %s: %s", type(exc).__name__, exc)
    kind = "engine_timeout" if isinstance(exc, TimeoutError) else "engine_error"
    return ProxyError(
        kind,
        f"clawgym: the inference engine failed: {type(exc).__name__}: {exc}",
        generation=partial if isinstance(partial, Generation) else None,
    )


def _stopped_error(stopped: StreamStopped, timeout_s: float) -> Exception:
    """The error a stopped feed is answered with (before the first token) or recorded as (after it)."""
    if stopped.why == "disconnected":
        return ClientDisconnected(stopped.generation)
    if stopped.why == "timeout":
        return ProxyError(
            "engine_timeout",
            f"clawgym: the inference engine did not answer within {timeout_s:g} s",
            generation=stopped.generation,
        )
    return _engine_failed(stopped.cause, stopped.generation)


def _write(writer: EventWriter, pieces: list[Piece]) -> list[bytes]:
    events: list[bytes] = []
    for kind, value in pieces:
        if kind == "reasoning":
            events += writer.reasoning(value)
        elif kind == "text":
            events += writer.text(value)
        else:
            events += writer.tool_call(value)
    return events


def _call_cap(rollout_id: str, max_calls: int, request: dict[str, Any] | None = None) -> ProxyError:
    return ProxyError(
        "call_cap",
        f"clawgym: rollout {rollout_id} reached its cap of {max_calls} model calls; no more calls are answered "
        "for this rollout",
        request=request,
    )
