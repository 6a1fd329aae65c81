"""What one rollout may cost the others: body size, JSON depth, connections, time, file descriptors.

The proxy serves every rollout of a run from one process, and a policy being trained is an attacker that
searches for whatever raises its reward; a harness can also just misbehave. So each guard bounds what one
caller can take from the shared process:

- `ProxyGuards`: the limits (pydantic, so a bad value fails at start with the field named);
- `GuardedHttpProtocol`: uvicorn's httptools protocol plus header / body / idle deadlines (slowloris and
  silent connections are closed), a cap on connections per sandbox (Unix-socket peers grouped by their PID
  namespace, read from SO_PEERCRED), and a delivery check per response (did the client take it whole?);
  its request cycles write through `HeadWithBody` (a response's head leaves with its first body bytes);
- `raise_open_file_limit`: the soft RLIMIT_NOFILE up to the hard one, so idle sockets cannot run the
  process out of descriptors first;
- `json_depth`: how deeply a parsed body nests (orjson's writer stops at 255 levels, Python's recursion at
  ~1000: a body deeper than that could be generated for but not recorded).

docs/security.md ("Proxy") lists each guard with its red-team test.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import logging
import os
import resource
import socket
import struct
import termios
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from clawgym_env.proxy.head_with_body import HeadWithBody

log = logging.getLogger("clawgym.proxy")

DELIVERY_POLL_S = 0.005
SCOPE_KEY = "clawgym.connection"  # where a request finds its connection (for the delivery check)


class ProxyGuards(BaseModel):
    """Limits that keep one rollout (or one sandbox) from costing the others; defaults fit real harnesses."""

    model_config = ConfigDict(frozen=True)

    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)  # a 32k-token conversation is ~0.2 MB of JSON
    max_json_depth: int = Field(default=64, ge=8)  # real tool schemas nest ~10 deep; the log writer stops at 255
    max_connections_per_peer: int = Field(default=256, ge=1)  # open connections per sandbox (Unix-socket peers)
    max_calls_in_flight_per_rollout: int = Field(default=16, ge=1)  # harnesses make 1-3 at a time
    header_timeout_s: float = Field(default=30.0, gt=0)  # from connect (or first byte) to the end of the headers
    body_timeout_s: float = Field(default=120.0, gt=0)  # from the end of the headers to the end of the body
    idle_timeout_s: float = Field(default=5.0, gt=0)  # a kept-alive connection with no request (uvicorn's default)
    delivery_timeout_s: float = Field(
        default=60.0, gt=0
    )  # how long a reply may take to leave before it counts as not delivered


class GuardStats(BaseModel):
    """Counts of what the connection-level guards did (per proxy; per-call refusals are in RolloutStats)."""

    header_timeouts: int = 0
    body_timeouts: int = 0
    peer_refusals: int = 0  # connections closed at accept: their sandbox already had its share open
    open_file_limit: int = 0  # the soft RLIMIT_NOFILE the proxy runs with
    record_failures: int = 0  # generations that could not be written to the log (answered 500, not spliced)


@dataclass
class GuardState:
    """Shared by every connection of one proxy.

    Header and body deadlines are checked by one sweep over the live connections every `sweep_interval_s`
    (a tenth of the shortest deadline, 20 ms to 1 s), not by a timer per request: arming a deadline is then
    storing a float, and 1,000 kept-alive connections cost one pass a second instead of two timer-heap
    entries per call. A deadline is enforced at most one interval late.
    """

    guards: ProxyGuards
    stats: GuardStats = field(default_factory=GuardStats)
    per_peer: dict[str, int] = field(default_factory=dict)
    live: set[Any] = field(default_factory=set)  # connections with a deadline to watch
    sweep: Any = None  # the pending sweep's TimerHandle, None while no connection is open
    sweep_loop: Any = None  # the loop it is pending on

    @property
    def sweep_interval_s(self) -> float:
        shortest = min(self.guards.header_timeout_s, self.guards.body_timeout_s)
        return min(1.0, max(0.02, shortest / 10))

    def watch(self, connection: Any) -> None:
        self.live.add(connection)
        # a sweep left pending on a loop that was closed (a proxy stopped, then started on another loop) never
        # fires: schedule one on this connection's loop
        if self.sweep is None or self.sweep_loop is not connection.loop:
            self.sweep_loop = connection.loop
            self.sweep = connection.loop.call_later(self.sweep_interval_s, self._sweep, connection.loop)

    def _sweep(self, loop: Any) -> None:
        if loop is not self.sweep_loop:
            return  # superseded by a sweep on the loop now serving
        now = loop.time()
        for connection in [c for c in self.live if c._deadline_at is not None and now >= c._deadline_at]:
            connection._deadline_passed()
        self.sweep = loop.call_later(self.sweep_interval_s, self._sweep, loop) if self.live else None


def raise_open_file_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard limit (no privilege needed); return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def json_depth(value: Any, limit: int) -> int:
    """The nesting depth of a parsed JSON value, counted up to `limit + 1` (enough to refuse it)."""
    depth = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        kind = type(item)
        if kind is dict:
            children = item.values()
        elif kind is list:
            children = item
        else:
            continue
        if level > depth:
            depth = level
            if depth > limit:
                return depth
        for child in children:
            if type(child) is dict or type(child) is list:
                stack.append((child, level + 1))
    return depth


def peer_key(sock: socket.socket | None) -> str | None:
    """Which sandbox a Unix-socket connection comes from: the peer's PID namespace (one per sandbox).

    TCP peers (host-side SDK clients, remote tunnels) return None: they carry no sandbox identity here.
    """
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid, _uid, _gid = struct.unpack(
            "3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        )
    except OSError:
        return None
    if pid <= 0:
        return None
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return f"pid:{pid}"  # the peer exited already, or its namespace is not readable: group by process


def unsent_bytes(sock: socket.socket | None) -> int:
    """Bytes this end wrote that the peer has not taken yet (SIOCOUTQ): for a Unix socket, not yet read by the
    peer process; for TCP, not yet acknowledged by the peer's kernel. 0 if unknown."""
    if sock is None:
        return 0
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, buf, True)  # TIOCOUTQ is SIOCOUTQ's number on Linux
    except OSError:
        return 0
    return buf[0]


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with deadlines, a per-sandbox connection cap and delivery tracking.

    One deadline is armed at a time: headers (from connect, or from the first byte of a kept-alive
    connection's next request), then body (from the end of the headers), none while the app works; between
    requests uvicorn's own keep-alive timer (`idle_timeout_s`) closes the connection.
    """

    guard: GuardState  # set on the subclass each proxy makes (see `protocol_for`)

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline_at: float | None = None  # loop time; checked by the proxy's sweep (GuardState)
        self._deadline_kind = ""
        self._delivery: list[Callable[[bool], None]] = []
        self._delivery_timer: Any = None
        self._delivery_give_up_at = 0.0
        self._lost: asyncio.Future[None] | None = None  # done once the connection is gone (see `lost()`)
        self._peer = peer_key(transport.get_extra_info("socket"))
        if self._peer is not None:
            count = self.guard.per_peer.get(self._peer, 0)
            if count >= self.guard.guards.max_connections_per_peer:
                self._peer = None
                self.guard.stats.peer_refusals += 1
                if self.guard.stats.peer_refusals in (1, 10, 100, 1000) or self.guard.stats.peer_refusals % 10000 == 0:
                    log.warning(
                        "a sandbox holds %d proxy connections; refused %d so far", count, self.guard.stats.peer_refusals
                    )
                transport.abort()
                return
            self.guard.per_peer[self._peer] = count + 1
        self.guard.watch(self)
        self._arm("header", self.guard.guards.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        self.guard.live.discard(self)
        if self._peer is not None:
            left = self.guard.per_peer.get(self._peer, 1) - 1
            if left > 0:
                self.guard.per_peer[self._peer] = left
            else:
                self.guard.per_peer.pop(self._peer, None)
            self._peer = None
        self._settle_delivery(exc is None and self._delivery != [] and self._left_whole_at_close())
        super().connection_lost(exc)

    def lost(self) -> asyncio.Future[None]:
        """A future done once this connection is lost: how a call in progress learns that its client left.

        One per connection, shared by its requests, so watching costs a callback on it rather than a task
        per call awaiting `receive()`. Watchers remove their callbacks; they never cancel it.
        """
        if self._lost is None:
            self._lost = self.loop.create_future()
            if self.transport is None or self.transport.is_closing():
                self._lost.set_result(None)
        return self._lost

    # ----------------------------------------------------------------------------------- deadlines
    def _arm(self, kind: str, seconds: float) -> None:
        self._deadline_kind = kind
        self._deadline_at = self.loop.time() + seconds

    def _disarm(self) -> None:
        self._deadline_at = None

    def _deadline_passed(self) -> None:
        self._deadline_at = None
        if self._deadline_kind == "header":
            self.guard.stats.header_timeouts += 1
        else:
            self.guard.stats.body_timeouts += 1
        if not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._delivery and self._delivery_timer is not None:
            self._delivery_timer.cancel()  # the client speaks again: look at the last reply now
            self._check_delivery(self._delivery_give_up_at)
        if self._deadline_at is None and (self.cycle is None or self.cycle.response_complete):
            self._arm("header", self.guard.guards.header_timeout_s)  # a kept-alive connection starts its next request
        super().data_received(data)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm("body", self.guard.guards.body_timeout_s)
        if self.cycle is not None:
            self.cycle.scope.setdefault("extensions", {})[SCOPE_KEY] = self  # type: ignore[typeddict-unknown-key]
            self.cycle.transport = HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    # ------------------------------------------------------------------------------------ delivery
    def when_delivered(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(True)` once the current response has left whole, or `callback(False)` if the
        connection goes first (or it does not leave within `delivery_timeout_s`)."""
        if self.transport is None or self.transport.is_closing():
            callback(False)
            return
        self._delivery.append(callback)

    def on_response_complete(self) -> None:
        self._disarm()  # a reply sent before the body was read (413) ends the request
        super().on_response_complete()
        if self._delivery:
            self._delivery_give_up_at = self.loop.time() + self.guard.guards.delivery_timeout_s
            self._check_delivery(self._delivery_give_up_at)

    def _left_whole(self) -> bool:
        """Every byte of the reply left this process, and the peer took it (or we close after it anyway)."""
        if self.transport.get_write_buffer_size() != 0:
            return False
        closing_by_us = self.cycle is not None and not self.cycle.keep_alive
        return closing_by_us or unsent_bytes(self.transport.get_extra_info("socket")) == 0

    def _left_whole_at_close(self) -> bool:
        """At a clean close every byte had been handed to the kernel (the peer's end of a small reply cannot be
        told apart from a peer that read it and left; a reply still buffered here, or a reset, is not delivered)."""
        return self.transport.get_write_buffer_size() == 0

    def _check_delivery(self, give_up_at: float) -> None:
        self._delivery_timer = None
        if not self._delivery:
            return
        if self._left_whole():
            self._settle_delivery(True)
        elif self.transport.is_closing() and self.transport.get_write_buffer_size() == 0:
            self._settle_delivery(False)  # closed with bytes still unread by the peer
        elif self.loop.time() > give_up_at:
            self._settle_delivery(False)
        else:
            self._delivery_timer = self.loop.call_later(DELIVERY_POLL_S, self._check_delivery, give_up_at)

    def _settle_delivery(self, delivered: bool) -> None:
        if getattr(self, "_delivery_timer", None) is not None:
            self._delivery_timer.cancel()
            self._delivery_timer = None
        callbacks, self._delivery = getattr(self, "_delivery", []), []
        for callback in callbacks:
            try:
                callback(delivered)
            except Exception:  # a failed receipt must not break the connection's teardown
                log.exception("delivery callback failed")


def protocol_for(state: GuardState) -> type[GuardedHttpProtocol]:
    """A protocol class bound to one proxy's guard state (uvicorn instantiates it per connection)."""
    return type("ProxyHttpProtocol", (GuardedHttpProtocol,), {"guard": state})
