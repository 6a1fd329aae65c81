"""The serving proxy: the model endpoint of every harness, recording every call token-in, token-out.

A FastAPI app served by uvicorn inside the caller's asyncio loop, on a Unix socket (the local sandbox
backend binds it into each sandbox behind a loopback relay) and/or on 127.0.0.1:<port>. Each rollout
gets a private route `/rollouts/<id>` and a secret key. A call goes:

    authorize -> read the body (size limit) -> parse (depth limit; 400 naming the bad field) -> caps
    -> render (splicing earlier generations) -> context check -> engine (timeout, client disconnect)
    -> parse the generation -> record -> remember it for splicing -> respond -> delivery receipt

A non-streamed call's generation is made first and then written out as JSON. A streamed one is sent live
(clawgym_env.proxy.streaming): the 200 and the first events leave with the engine's first tokens, text
deltas and tool calls as they decode, and the final events (stop reason, usage) only after the call is
recorded. Either way the call is appended to the run's CallLog before the answer is complete, so a killed
proxy loses no completed call, and a generation that cannot be recorded is not spliced. What one rollout may cost
the others (body size, nesting, connections, time) is bounded by `ProxyGuards` (clawgym_env.proxy.guards).
Failure responses are chosen on purpose (clawgym_env.proxy.errors, docs/proxy.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import tempfile
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic.json_schema import models_json_schema
from starlette.requests import ClientDisconnect

from clawgym_env.engines.streaming import can_abort, generate
from clawgym_env.interfaces import Generation, Policy, ProxyEndpoint, RolloutLimits, RolloutRoute, SamplingParams
from clawgym_env.proxy import jsonio
from clawgym_env.proxy.apis import (
    AnthropicAdapter,
    ApiAdapter,
    CallOutput,
    ChatAdapter,
    CountTokensAdapter,
    ResponsesAdapter,
)
from clawgym_env.proxy.apis.anthropic import CountTokensRequest, MessagesRequest
from clawgym_env.proxy.apis.base import EventWriter, mint_id
from clawgym_env.proxy.apis.openai_chat import ChatCompletionRequest
from clawgym_env.proxy.apis.openai_responses import ResponsesRequest
from clawgym_env.proxy.conversation import Conversation
from clawgym_env.proxy.durability import GroupCommit
from clawgym_env.proxy.errors import ProxyError, error_body
from clawgym_env.proxy.fastpath import HotRoutes
from clawgym_env.proxy.gcpolicy import freeze_startup_objects
from clawgym_env.proxy.guards import (
    SCOPE_KEY,
    GuardState,
    GuardStats,
    ProxyGuards,
    json_depth,
    protocol_for,
    raise_open_file_limit,
)
from clawgym_env.proxy.renderers import check_renderer_fits_engine
from clawgym_env.proxy.renderers.base import ParsedOutput
from clawgym_env.proxy.request_sharing import RequestMemory
from clawgym_env.proxy.rollouts import ROLLOUT_ID_RE, RolloutState, RolloutStats, common_prefix_length
from clawgym_env.proxy.streaming import Piece, StreamSplitter, StreamStopped, TokenFeed, disconnect_watch
from clawgym_env.records import CallLog, DeliveryReceipt, ModelCall
from clawgym_env.specs import ApiStyle

log = logging.getLogger("clawgym.proxy")

ANTHROPIC, CHAT, RESPONSES = AnthropicAdapter(), ChatAdapter(), ResponsesAdapter()
COUNT_TOKENS = CountTokensAdapter()
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
MAX_UNIX_SOCKET_PATH = 100
LISTEN_BACKLOG = 4096  # connections the kernel queues before accept (capped by net.core.somaxconn)
RECORDED_REFUSALS_PAST_CAP = 8  # past max_calls, later refusals are counted in RolloutStats, not logged


class ClientDisconnected(Exception):
    """The harness hung up while its call was being generated; carries the partial generation if any."""

    def __init__(self, generation: Generation | None = None) -> None:
        super().__init__("client disconnected")
        self.generation = generation


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside someone else's event loop: it must not take over the process's signal handlers."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


def _connection_lost(request: Request) -> asyncio.Future[None] | None:
    """The future done when this request's connection goes (GuardedHttpProtocol.lost), if it came through one."""
    connection = request.scope.get("extensions", {}).get(SCOPE_KEY)
    return connection.lost() if connection is not None else None


def _header(request: Request, name: bytes) -> str | None:
    """The first value of a header (`name` lower-case, as ASGI gives them), read off the scope: starlette's
    `request.headers.get` builds a mapping and pays an exception for every header a request lacks."""
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(content=jsonio.dumps(body), status_code=status, media_type="application/json", headers=headers)


