"""`http_connections.Connections` (aiohttp) against a real uvicorn server on loopback: reuse, what is never reused,
and the failures RemoteEngine retries or reports."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from clawgym_env.engines.http_connections import Connections
from clawgym_env.engines.vllm_server import free_port


@pytest.fixture
async def server(request):
    """A server on loopback; its keep-alive is 1 s (the idle-close test waits past it) unless a test asks for
    more with `@pytest.mark.parametrize("server", [seconds], indirect=True)`."""
    keep_alive = getattr(request, "param", 1)
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
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", timeout_keep_alive=keep_alive
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    yield f"http://127.0.0.1:{port}", peers
    server.should_exit = True
    await task


async def test_calls_one_after_another_share_one_connection(server):
    url, peers = server
    connections = Connections()
    for _ in range(3):
        assert (await connections.request("GET", url + "/peer")).status == 200
    assert len(set(peers)) == 1, peers
    await connections.aclose()


async def test_a_response_not_read_to_the_end_is_not_reused(server):
    url, peers = server
    connections = Connections()
    async with connections.stream("GET", url + "/long") as response:
        async for _ in response.content.iter_any():
            break  # leave the rest unread
    assert (await connections.request("GET", url + "/peer")).status == 200
    assert len(set(peers)) == 2, peers  # the second call could not have used the first one's connection
    await connections.aclose()


async def test_a_connection_the_server_closed_while_idle_is_not_reused(server):
    url, peers = server
    connections = Connections(keepalive_expiry_s=60)  # our expiry would not catch it: the server's does
    assert (await connections.request("GET", url + "/peer")).status == 200
    await asyncio.sleep(2)  # past the server's 1 s keep-alive: it closed the connection
    assert (await connections.request("GET", url + "/peer")).status == 200
    assert len(set(peers)) == 2
    await connections.aclose()


# a 30 s keep-alive: on a loaded machine 150 calls can take over 1 s, and a server closing a connection just as
# it is reused resets it (the idle-close test covers that case on purpose)
@pytest.mark.parametrize("server", [30], indirect=True)
async def test_concurrent_calls_each_get_a_connection_and_come_back(server):
    url, peers = server
    connections = Connections()
    answers = await asyncio.gather(*(connections.request("GET", url + "/peer") for _ in range(150)))
    assert all(a.status == 200 for a in answers)
    assert len(set(peers)) == 150  # all at once, none waiting for another's connection (no cap)
    first = set(peers)
    peers.clear()
    await asyncio.gather(*(connections.request("GET", url + "/peer") for _ in range(100)))
    assert len(set(peers)) == 100 and set(peers) <= first  # kept alive and reused, none opened anew
    await connections.aclose()


async def test_a_server_that_never_answers_is_a_read_timeout_and_its_connection_is_dropped():
    """The failures RemoteEngine tells apart (a hung vLLM server: not retried; a refused port: retried) come out
    as aiohttp's exceptions of those kinds, and the hung connection is not kept."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read(65536)  # takes the request, never answers

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    connections = Connections(read_timeout_s=0.2)
    with pytest.raises(aiohttp.SocketTimeoutError):
        await connections.request("GET", f"http://127.0.0.1:{port}/")
    with pytest.raises(aiohttp.SocketTimeoutError):
        await connections.request("GET", f"http://127.0.0.1:{port}/")
    assert len(accepted) == 2  # the second call could not reuse the first one's hung connection
    await connections.aclose()
    listener.close()
    await listener.wait_closed()
    for writer in accepted:
        writer.close()
    refused = Connections()
    with pytest.raises(aiohttp.ClientConnectorError):  # nothing listens there any more
        await refused.request("GET", f"http://127.0.0.1:{port}/")
    await refused.aclose()


async def test_https_goes_through_the_same_backend(tmp_path: Path):
    """A vLLM server behind TLS: refused while its self-signed certificate is not trusted (a connect error,
    so RemoteEngine retries and then reports it), served over one kept-alive connection once it is."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    app = FastAPI()
    peers: list[int] = []

    @app.get("/peer")
    async def peer(request: Request) -> dict[str, int]:
        peers.append(request.client.port)
        return {"port": request.client.port}

    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", ssl_keyfile=key, ssl_certfile=cert
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    url = f"https://127.0.0.1:{port}"
    untrusting = Connections()
    with pytest.raises(aiohttp.ClientConnectorCertificateError, match="CERTIFICATE_VERIFY_FAILED"):
        await untrusting.request("GET", url + "/peer")  # the system's CAs do not know this certificate
    await untrusting.aclose()
    connections = Connections(ssl_context=ssl.create_default_context(cafile=str(cert)))
    for _ in range(2):
        answer = await connections.request("GET", url + "/peer")
        assert answer.status == 200 and b'"port"' in answer.content
    assert len(peers) == 2 and len(set(peers)) == 1  # one TLS connection, kept alive
    await connections.aclose()
    server.should_exit = True
    await task


def test_the_pool_benchmark_prints_both_clients_side_by_side(capsys):
    """benchmarks/http_pool.py against its own server process: a row per client per level, every answer 200."""
    from benchmarks.http_pool import main

    main(["--levels", "8", "--rounds", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if "µs CPU per request" in line]
    assert len(rows) == 2 and "httpcore pool" in rows[0] and "Connections" in rows[1], rows
