"""The server pool's RPCs survive a kept-alive connection that the server closed under a request.

A vLLM server may close a connection right after an error answer; the pool's next request on it then failed
with a read or protocol error, and a live server was counted lost (seen in CI after a failed broadcast
join). Against a real socket: `ClosingServer`, a named test double of a server's HTTP endpoint, takes the
first request and closes the connection without answering, then answers the next one properly.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from clawgym_env.engines.vllm_server import VLLMServerPool


class ClosingServer:
    """Test double: an HTTP/1.1 endpoint on loopback that hangs up on its first `drop` requests unanswered."""

    def __init__(self, drop: int) -> None:
        self.drop, self.requests = drop, 0
        self.server: asyncio.AbstractServer | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            await reader.readexactly(length)
            self.requests += 1
            if self.requests <= self.drop:
                writer.close()  # the request was sent and read: the connection goes without an answer
                return
            body = json.dumps({"results": [7]}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def test_an_rpc_is_sent_again_when_the_connection_closes_under_it(tmp_path):
    async with ClosingServer(drop=1) as url:
        pool = VLLMServerPool([url], checkpoint_dir=tmp_path)
        try:
            assert await pool._rpc(url, "clawgym_get_policy_version") == [7]
        finally:
            await pool._connections().aclose()  # used from this test's loop, not the pool's own (not `aclose()`)
            pool._engine_loop.close()


async def test_a_server_that_keeps_hanging_up_still_fails_the_rpc(tmp_path):
    async with ClosingServer(drop=10) as url:
        pool = VLLMServerPool([url], checkpoint_dir=tmp_path)
        try:
            with pytest.raises((aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
                await pool._rpc(url, "clawgym_get_policy_version")
        finally:
            await pool._connections().aclose()  # used from this test's loop, not the pool's own (not `aclose()`)
            pool._engine_loop.close()