class ServingProxy:
    """The serving proxy; satisfies `interfaces.RolloutProxy`, the part of it that `env.step` uses.

    run_dir: where the run's call log (`calls.jsonl`) goes. unix_socket: "auto" (a fresh private folder),
    a path, or None. port: None (no TCP), 0 (any free port) or a port on `host` (loopback by default).
    keep_closed: how many closed rollouts' `RolloutStats` stay readable (and their routes answer 410); older
    ones are dropped, so a proxy serving millions of rollouts holds nothing per finished rollout beyond this.
    guards: the limits that keep one rollout from costing the others (`ProxyGuards`; defaults fit harnesses).
    live_streaming: a `stream: true` call is sent as the engine decodes (True), or whole at the end (False,
    the behaviour before issue #18; kept for comparison).
    stream_min_gap_s: after a live stream's first tokens, tokens decoded within this long of its previous send
    go out together (`TokenFeed.min_gap_s`): fewer, larger sends per stream; 0 sends every engine chunk.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        unix_socket: str | Path | None = "auto",
        port: int | None = None,
        host: str = "127.0.0.1",
        public_url: str | None = None,
        engine_timeout_s: float = 600.0,
        fsync: bool = False,
        keep_closed: int = 1024,
        guards: ProxyGuards | None = None,
        live_streaming: bool = True,
        stream_keepalive_s: float = 10.0,
        stream_min_gap_s: float = 0.05,
    ) -> None:
        if unix_socket is None and port is None:
            raise ValueError("ServingProxy needs somewhere to listen: a unix_socket path (or 'auto') and/or a port")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.run_dir / "calls.jsonl"
        self._fsync = fsync
        self._unix_socket_arg = unix_socket
        self._port_arg = port
        self.engine_timeout_s = engine_timeout_s
        self.live_streaming = live_streaming
        self.stream_keepalive_s = stream_keepalive_s  # a live stream silent this long gets a keep-alive event
        self.stream_min_gap_s = stream_min_gap_s
        self.endpoint = ProxyEndpoint(host=host, port=port, public_url=public_url)
        self._rollouts: dict[str, RolloutState] = {}
        self.keep_closed = keep_closed
        self._closed: OrderedDict[str, RolloutStats] = OrderedDict()  # the latest `keep_closed` closed rollouts
        self._closed_keys: dict[str, bytes] = {}  # their keys, so only a closed rollout's own key learns "closed"
        self._in_flight: dict[str, int] = {}  # generation requests being handled, per open rollout
        self.guards = guards or ProxyGuards()
        self._guard_state = GuardState(self.guards)
        self.closed_count = 0  # every rollout ever closed on this proxy (a counter, not a table)
        self._log: CallLog | None = None
        self._group: GroupCommit | None = None
        self._server: _EmbeddedServer | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._socket_dir: Path | None = None
        self.app = self._build_app()

    # ------------------------------------------------------------------------------- lifecycle
    @property
    def origin(self) -> str:
        """http://host:port of the TCP listener (for SDK clients on this machine)."""
        if self.endpoint.port is None:
            raise RuntimeError("this proxy has no TCP listener; start it with port=0 or a port number")
        return f"http://{self.endpoint.host}:{self.endpoint.port}"

    def base_url(self, route: RolloutRoute) -> str:
        return route.base_url(self.origin)

    def _open_log(self) -> CallLog:
        if self._log is None:
            # fsync=True: records are synced in groups off the loop before answers go out (GroupCommit)
            self._log = CallLog(self.log_path, fsync=False)
            self._group = GroupCommit(self._log.sync) if self._fsync else None
        return self._log

    def _bind_sockets(self) -> list[socket.socket]:
        sockets: list[socket.socket] = []
        if self._unix_socket_arg is not None:
            if self._unix_socket_arg == "auto":
                self._socket_dir = Path(tempfile.mkdtemp(prefix="clawgym-proxy-"))
                path = self._socket_dir / "proxy.sock"
            else:
                path = Path(self._unix_socket_arg)
                path.parent.mkdir(parents=True, exist_ok=True)
            if len(str(path)) > MAX_UNIX_SOCKET_PATH:
                raise ValueError(
                    f"unix socket path {path} is {len(str(path))} characters; the OS limit is about 107: use a shorter one"
                )
            path.unlink(missing_ok=True)
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            unix.bind(str(path))
            unix.listen(LISTEN_BACKLOG)
            sockets.append(unix)
            self.endpoint.unix_socket = path
        if self._port_arg is not None:
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it
            tcp.bind((self.endpoint.host, self._port_arg))
            tcp.listen(LISTEN_BACKLOG)
            sockets.append(tcp)
            self.endpoint.port = tcp.getsockname()[1]
        for sock in sockets:
            sock.setblocking(False)
        return sockets

    def guard_stats(self) -> GuardStats:
        """What the connection-level guards did so far (timeouts, refused connections, record failures)."""
        return self._guard_state.stats.model_copy()

    async def start(self) -> None:
        if self._serve_task is not None:
            return
        self._guard_state.stats.open_file_limit = raise_open_file_limit()
        freeze_startup_objects()  # full GC passes then skip the imports and tokenizer (clawgym_env.proxy.gcpolicy)
        self._open_log()
        sockets = self._bind_sockets()
        config = uvicorn.Config(
            HotRoutes(self.app, self._hot_routes()),
            lifespan="off",
            access_log=False,
            log_level="warning",
            timeout_graceful_shutdown=2,
            http=protocol_for(self._guard_state),
            timeout_keep_alive=self.guards.idle_timeout_s,  # type: ignore[arg-type]
            proxy_headers=False,  # no X-Forwarded-* rewriting: nothing here reads the client address
        )
        self._server = _EmbeddedServer(config)
        self._serve_task = asyncio.create_task(self._server.serve(sockets=sockets), name="clawgym-proxy")
        while not self._server.started:
            if self._serve_task.done():
                self._serve_task.result()  # raises the startup error
                raise RuntimeError("the proxy's server stopped during startup")
            await asyncio.sleep(0.005)
        log.info("proxy listening: %s", self.endpoint.model_dump(exclude_none=True))

    def _hot_routes(self) -> dict[str, tuple[Any, ApiStyle]]:
        """The generation routes, served past FastAPI's routing (clawgym_env.proxy.fastpath)."""
        return {
            "/v1/chat/completions": (lambda request, rid: self._generation_call(request, rid, CHAT), CHAT.style),
            "/v1/messages": (lambda request, rid: self._generation_call(request, rid, ANTHROPIC), ANTHROPIC.style),
            "/v1/responses": (lambda request, rid: self._generation_call(request, rid, RESPONSES), RESPONSES.style),
            "/v1/messages/count_tokens": (self._count_tokens, ApiStyle.ANTHROPIC_MESSAGES),
        }

    async def stop(self) -> None:
        if self._server is not None and self._serve_task is not None:
            self._server.should_exit = True
            try:
                await asyncio.wait_for(asyncio.shield(self._serve_task), timeout=5)
            except TimeoutError:
                self._server.force_exit = True
                self._serve_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._serve_task
        self._server = self._serve_task = None
        if self.endpoint.unix_socket is not None:
            self.endpoint.unix_socket.unlink(missing_ok=True)
        if self._socket_dir is not None:
            with contextlib.suppress(OSError):
                self._socket_dir.rmdir()
        if self._log is not None:
            if self._group is not None:
                with contextlib.suppress(OSError):
                    await self._group.durable()  # no fsync thread may outlive the files it syncs
            self._log.close()
            self._log = None

    async def __aenter__(self) -> ServingProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -------------------------------------------------------------------------------- rollouts
    def endpoint_for(self, rollout_id: str) -> ProxyEndpoint:
        """Where a rollout's sandbox reaches this proxy: the same endpoint for every rollout (one process)."""
        return self.endpoint

    def open_rollout(self, rollout_id: str, policy: Policy, limits: RolloutLimits | None = None) -> RolloutRoute:
        if not ROLLOUT_ID_RE.match(rollout_id):
            raise ValueError(f"rollout id {rollout_id!r} must be 1-128 characters of letters, digits, '.', '_' or '-'")
        if rollout_id in self._rollouts or rollout_id in self._closed_keys:
            raise ValueError(f"rollout {rollout_id!r} was already opened on this proxy; rollout ids must be unique")
        if policy.renderer is None:
            raise ValueError("policy.renderer is None: pass a renderer, e.g. ChatMLRenderer(load_qwen_tokenizer())")
        check_renderer_fits_engine(policy.renderer, policy.engine)
        route = RolloutRoute(
            rollout_id=rollout_id,
            path_prefix=f"/rollouts/{rollout_id}",
            api_key="sk-clawgym-" + secrets.token_urlsafe(24),
        )
        self._rollouts[rollout_id] = RolloutState(
            route=route, policy=policy, limits=limits or RolloutLimits(), stats=RolloutStats(rollout_id=rollout_id)
        )
        self._open_log()
        return route

    def close_rollout(self, rollout_id: str) -> list[ModelCall]:
        """Close the route (later requests get 410) and return the rollout's calls in call order."""
        state = self._rollouts.pop(rollout_id, None)
        if state is None:
            raise KeyError(f"rollout {rollout_id!r} is not open on this proxy")
        state.closed = True
        state.stats.closed = True
        self.closed_count += 1
        self._closed[rollout_id] = state.stats
        self._closed_keys[rollout_id] = state.route.api_key.encode()
        self._in_flight.pop(rollout_id, None)
        if self._log is not None:
            self._log.forget(rollout_id)  # it kept the rollout's calls for later lines to refer to
        while len(self._closed) > self.keep_closed:
            forgotten, _ = self._closed.popitem(last=False)
            self._closed_keys.pop(forgotten, None)
        return sorted((state.whole(c, in_place=True) for c in state.calls), key=lambda c: c.call_index)

    def stats(self, rollout_id: str) -> RolloutStats:
        """An open rollout's stats, or a closed one's while it is among the latest `keep_closed` closed."""
        state = self._rollouts.get(rollout_id)
        if state is not None:
            return state.stats.model_copy(deep=True)
        if rollout_id in self._closed:
            return self._closed[rollout_id].model_copy(deep=True)
        raise KeyError(
            f"rollout {rollout_id!r} is unknown to this proxy (closed rollouts' stats are kept for the latest "
            f"{self.keep_closed} only: read them right after close_rollout)"
        )

    def report(self) -> dict[str, Any]:
        """What a run's summary shows of the proxy: rollouts closed, the guards' counts, its tables now."""
        return {
            "closed_rollouts": self.closed_count,
            "guards": self.guard_stats().model_dump(),
            "tables": self.table_sizes(),
        }

    def table_sizes(self) -> dict[str, int]:
        """How many entries the proxy's per-rollout tables hold now (for leak checks and monitoring)."""
        return {"open": len(self._rollouts), "closed_stats": len(self._closed)}

    def limits(self, rollout_id: str) -> RolloutLimits:
        """The limits an open rollout runs under (in-process loops enforce them themselves)."""
        return self._open_state(rollout_id).limits

    def record_inprocess_call(self, rollout_id: str, call: ModelCall) -> ModelCall:
        """Record a call that an in-process loop (the white-box agent) made without HTTP.

        It gets the rollout's next call index, goes to the same durable log and counts in the same stats
        as a harness's HTTP call, so `close_rollout` and reconstruction treat both alike.
        """
        state = self._open_state(rollout_id)
        call = call.model_copy(update={"call_index": state.take_index(), "rollout_id": rollout_id, "delivered": True})
        call.prefix = state.check_prefix(call)
        state.stats.completed_calls += 1
        state.stats.prompt_tokens += len(call.prompt_ids)
        state.stats.generated_tokens += len(call.generated_ids)
        self._record(state, call)
        if self._fsync and self._log is not None:
            self._log.sync()  # no answer to hold back here: sync now, as CallLog(fsync=True) would
        if call.generated_ids and call.error is None:
            state.completed(call)  # after the record, as for an HTTP call: its line may refer to the previous one
        return call.model_copy()  # the rollout's own may have its ids folded into a later call's (RolloutState.fold)

    def _open_state(self, rollout_id: str) -> RolloutState:
        state = self._rollouts.get(rollout_id)
        if state is None:
            raise KeyError(f"rollout {rollout_id!r} is not open on this proxy; open it with open_rollout() first")
        return state

    def calls(self, rollout_id: str) -> list[ModelCall]:
        """Copies of the calls recorded so far for an open rollout (the rollout may fold their ids later)."""
        state = self._rollouts[rollout_id]
        return sorted((state.whole(c) for c in state.calls), key=lambda c: c.call_index)

    def _authorize(self, request: Request, rollout_id: str, style: ApiStyle) -> RolloutState:
        """The open rollout whose key was sent. Without that key every route answers the same 401, so a
        caller cannot tell open, closed and unknown rollouts apart; a closed rollout's own key gets 410."""
        key = _header(request, b"x-api-key")
        if key is None:
            auth = _header(request, b"authorization") or ""
            key = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        sent = (key or "").encode()
        state = self._rollouts.get(rollout_id)
        if state is not None and key is not None and secrets.compare_digest(sent, state.route.api_key.encode()):
            return state
        closed_key = self._closed_keys.get(rollout_id)
        if state is None and closed_key is not None and key is not None and secrets.compare_digest(sent, closed_key):
            raise ProxyError("gone", f"rollout {rollout_id!r} is closed")
        raise ProxyError(
            "authentication",
            f"invalid API key for rollout {rollout_id!r}, or no such open rollout on this proxy: send the rollout's "
            "key as x-api-key or Authorization: Bearer, on the route it was issued for",
        )

    # ----------------------------------------------------------------------------------- calls
    def _record(self, state: RolloutState, call: ModelCall) -> None:
        """Append the call to the log (and the rollout's list); raises OSError if the log cannot take it.

        A request the log's writer cannot serialize (nested past its limit) is recorded without it.
        """
        log_ = self._open_log()
        try:
            log_.append(call)
        except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
            call.request = {"_omitted": f"not serializable: {exc}"}
            log_.append(call)
        if self._group is not None:
            self._group.wrote()
        state.calls.append(call)
        if state.closed:  # a call that finished after its rollout closed: the log need not keep it
            log_.forget(call.rollout_id)

    def _receipt(self, call: ModelCall, delivered: bool) -> None:
        call.delivered = delivered
        if self._log is None:
            return  # the proxy stopped; the record keeps delivered=False
        try:
            self._log.append_receipt(
                DeliveryReceipt(rollout_id=call.rollout_id, call_index=call.call_index, delivered=delivered)
            )
        except (OSError, ValueError) as exc:
            log.warning("could not write the delivery receipt of %s#%d: %s", call.rollout_id, call.call_index, exc)

    async def _read_body(self, request: Request) -> bytes:
        """The request body, refused (413) past `max_body_bytes` without keeping more than that in memory."""
        limit = self.guards.max_body_bytes
        declared = _header(request, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(int(declared), limit, partial=False)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(size, limit, partial=True)
            chunks.append(chunk)
        return b"".join(chunks)

    def _parse_json(self, raw: bytes, memory: RequestMemory | None = None) -> Any:
        """The parsed body, refused past `max_json_depth`. With a rollout's `memory`, a JSON object's parts
        that repeat the previous request's are shared with it, and only the new parts are walked for depth."""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            if "depth" in str(exc):
                raise _too_deep(self.guards.max_json_depth) from None
            raise ProxyError("invalid_request", f"invalid request: the body is not valid JSON ({exc})") from None
        parts: list[tuple[Any, int]] = [(body, 1)]
        if memory is not None and isinstance(body, dict):
            body = memory.share(body)
            parts = memory.fresh
        limit = self.guards.max_json_depth
        if raw.count(b"{") + raw.count(b"[") > limit:  # else it cannot nest deeper than the limit
            for part, level in parts:
                if json_depth(part, limit - level + 1) > limit - level + 1:
                    if memory is not None:
                        memory.forget()  # a refused body is no base for the next one
                    raise _too_deep(limit)
        return body

    async def _run_engine(
        self, request: Request, policy: Policy, prompt_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> Generation:
        """Generate, but stop on engine timeout or client disconnect and free the engine's slot.

        Engines with `abort(request_id)` (TransformersEngine) hand back what they generated so far; it is
        attached to the raised error so the call record keeps it. Other engines are cancelled.
        """
        engine = policy.engine
        abortable = can_abort(engine)
        generation = asyncio.ensure_future(generate(engine, prompt_ids, sampling, request_id))
        lost = _connection_lost(request)
        watcher = disconnect_watch(request.receive, lost)
        try:
            done, _ = await asyncio.wait(
                (generation, watcher), timeout=self.engine_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:
            generation.cancel()
            raise
        finally:
            if watcher is not lost:
                watcher.cancel()
        if generation in done:
            try:
                return generation.result()
            except Exception as exc:  # the engine failed: a non-retryable error (see errors.py)
                partial = getattr(exc, "generation", None)
                log.warning("engine failed on %s: %s: %s", request_id, type(exc).__name__, exc)
                kind = "engine_timeout" if isinstance(exc, TimeoutError) else "engine_error"
                err = ProxyError(kind, f"clawgym: the inference engine failed: {type(exc).__name__}: {exc}")
                err.generation = partial if isinstance(partial, Generation) else None  # type: ignore[attr-defined]
                raise err from exc
        partial = await self._stop_generation(engine, generation, request_id, abortable)
        if watcher in done:
            raise ClientDisconnected(partial)
        err = ProxyError(
            "engine_timeout", f"clawgym: the inference engine did not answer within {self.engine_timeout_s:g} s"
        )
        err.generation = partial  # type: ignore[attr-defined]
        raise err

    @staticmethod
    async def _stop_generation(
        engine: Any, generation: asyncio.Future[Generation], request_id: str, can_abort: bool
    ) -> Generation | None:
        if can_abort and engine.abort(request_id):
            try:
                return await asyncio.wait_for(asyncio.shield(generation), timeout=5)
            except Exception:
                pass
        generation.cancel()
        return None

    async def _generation_call(self, request: Request, rollout_id: str, adapter: ApiAdapter) -> Response:
        received_at, t0 = time.time(), time.perf_counter()
        try:
            state = self._authorize(request, rollout_id, adapter.style)
        except ProxyError as err:
            return _json(err.body(adapter.style), err.status)
        in_flight = self._in_flight.get(rollout_id, 0)
        self._in_flight[rollout_id] = in_flight + 1
        response: Response | None = None
        try:
            response = await self._guarded_call(request, state, adapter, received_at, t0, in_flight)
            if self._group is not None and not isinstance(response, LiveResponse):
                response = await self._once_durable(state, adapter, response)
            return response
        finally:
            if isinstance(response, LiveResponse):
                response.on_end = lambda: self._release(rollout_id)  # in flight until the stream ends
            else:
                self._release(rollout_id)

    def _release(self, rollout_id: str) -> None:
        left = self._in_flight.get(rollout_id, 1) - 1
        if left > 0:
            self._in_flight[rollout_id] = left
        else:
            self._in_flight.pop(rollout_id, None)

    async def _once_durable(self, state: RolloutState, adapter: ApiAdapter, response: Response) -> Response:
        """With fsync=True: the answer waits until its record is on disk (one fsync shared by many calls)."""
        assert self._group is not None
        try:
            await self._group.durable()
        except OSError as exc:
            log.error("could not fsync the call log: %s", exc)
            self._guard_state.stats.record_failures += 1
            state.stats.count_error("record_failed")
            message = f"clawgym proxy could not make this call's record durable ({exc}); its generation is not returned"
            return _json(error_body(adapter.style, "engine_error", message), 500)
        return response

    async def _guarded_call(
        self, request: Request, state: RolloutState, adapter: ApiAdapter, received_at: float, t0: float, in_flight: int
    ) -> Response:
        rollout_id, limits, stats = state.route.rollout_id, state.limits, state.stats
        past_cap = state.next_index >= limits.max_calls
        if past_cap and state.next_index >= limits.max_calls + RECORDED_REFUSALS_PAST_CAP:
            stats.calls += 1  # counted, not logged: a harness looping past its cap cannot grow the log
            stats.count_error("call_cap")
            return _json(_call_cap(rollout_id, limits.max_calls).body(adapter.style), 400)
        index = state.take_index()
        call = ModelCall(rollout_id=rollout_id, call_index=index, api_style=adapter.style, request={}, prompt_ids=[])
        call.timings.received_at = received_at
        try:
            # A refusal may come before the body is read: uvicorn then reads the rest of it and drops it (the
            # client gets the answer once it has sent its body), so nothing of it is kept.
            if past_cap:
                call.request = {"_omitted": "call_cap"}
                raise _call_cap(rollout_id, limits.max_calls)
            if in_flight >= self.guards.max_calls_in_flight_per_rollout:
                call.request = {"_omitted": "too_many_in_flight"}
                raise ProxyError(
                    "too_many_in_flight",
                    f"clawgym: rollout {rollout_id} already has {in_flight} calls in flight (the limit is "
                    f"{self.guards.max_calls_in_flight_per_rollout}); wait for one to finish",
                )
            try:
                raw = await self._read_body(request)
            except BodyTooLarge as big:
                call.request = {"_omitted": "request_too_large", "_bytes": big.size}
                raise ProxyError(
                    "request_too_large",
                    f"request too large: the body is {'at least ' if big.partial else ''}{big.size} bytes; this proxy "
                    f"accepts at most {big.limit} bytes per request (ProxyGuards.max_body_bytes)",
                ) from None
            body = self._parse_json(raw, state.requests)  # held once per rollout (proxy.request_sharing)
            call.request = body if isinstance(body, dict) else {"_body": body}
            parsed_request = adapter.parse_request(body, state.validated)
            call.streamed = adapter.wants_stream(parsed_request)
            return await self._generate(request, state, adapter, parsed_request, call, t0)
        except ProxyError as err:
            call.error = f"{err.kind}: {err.message}"
            _attach_partial(call, getattr(err, "generation", None))
            stats.count_error(err.kind)
            return self._answer_failure(state, call, t0, _json(err.body(adapter.style), err.status))
        except (ClientDisconnected, ClientDisconnect) as gone:
            call.error = "client_disconnected: the harness closed the connection before the generation finished"
            _attach_partial(call, getattr(gone, "generation", None))
            call.delivered = False
            stats.disconnects += 1
            stats.count_error("client_disconnected")
            return self._answer_failure(state, call, t0, Response(status_code=499))
        except RecordFailed as failed:
            log.error("could not record %s#%d: %s", rollout_id, index, failed)
            self._guard_state.stats.record_failures += 1
            stats.count_error("record_failed")
            message = f"clawgym proxy could not record this call ({failed}); its generation is not returned"
            return _json(error_body(adapter.style, "engine_error", message), 500)
        except Exception as exc:
            log.exception("proxy failure in %s#%d", rollout_id, index)
            call.error = f"internal: {type(exc).__name__}: {exc}"
            stats.count_error("internal")
            return self._answer_failure(
                state,
                call,
                t0,
                _json(error_body(adapter.style, "engine_error", f"clawgym proxy internal error: {exc}"), 500),
            )

    def _answer_failure(self, state: RolloutState, call: ModelCall, t0: float, response: Response) -> Response:
        """Record a failed call and return its answer; if even that record fails, say so (500) and count it."""
        try:
            self._finish_record(state, call, t0)
        except OSError as exc:
            log.error("could not record the failed call %s#%d: %s", call.rollout_id, call.call_index, exc)
            self._guard_state.stats.record_failures += 1
            state.stats.count_error("record_failed")
            return _json(
                error_body(call.api_style, "engine_error", f"clawgym proxy could not record this call ({exc})"), 500
            )
        return response

    def _finish_record(self, state: RolloutState, call: ModelCall, t0: float) -> None:
        call.timings.total_s = time.perf_counter() - t0
        self._record(state, call)

    async def _generate(
        self,
        request: Request,
        state: RolloutState,
        adapter: ApiAdapter,
        parsed_request: Any,
        call: ModelCall,
        t0: float,
    ) -> Response:
        limits, policy, stats = state.limits, state.policy, state.stats
        renderer = policy.renderer
        if stats.new_tokens >= limits.max_tokens:
            raise ProxyError(
                "token_cap", f"clawgym: rollout {state.route.rollout_id} used its {limits.max_tokens}-token budget"
            )
        conversation = adapter.to_conversation(parsed_request, state.validated)
        rendered = renderer.render(conversation, splice=state.memory.find, resume=state.render_resumes)
        state.keep_resume(rendered)
        stats.resumed_renders += rendered.resumed is not None
        prompt_ids = rendered.prompt_ids
        call.prompt_ids, call.segments, call.drift_events = prompt_ids, rendered.segments, rendered.drift_events
        call.control_token_texts = rendered.control_token_texts
        stats.control_token_texts += rendered.control_token_texts
        stats.drift_events += rendered.drift_events
        stats.spliced_turns += rendered.spliced_turns
        call.rewritten_turns, call.prefix = rendered.rewritten_turns, state.check_prefix(call)
        stats.rewritten_turns += rendered.rewritten_turns
        t_rendered = time.perf_counter()
        call.timings.render_s = t_rendered - t0

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
        requested = adapter.requested_max_tokens(parsed_request)
        max_new = min(limits.max_new_tokens, room, budget, requested or limits.max_new_tokens)
        sampling = SamplingParams(
            max_tokens=max_new, temperature=limits.temperature, stop_token_ids=tuple(renderer.stop_token_ids)
        )
        plan = _CallPlan(conversation, rendered, new_prompt, sampling, f"{state.route.rollout_id}#{call.call_index}")
        if call.streamed and self.live_streaming:
            return await self._start_live_stream(request, state, adapter, parsed_request, call, t0, plan)
        generation = await self._run_engine(request, policy, prompt_ids, sampling, plan.request_id)
        parsed = self._account(state, call, plan, generation, t0)
        output = adapter.finish_output(self._call_output(state, call, parsed_request, parsed, generation))
        headers = {"x-request-id": output.response_id}
        if call.streamed:
            payload = b"".join(adapter.stream(output, parsed_request))
            response: Response = StreamingResponse(
                _one_chunk(payload), media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
            )
        else:
            response = _json(adapter.response(output, parsed_request), headers=headers)
        self._commit(request, state, call, t0, plan, parsed)
        return response

    def _account(
        self, state: RolloutState, call: ModelCall, plan: _CallPlan, generation: Generation, t0: float
    ) -> ParsedOutput:
        """Put a finished generation on the call and the rollout's counters; its parse (text, tool calls)."""
        stats, prompt_ids, gen_ids = state.stats, plan.rendered.prompt_ids, generation.token_ids
        call.timings.generate_s = time.perf_counter() - t0 - call.timings.render_s
        call.generated_ids, call.logprobs = gen_ids, generation.logprobs
        call.finish_reason, call.policy_version = generation.finish_reason, generation.policy_version
        parsed = state.policy.renderer.parse(gen_ids, plan.conversation.tool_names)
        state.last_full_ids = prompt_ids + gen_ids
        stats.completed_calls += 1
        stats.prompt_tokens += len(prompt_ids)
        stats.generated_tokens += len(gen_ids)
        stats.new_tokens += plan.new_prompt + len(gen_ids)
        return parsed

    @staticmethod
    def _call_output(
        state: RolloutState,
        call: ModelCall,
        parsed_request: Any,
        parsed: ParsedOutput | None,
        generation: Generation | None,
    ) -> CallOutput:
        """The answer's summary; without a parse yet (a live stream's start) it holds the ids and sizes only."""
        finish = "stop"
        if parsed is not None and generation is not None:
            finish = (
                "tool_calls" if parsed.tool_calls else ("length" if generation.finish_reason == "length" else "stop")
            )
        return CallOutput(
            model=getattr(parsed_request, "model", None) or state.policy.name,
            created=int(call.timings.received_at),
            text=parsed.text if parsed else "",
            reasoning=parsed.reasoning if parsed else None,
            tool_calls=parsed.tool_calls if parsed else [],
            finish=finish,  # type: ignore[arg-type]
            prompt_tokens=len(call.prompt_ids),
            completion_tokens=len(generation.token_ids) if generation else 0,
        )

    def _commit(
        self, request: Request, state: RolloutState, call: ModelCall, t0: float, plan: _CallPlan, parsed: ParsedOutput
    ) -> None:
        """Record the call (raises RecordFailed), then let later calls splice it, then ask for a delivery receipt.

        The log line says "not delivered" until a receipt says otherwise; in memory it is None until then.
        """
        call.delivered = False
        try:
            self._finish_record(state, call, t0)
        except OSError as exc:
            raise RecordFailed(str(exc)) from exc
        call.delivered = None
        renderer = state.policy.renderer
        state.memory.remember(
            call.call_index,
            plan.rendered.prompt_ids,
            call.generated_ids,
            parsed,
            renderer.end_of_turn_id,
            position=plan.rendered.assistant_turns,
        )
        state.completed(call)  # only a recorded generation is what later prompts are compared with
        connection = request.scope.get("extensions", {}).get(SCOPE_KEY)
        if connection is not None:
            connection.when_delivered(lambda delivered: self._receipt(call, delivered))  # holds the call only

    # ------------------------------------------------------------------------------ live streams
    async def _start_live_stream(
        self,
        request: Request,
        state: RolloutState,
        adapter: ApiAdapter,
        parsed_request: Any,
        call: ModelCall,
        t0: float,
        plan: _CallPlan,
    ) -> Response:
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
            request.receive,
            loop.time() + self.engine_timeout_s,
            tick_s=self.stream_keepalive_s / 2,
            lost=_connection_lost(request),
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
        output = adapter.finish_output(self._call_output(state, call, parsed_request, None, None))
        writer = adapter.events(output, parsed_request)
        renderer = state.policy.renderer
        tool_prefix = adapter.tool_call_id_prefix
        splitter = StreamSplitter(renderer.decode, set(renderer.stop_token_ids), lambda: mint_id(tool_prefix))

        async def pump(send: Callable[[bytes], Awaitable[None]]) -> None:
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
                final = self._call_output(state, call, parsed_request, parsed, generation)
                final.response_id, final.tool_calls, final.extra = output.response_id, calls, output.extra
                events = head + _write(writer, rest) + writer.finish(final)
                self._commit(request, state, call, t0, plan, parsed)
                if self._group is not None:  # fsync=True: the final events wait until the record is on disk
                    try:
                        await self._group.durable()
                    except OSError as exc:
                        raise RecordFailed(f"the call log could not be made durable: {exc}") from exc
                await send(b"".join(events), last=True)
            except StreamStopped as stopped:
                err = _stopped_error(stopped, self.engine_timeout_s)
                if isinstance(err, ProxyError):
                    self._fail_stream(state, call, t0, stopped.generation, err.kind, err.message)
                    await send(b"".join(head + writer.error(err.message)), last=True)
                else:  # the client left: nobody to tell
                    self._fail_stream(state, call, t0, stopped.generation, "client_disconnected", None)
            except RecordFailed as failed:
                log.error("could not record %s: %s", plan.request_id, failed)
                self._guard_state.stats.record_failures += 1
                state.stats.count_error("record_failed")
                message = f"clawgym proxy could not record this call ({failed}); its generation is not returned"
                await send(b"".join(head + writer.error(message)), last=True)
            except Exception as exc:  # a proxy bug mid-stream: record what was generated, end with an error
                log.exception("proxy failure in %s", plan.request_id)
                self._fail_stream(state, call, t0, feed.generation(), "internal", f"{type(exc).__name__}: {exc}")
                await send(b"".join(head + writer.error(f"clawgym proxy internal error: {exc}")), last=True)
            finally:
                await feed.aclose()

        return LiveResponse(pump, headers={**SSE_HEADERS, "x-request-id": output.response_id})

    def _fail_stream(
        self,
        state: RolloutState,
        call: ModelCall,
        t0: float,
        partial: Generation | None,
        kind: str,
        message: str | None,
    ) -> None:
        """Record a live stream that ended early, with the ids generated so far (as a non-streamed call would)."""
        _attach_partial(call, partial)
        if kind == "client_disconnected":
            call.error = "client_disconnected: the harness closed the connection before the generation finished"
            call.delivered = False
            state.stats.disconnects += 1
        else:
            call.error = f"{kind}: {message}"
        state.stats.count_error(kind)
        self._answer_failure(state, call, t0, Response(status_code=499))  # records; a failed record is counted

    async def _count_tokens(self, request: Request, rollout_id: str) -> Response:
        try:
            state = self._authorize(request, rollout_id, ApiStyle.ANTHROPIC_MESSAGES)
            try:
                raw = await self._read_body(request)
            except BodyTooLarge as big:
                message = f"request too large: this proxy accepts at most {big.limit} bytes per request"
                return _json(error_body(ApiStyle.ANTHROPIC_MESSAGES, "request_too_large", message), 413)
            body = self._parse_json(raw)
            parsed = COUNT_TOKENS.parse_request(body)
            count = state.policy.renderer.count_tokens(COUNT_TOKENS.to_conversation(parsed))
        except ProxyError as err:
            return _json(err.body(ApiStyle.ANTHROPIC_MESSAGES), err.status)
        return _json({"input_tokens": count})

    def _models(self, request: Request, rollout_id: str) -> Response:
        try:
            state = self._authorize(request, rollout_id, ApiStyle.OPENAI_CHAT)
        except ProxyError as err:
            return _json(err.body(ApiStyle.OPENAI_CHAT), err.status)
        name = state.policy.name
        entry = {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "clawgym",
            "type": "model",
            "display_name": name,
            "created_at": "1970-01-01T00:00:00Z",
        }
        return _json({"object": "list", "data": [entry], "has_more": False, "first_id": name, "last_id": name})

    # -------------------------------------------------------------------------------------- app
    def _build_app(self) -> FastAPI:
        app = FastAPI(
            title="ClawGym serving proxy",
            description="Anthropic Messages, OpenAI Chat Completions and OpenAI Responses for one policy, per rollout.",
            version="1",
        )
        prefix = "/rollouts/{rollout_id}"

        def body_of(model_name: str) -> dict[str, Any]:
            content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{model_name}"}}}
            return {"requestBody": {"required": True, "content": content}}

        errors = {
            code: {"description": text}
            for code, text in (
                (400, "bad request"),
                (401, "wrong key"),
                (404, "unknown rollout"),
                (410, "closed rollout"),
            )
        }

        @app.post(
            prefix + "/v1/messages", openapi_extra=body_of("MessagesRequest"), responses=errors, tags=["anthropic"]
        )
        async def messages(request: Request, rollout_id: str) -> Response:
            return await self._generation_call(request, rollout_id, ANTHROPIC)

        @app.post(
            prefix + "/v1/messages/count_tokens",
            openapi_extra=body_of("CountTokensRequest"),
            responses=errors,
            tags=["anthropic"],
        )
        async def count_tokens(request: Request, rollout_id: str) -> Response:
            return await self._count_tokens(request, rollout_id)

        @app.post(
            prefix + "/v1/chat/completions",
            openapi_extra=body_of("ChatCompletionRequest"),
            responses=errors,
            tags=["openai"],
        )
        async def chat_completions(request: Request, rollout_id: str) -> Response:
            return await self._generation_call(request, rollout_id, CHAT)

        @app.post(
            prefix + "/v1/responses", openapi_extra=body_of("ResponsesRequest"), responses=errors, tags=["openai"]
        )
        async def responses(request: Request, rollout_id: str) -> Response:
            return await self._generation_call(request, rollout_id, RESPONSES)

        @app.get(prefix + "/v1/models", responses=errors)
        async def models(request: Request, rollout_id: str) -> Response:
            return self._models(request, rollout_id)

        @app.head("/")
        async def head_root() -> Response:
            return Response(status_code=200)

        @app.head(prefix)
        async def head_rollout(rollout_id: str) -> Response:
            return Response(status_code=200)  # Claude Code's preconnect; says nothing about the rollout

        @app.get("/health")
        async def health() -> Response:
            return _json({"status": "ok"})  # counts are for the host (`table_sizes()`), not for sandboxes

        def openapi() -> dict[str, Any]:
            if app.openapi_schema is None:
                from fastapi.openapi.utils import get_openapi

                schema = get_openapi(
                    title=app.title, version=app.version, description=app.description, routes=app.routes
                )
                models = [MessagesRequest, CountTokensRequest, ChatCompletionRequest, ResponsesRequest]
                _, defs = models_json_schema(
                    [(m, "validation") for m in models], ref_template="#/components/schemas/{model}"
                )
                schema.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
                app.openapi_schema = schema
            return app.openapi_schema

        app.openapi = openapi  # type: ignore[method-assign]
        return app


def _attach_partial(call: ModelCall, generation: Generation | None) -> None:
    """Keep what the engine generated before a failure (finish "abort"), for inspection and accounting."""
    if generation is not None:
        call.generated_ids, call.logprobs = generation.token_ids, generation.logprobs
        call.finish_reason, call.policy_version = "abort", generation.policy_version


async def _one_chunk(data: bytes) -> AsyncIterator[bytes]:
    yield data


@dataclass(slots=True)
class _CallPlan:
    """What a generation call is about to run: its conversation, rendered prompt and sampling."""

    conversation: Conversation
    rendered: Any  # the renderer's Rendered (prompt ids, segments, assistant turns)
    new_prompt: int  # prompt tokens beyond the previous call's full ids (for the token budget)
    sampling: SamplingParams
    request_id: str


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


def _stopped_error(stopped: StreamStopped, timeout_s: float) -> Exception:
    """The error a stopped feed is answered with (before the first token) or recorded as (after it)."""
    if stopped.why == "disconnected":
        return ClientDisconnected(stopped.generation)
    if stopped.why == "timeout":
        err = ProxyError("engine_timeout", f"clawgym: the inference engine did not answer within {timeout_s:g} s")
    else:
        exc = stopped.cause
        log.warning("engine failed: %s: %s", type(exc).__name__, exc)
        kind = "engine_timeout" if isinstance(exc, TimeoutError) else "engine_error"
        err = ProxyError(kind, f"clawgym: the inference engine failed: {type(exc).__name__}: {exc}")
    err.generation = stopped.generation  # type: ignore[attr-defined]
    return err


class LiveResponse(Response):
    """An SSE response whose body a coroutine writes while the generation runs (`send(data, last=False)`)."""

    media_type = "text/event-stream"

    def __init__(self, pump: Callable[..., Awaitable[None]], headers: dict[str, str]) -> None:
        super().__init__(content=None, headers=headers, media_type=self.media_type)
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]  # chunked
        self.pump = pump
        self.on_end: Callable[[], None] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        ended = False

        async def write(data: bytes, last: bool = False) -> None:
            nonlocal ended
            ended = ended or last
            await send({"type": "http.response.body", "body": data, "more_body": not last})

        try:
            await self.pump(write)
        finally:
            if self.on_end is not None:
                self.on_end()
            if not ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})


class BodyTooLarge(Exception):
    def __init__(self, size: int, limit: int, partial: bool) -> None:
        super().__init__(f"{size} bytes > {limit}")
        self.size, self.limit = size, limit
        self.partial = partial  # read only until past the limit: the size is a lower bound


class RecordFailed(Exception):
    """The call log could not take a generated call: it is not returned, not spliced, and counted."""


def _call_cap(rollout_id: str, max_calls: int) -> ProxyError:
    return ProxyError(
        "call_cap",
        f"clawgym: rollout {rollout_id} reached its cap of {max_calls} model calls; no more calls are answered for this rollout",
    )


def _too_deep(limit: int) -> ProxyError:
    return ProxyError(
        "too_deep",
        f"invalid request: the JSON body is nested more than {limit} levels deep (ProxyGuards.max_json_depth)",
    )
