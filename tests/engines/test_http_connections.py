"""`http_connections.Connections` against a real uvicorn server on loopback: reuse, and what is never reused."""

from __future__ import annotations

import asyncio

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from clawgym_env.engines.http_connections import Connections
from clawgym_env.engines.vllm_server import free_port


@pytest.fixture
async def server():
    app = FastAPI()
    peers: list[int] = []

    @app.get("/peer")
    async def peer(request: Request) -> dict[str, int]:
        peers.append(request.client.port)
        await asyncio.sleep(0.05)  # long enough for concurrent calls to overlap
        return {"port": request.client.port}

    @app.get("/long")
    async def long(request: Request) -> StreamingResponse:
        peers.append(request.client.port)

        async def body():
            for _ in range(100):
                yield b"x" * 1000

        return StreamingResponse(body())

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", timeout_keep_alive=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    yield f"http://127.0.0.1:{port}", peers
    server.should_exit = True
    await task


async def test_calls_one_after_another_share_one_connection(server):
    url, peers = server
    connections = Connections(url)
    for _ in range(3):
        assert (await connections.request("GET", url + "/peer")).status == 200
    assert len(set(peers)) == 1, peers
    await connections.aclose()


async def test_a_response_not_read_to_the_end_is_not_reused(server):
    url, peers = server
    connections = Connections(url)
    async with connections.stream("GET", url + "/long") as response:
        async for _ in response.aiter_stream():
            break  # leave the rest unread
    assert (await connections.request("GET", url + "/peer")).status == 200
    assert len(set(peers)) == 2, peers  # the second call could not have used the first one's connection
    await connections.aclose()


async def test_a_connection_the_server_closed_while_idle_is_not_reused(server):
    url, peers = server
    connections = Connections(url, keepalive_expiry_s=60)  # our expiry would not catch it: the server's does
    assert (await connections.request("GET", url + "/peer")).status == 200
    await asyncio.sleep(2)  # past the server's 1 s keep-alive: it closed the connection
    assert (await connections.request("GET", url + "/peer")).status == 200
    assert len(set(peers)) == 2
    await connections.aclose()


async def test_concurrent_calls_each_get_a_connection_and_come_back(server):
    url, peers = server
    connections = Connections(url, max_idle=100)
    answers = await asyncio.gather(*(connections.request("GET", url + "/peer") for _ in range(150)))
    assert all(a.status == 200 for a in answers)
    assert len(set(peers)) == 150  # all at once, none waiting for another's connection
    assert len(connections._idle) == 100  # kept up to max_idle, the rest closed
    first = set(peers)
    peers.clear()
    await asyncio.gather(*(connections.request("GET", url + "/peer") for _ in range(100)))
    assert len(set(peers)) == 100 and set(peers) <= first and len(connections._idle) == 100  # those 100, reused
    await connections.aclose()
    assert not connections._idle


def test_the_pool_benchmark_prints_both_clients_side_by_side(capsys):
    """benchmarks/http_pool.py against its own server process: a row per client per level, every answer 200."""
    from benchmarks.http_pool import main

    main(["--levels", "8", "--rounds", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if "µs CPU per request" in line]
    assert len(rows) == 2 and "httpcore pool" in rows[0] and "Connections" in rows[1], rows
