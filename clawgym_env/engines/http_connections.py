"""Kept-alive HTTP/1.1 connections to one server: aiohttp's, with no cap, per event loop.

`RemoteEngine` makes one request per model call of every rollout in flight, so a thousand rollouts are a
thousand concurrent requests to one vLLM server, all made from the proxy's process: what the client costs
per call is what the proxy costs per call on the path users train with. aiohttp parses responses in C
(llhttp) and hands out idle connections from a per-host list (O(1) per request, no cap here: one
connection per call in flight). Measured side by side against the httpcore connections (h11 parsing in
Python, our own free list) this replaced: docs/proxy.md, "The engine client on aiohttp".

Why not httpx: its pool (httpcore's) scans every connection and polls every idle socket for each request it
places, and caps a client at 100 connections (`python -m benchmarks.http_pool`).

Failures are aiohttp's exceptions (`aiohttp.ClientError`, timeouts as `aiohttp.ServerTimeoutError`), which
`RemoteEngine` retries or reports. A response not read to its end is not reused (its connection is closed).
A session belongs to the event loop that opened it: keep one `Connections` per loop.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import aiohttp
from yarl import URL


@dataclass(frozen=True)
class Answer:
    """A whole response: its status, body and headers."""

    status: int
    content: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


class Connections:
    """Connections to HTTP servers; `request()` (the whole answer) and `stream()` (read as it comes).

    keepalive_expiry_s: an idle connection is closed after this long (below uvicorn's 5 s, vLLM's server: the
    client closes first, so a request is not sent on a connection the server is closing).
    """

    def __init__(
        self,
        *,
        keepalive_expiry_s: float = 4.0,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 600.0,
        ssl_context: ssl.SSLContext | None = None,  # for https: the system's trusted CAs unless given
    ) -> None:
        connector = aiohttp.TCPConnector(
            limit=0, limit_per_host=0, keepalive_timeout=keepalive_expiry_s, ssl=ssl_context or True
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            cookie_jar=aiohttp.DummyCookieJar(),  # a token server sets none: no per-request cookie work
        )
        self._urls: dict[str, URL] = {}

    def _url(self, url: str) -> URL:
        """Parsed once per distinct URL (yarl's parse is a few µs; a proxy makes every call to the same two)."""
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = URL(url)
        return parsed

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        content: bytes = b"",
        timeout_s: float | None = None,  # the whole request's limit, in place of the connect and read timeouts
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The response with its body still to read (`response.content`); its connection is reused only if the
        body was read to its end."""
        options = {} if timeout_s is None else {"timeout": aiohttp.ClientTimeout(total=timeout_s)}
        async with self._session.request(
            method, self._url(url), headers=headers, data=content or None, **options
        ) as response:
            yield response

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        content: bytes = b"",
        timeout_s: float | None = None,
    ) -> Answer:
        """The whole response (its body read, so its connection goes back for the next call)."""
        async with self.stream(method, url, headers=headers, content=content, timeout_s=timeout_s) as response:
            return Answer(response.status, await response.read(), response.headers)

    async def aclose(self) -> None:
        await self._session.close()

    def abandon(self) -> None:
        """Let go without awaiting: the event loop ended without `aclose()` (an evaluation's Runtime per
        harness), or this object is being collected. The connections are closed (on a closed loop only
        marked closed), so aiohttp does not report an unclosed session."""
        connector = self._session.connector
        if connector is not None and not connector.closed:
            connector._close()  # close()'s synchronous part; its awaitable would need the loop

    def __del__(self) -> None:
        if hasattr(self, "_session"):
            with contextlib.suppress(Exception):
                self.abandon()
