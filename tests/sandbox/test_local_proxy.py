"""The proxy route: a real aiohttp server on a host Unix socket, reached from inside at http://127.0.0.1:<port>."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web

from clawgym_env.interfaces import ProxyEndpoint
from clawgym_env.sandbox.local_backend import LocalSandboxBackend
from tests.sandbox.conftest import make_task

pytestmark = pytest.mark.usefixtures("sandbox_init")  # every test with the C and the Python init

CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("CONNECTED")
except OSError as exc:
    print("REFUSED", exc)
"""


@pytest.fixture
async def unix_proxy(tmp_path: Path):
    """A stand-in serving proxy: echoes method, path, headers and body of each request as JSON."""
    seen: list[dict] = []

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        record = {
            "method": request.method,
            "path": request.path_qs,
            "auth": request.headers.get("Authorization"),
            "body": body.decode(),
        }
        seen.append(record)
        return web.json_response(record)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    socket_path = tmp_path / "proxy" / "proxy.sock"
    socket_path.parent.mkdir()
    site = web.UnixSite(runner, str(socket_path))
    await site.start()
    yield ProxyEndpoint(unix_socket=socket_path), seen
    await runner.cleanup()


async def test_proxy_route_reaches_the_unix_socket(backend: LocalSandboxBackend, unix_proxy) -> None:
    endpoint, seen = unix_proxy
    async with await backend.create(make_task(), proxy=endpoint) as box:
        assert box.proxy_base_url == "http://127.0.0.1:8080"
        url = box.proxy_base_url + "/rollouts/r1/v1/messages?beta=true"
        result = await box.exec(["curl", "-sS", "-X", "POST", "-H", "Authorization: Bearer k1", "-d", '{"hi": 1}', url])
        assert result.exit_code == 0, result.stderr
        reply = json.loads(result.stdout)
        assert reply == {
            "method": "POST",
            "path": "/rollouts/r1/v1/messages?beta=true",
            "auth": "Bearer k1",
            "body": '{"hi": 1}',
        }
        head = await box.exec(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-I", box.proxy_base_url + "/"])
        assert head.stdout == "200"
        assert [r["method"] for r in seen] == ["POST", "HEAD"]
        # the socket's host folder is hidden; only the bound socket is inside
        assert (await box.exec(["ls", "-A", str(endpoint.unix_socket.parent)])).stdout == ""


async def test_relay_handles_concurrent_and_large_requests(backend: LocalSandboxBackend, unix_proxy) -> None:
    endpoint, seen = unix_proxy
    async with await backend.create(make_task(), proxy=endpoint) as box:
        script = (
            "import concurrent.futures, json, sys, urllib.request\n"
            "def call(i):\n"
            "    data = ('x' * 200000 + str(i)).encode()\n"
            "    with urllib.request.urlopen(urllib.request.Request(sys.argv[1] + f'/c/{i}', data=data)) as r:\n"
            "        return json.load(r)['body'][-len(str(i)):] == str(i)\n"
            "with concurrent.futures.ThreadPoolExecutor(8) as pool:\n"
            "    print(all(pool.map(call, range(16))))\n"
        )
        result = await box.exec(["python3", "-c", script, box.proxy_base_url])
        assert result.stdout == "True\n", result.stderr
        assert len(seen) == 16


async def test_only_the_proxy_route_is_reachable(backend: LocalSandboxBackend, unix_proxy) -> None:
    endpoint, _ = unix_proxy
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with await backend.create(make_task(), proxy=endpoint) as box:
            assert (await box.exec(["python3", "-c", CONNECT, "127.0.0.1", "8080"])).stdout.startswith("CONNECTED")
            for host, target in (("127.0.0.1", port), ("1.1.1.1", 443)):
                result = await box.exec(["python3", "-c", CONNECT, host, str(target)])
                assert result.stdout.startswith("REFUSED"), (host, result.stdout)
    finally:
        server.close()
        await server.wait_closed()


async def test_tcp_only_proxy_is_a_clear_error(backend: LocalSandboxBackend) -> None:
    with pytest.raises(ValueError, match="Unix socket"):
        await backend.create(make_task(), proxy=ProxyEndpoint(host="127.0.0.1", port=9000))
