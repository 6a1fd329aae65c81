"""Kept-alive HTTP/1.1 connections to one server, handed out from a free list: O(1) per call.

`RemoteEngine` makes one request per model call of every rollout in flight, so a thousand rollouts are a
thousand concurrent requests to one vLLM server. httpcore's own pool (and httpx's, built on it) scans every
connection, and polls every idle socket, for every request it places: measured here, 100 concurrent
requests over 100 kept-alive connections took ~1.0 s of CPU (the server answered them in 10 ms), and httpx
capped a client at 100 connections, so the 101st call waited. This keeps httpcore's connection (HTTP/1.1
parsing, timeouts, TLS) and replaces only the pool: take the most recently used idle connection (checking
that one socket only), or open a new one; give it back once its response was read to the end. Measured the
same way: 22 ms for the 100 requests, and 512 concurrent ones in 0.13 s.

Connections belong to the event loop that opened them: keep one `Connections` per loop.

Their sockets are asyncio streams (`AsyncioBackend`), not anyio's (httpcore's default under asyncio): anyio
opens a cancel scope and asks sniffio which event loop runs (`asyncio.current_task()`) for every read and
write. Measured side by side (benchmarks/remote_stream.py, idle): 0.70-0.73 → 0.55-0.62 ms of CPU per
21-token streamed call, 1.76-1.93 → 1.61-1.77 ms per 201-token call (docs/engines.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpcore

SocketOption = tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]


# httpcore's names for a stream's details -> asyncio's names for the transport's
_EXTRA_INFO = {"ssl_object": "ssl_object", "client_addr": "sockname", "server_addr": "peername", "socket": "socket"}


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection's socket as an asyncio stream, failures raised as httpcore's exceptions."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(f"no data within {timeout} s") from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(f"could not write within {timeout} s") from exc
        except (OSError, RuntimeError) as exc:  # RuntimeError: written after the transport closed
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"TLS handshake not done within {timeout} s") from exc
        except (OSError, ssl.SSLError) as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # asked of an idle connection: has the server closed it (or sent anything)?
            if self._reader.at_eof() or self._writer.is_closing() or self._reader.exception() is not None:
                return True
            return _readable(self._writer.get_extra_info("socket"))  # bytes or a FIN the loop has not read yet
        return self._writer.get_extra_info(_EXTRA_INFO[info]) if info in _EXTRA_INFO else None


def _readable(sock: Any) -> bool:
    fd = sock.fileno() if sock is not None else -1
    if fd < 0:
        return True  # no socket any more: as good as closed
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return bool(poll.poll(0))


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend on plain asyncio streams (httpcore's own, under asyncio, is anyio's); TCP
    only (`Connections` opens nothing else)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        local = (local_address, 0) if local_address else None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, local_addr=local)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"not connected within {timeout} s") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        for option in socket_options or ():
            writer.get_extra_info("socket").setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


BACKEND = AsyncioBackend()


class Connections:
    """Connections to the origin of `base_url`; `stream()` and `request()` as httpcore's, without a cap."""

    def __init__(
        self,
        base_url: str,
        keepalive_expiry_s: float = 4.0,
        max_idle: int = 1024,
        ssl_context: ssl.SSLContext | None = None,  # for https: the system's trusted CAs unless given
    ) -> None:
        url = httpcore.URL(base_url)
        self.origin = url.origin
        self.keepalive_expiry_s = keepalive_expiry_s  # below uvicorn's 5 s (vLLM's server): we close first
        self.max_idle = max_idle
        self._idle: deque[httpcore.AsyncHTTPConnection] = deque()
        self._ssl = ssl_context or (ssl.create_default_context() if self.origin.scheme == b"https" else None)

    def _take(self) -> httpcore.AsyncHTTPConnection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.has_expired():  # idle too long, or the server closed it
                return connection
        return httpcore.AsyncHTTPConnection(
            origin=self.origin, ssl_context=self._ssl, keepalive_expiry=self.keepalive_expiry_s, network_backend=BACKEND
        )

    async def _give_back(self, connection: httpcore.AsyncHTTPConnection) -> None:
        if connection.is_idle() and len(self._idle) < self.max_idle:
            self._idle.append(connection)
        else:  # its response was not read to the end, or enough are idle already
            await connection.aclose()

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, **kwargs: Any) -> AsyncIterator[httpcore.Response]:
        connection = self._take()
        try:
            async with connection.stream(method, url, **kwargs) as response:
                yield response
        except BaseException:
            with contextlib.suppress(BaseException):  # a broken or cancelled call: its connection is not reused
                await connection.aclose()
            raise
        await self._give_back(connection)

    async def request(self, method: str, url: str, **kwargs: Any) -> httpcore.Response:
        """The whole response (its body read)."""
        async with self.stream(method, url, **kwargs) as response:
            await response.aread()
        return response

    async def aclose(self) -> None:
        while self._idle:
            await self._idle.pop().aclose()
