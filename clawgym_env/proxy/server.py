"""The serving proxy's HTTP shell: the model endpoint of every harness, one route per rollout.

A FastAPI app served by uvicorn inside the caller's asyncio loop, on a Unix socket (the local sandbox
backend binds it into each sandbox behind a loopback relay) and/or on 127.0.0.1:<port>. Each rollout
gets a private route `/rollouts/<id>` and a secret key. An HTTP call goes:

    authorize (the rollout's key) -> the call pipeline, given this request's body and connection
    -> send its answer (JSON, or server-sent events as the engine decodes) -> delivery receipt

Everything between (caps, parsing, render, engine, record, splicing, failures) is the call pipeline,
`clawgym_env.proxy.pipeline`, which has no HTTP in it. Here live the transport's own guards: the body's size
and JSON depth (read with the rollout's request sharing), and connections and slow clients (`ProxyGuards`,
clawgym_env.proxy.guards). The routes are one table (clawgym_env.proxy.http_routes).
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from clawgym_env.chat.renderers import check_renderer_fits_engine
from clawgym_env.interfaces import InProcessAdmission, Policy, ProxyEndpoint, RolloutLimits, RolloutRoute
from clawgym_env.proxy.apis import ApiAdapter, CountTokensAdapter
from clawgym_env.proxy.errors import ProxyError
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
from clawgym_env.proxy.http_routes import RouteHandlers, json_response, serve, to_response
from clawgym_env.proxy.pipeline import (
    RECORDED_REFUSALS_PAST_CAP,
    Caller,
    CallPipeline,
    ClientDisconnected,
    Recorder,
)
from clawgym_env.proxy.request_sharing import RequestMemory
from clawgym_env.proxy.rollout_state import ROLLOUT_ID_RE, RolloutState, RolloutStats
from clawgym_env.records import ModelCall
from clawgym_env.specs import ApiStyle

__all__ = ["RECORDED_REFUSALS_PAST_CAP", "ServingProxy"]

log = logging.getLogger("clawgym.proxy")

COUNT_TOKENS = CountTokensAdapter()
MAX_UNIX_SOCKET_PATH = 100
LISTEN_BACKLOG = 4096  # connections the kernel queues before accept (capped by net.core.somaxconn)


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside someone else's event loop: it must not take over the process's signal handlers."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


def _header(request: Request, name: bytes) -> str | None:
    """The first value of a header (`name` lower-case, as ASGI gives them), read off the scope: starlette's
    `request.headers.get` builds a mapping and pays an exception for every header a request lacks."""
    for key, value in request.scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


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
        self._unix_socket_arg = unix_socket
        self._port_arg = port
        self.endpoint = ProxyEndpoint(host=host, port=port, public_url=public_url)
        self._rollouts: dict[str, RolloutState] = {}
        self.keep_closed = keep_closed
        self._closed: OrderedDict[str, RolloutStats] = OrderedDict()  # the latest `keep_closed` closed rollouts
        self._closed_keys: dict[str, bytes] = {}  # their keys, so only a closed rollout's own key learns "closed"
        self._in_flight: dict[str, int] = {}  # generation requests being handled, per open rollout
        self.guards = guards or ProxyGuards()
        self._guard_state = GuardState(self.guards)
        self.closed_count = 0  # every rollout ever closed on this proxy (a counter, not a table)
        self.recorder = Recorder(self.log_path, fsync=fsync, stats=self._guard_state.stats)
        self.pipeline = CallPipeline(
            self.recorder,
            self.guards,
            engine_timeout_s=engine_timeout_s,
            live_streaming=live_streaming,
            stream_keepalive_s=stream_keepalive_s,
            stream_min_gap_s=stream_min_gap_s,
        )
        self._server: _EmbeddedServer | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._socket_dir: Path | None = None
        self.asgi = serve(RouteHandlers(self._route_to, self._count_tokens, self._models))  # hot routes + FastAPI
        self.app = self.asgi.app  # the FastAPI app alone (OpenAPI schema, /health)

    # ------------------------------------------------------------------------------- lifecycle
    @property
    def origin(self) -> str:
        """http://host:port of the TCP listener (for SDK clients on this machine)."""
        if self.endpoint.port is None:
            raise RuntimeError("this proxy has no TCP listener; start it with port=0 or a port number")
        return f"http://{self.endpoint.host}:{self.endpoint.port}"

    def base_url(self, route: RolloutRoute) -> str:
        return route.base_url(self.origin)

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
        self.recorder.open()
        sockets = self._bind_sockets()
        config = uvicorn.Config(
            self.asgi,
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

    def _route_to(self, adapter: ApiAdapter) -> Callable[[Request, str], Awaitable[Response]]:
        """The handler of a model-call route of `adapter`'s API."""

        async def handler(request: Request, rollout_id: str) -> Response:
            return await self._generation_call(request, rollout_id, adapter)

        return handler

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
        await self.recorder.close()

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
        self.recorder.open()
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
        self.recorder.forget(rollout_id)
        while len(self._closed) > self.keep_closed:
            forgotten, _ = self._closed.popitem(last=False)
            self._closed_keys.pop(forgotten, None)
        return self.recorder.calls(state)

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

    def admit_in_process(self, rollout_id: str, prompt_ids: list[int]) -> InProcessAdmission:
        """The token budget of an in-process loop's next call (the white-box agent), checked as for an HTTP
        call; a refusal is recorded as a failed call (`CallPipeline.admit_in_process`)."""
        return self.pipeline.admit_in_process(self._open_state(rollout_id), prompt_ids)

    def record_inprocess_call(self, rollout_id: str, call: ModelCall) -> ModelCall:
        """Record a call that an in-process loop made without HTTP, with the same counters, log and prefix
        checks as a harness's call (`CallPipeline.record_in_process`), so `close_rollout` treats both alike."""
        return self.pipeline.record_in_process(self._open_state(rollout_id), call)

    def _open_state(self, rollout_id: str) -> RolloutState:
        state = self._rollouts.get(rollout_id)
        if state is None:
            raise KeyError(f"rollout {rollout_id!r} is not open on this proxy; open it with open_rollout() first")
        return state

    def calls(self, rollout_id: str) -> list[ModelCall]:
        """The calls recorded so far for an open rollout, read back from the log (the caller's own objects)."""
        return self.recorder.calls(self._open_state(rollout_id))

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
    async def _read_body(self, request: Request) -> bytes:
        """The request body, refused (413) past `max_body_bytes` without keeping more than that in memory."""
        limit = self.guards.max_body_bytes
        declared = _header(request, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(int(declared), limit, partial=False)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit, partial=True)
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

    async def _generation_call(self, request: Request, rollout_id: str, adapter: ApiAdapter) -> Response:
        """A generation route: check the key, then run the call pipeline (clawgym_env.proxy.pipeline) with
        this request's body and connection, and send its answer."""
        received_at, t0 = time.time(), time.perf_counter()
        try:
            state = self._authorize(request, rollout_id, adapter.style)
        except ProxyError as err:
            return json_response(err.body(adapter.style), err.status)

        async def body() -> Any:
            try:
                raw = await self._read_body(request)
            except ClientDisconnect:
                raise ClientDisconnected() from None
            return self._parse_json(raw, state.requests)  # held once per rollout (proxy.request_sharing)

        connection = request.scope.get("extensions", {}).get(SCOPE_KEY)
        caller = Caller(
            receive=request.receive,
            lost=connection.lost() if connection is not None else None,
            when_delivered=connection.when_delivered if connection is not None else None,
        )
        in_flight = self._in_flight.get(rollout_id, 0)
        self._in_flight[rollout_id] = in_flight + 1
        try:
            answer = await self.pipeline.run(
                state, adapter, body, caller, in_flight=in_flight, received_at=received_at, t0=t0
            )
        except BaseException:
            self._release(rollout_id)
            raise
        return to_response(answer, on_end=lambda: self._release(rollout_id))  # in flight until sent

    def _release(self, rollout_id: str) -> None:
        left = self._in_flight.get(rollout_id, 1) - 1
        if left > 0:
            self._in_flight[rollout_id] = left
        else:
            self._in_flight.pop(rollout_id, None)

    async def _count_tokens(self, request: Request, rollout_id: str) -> Response:
        try:
            state = self._authorize(request, rollout_id, ApiStyle.ANTHROPIC_MESSAGES)
            body = self._parse_json(await self._read_body(request))
            parsed = COUNT_TOKENS.parse_request(body)
            count = state.policy.renderer.count_tokens(COUNT_TOKENS.to_conversation(parsed))
        except ProxyError as err:
            return json_response(err.body(ApiStyle.ANTHROPIC_MESSAGES), err.status)
        return json_response({"input_tokens": count})

    async def _models(self, request: Request, rollout_id: str) -> Response:
        try:
            state = self._authorize(request, rollout_id, ApiStyle.OPENAI_CHAT)
        except ProxyError as err:
            return json_response(err.body(ApiStyle.OPENAI_CHAT), err.status)
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
        return json_response({"object": "list", "data": [entry], "has_more": False, "first_id": name, "last_id": name})


def _too_large(size: int, limit: int, partial: bool) -> ProxyError:
    """413; `partial`: the body was read only until past the limit, so its size is a lower bound."""
    return ProxyError(
        "request_too_large",
        f"request too large: the body is {'at least ' if partial else ''}{size} bytes; this proxy accepts at most "
        f"{limit} bytes per request (ProxyGuards.max_body_bytes)",
        request={"_omitted": "request_too_large", "_bytes": size},
    )


def _too_deep(limit: int) -> ProxyError:
    return ProxyError(
        "too_deep",
        f"invalid request: the JSON body is nested more than {limit} levels deep (ProxyGuards.max_json_depth)",
    )
