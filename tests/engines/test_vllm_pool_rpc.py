"""The server pool's RPCs survive a kept-alive connection that the server closed under a request.

A vLLM server may close a connection right after an error answer; the pool's next request on it then failed
with a read or protocol error, and a live server was counted lost (seen in CI after a failed broadcast
join). Against a real socket: `ClosingServer`, a named test double of a server's HTTP endpoint, takes the
first request and closes the connection without answering, then answers the next one properly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import pytest
import uvicorn

from clawgym_env.engines.server_boot import BootIdMiddleware
from clawgym_env.engines.token_server import make_token_server
from clawgym_env.engines.vllm_server import ServerChanged, ServerUnavailable, VLLMServerPool
from clawgym_env.interfaces import Generation, SamplingParams


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


class SlowEngine:
    """Test double of an engine behind the token server stand-in: two fixed tokens after `delay_s`, at a
    policy version the test sets (what the stand-in's version RPC answers)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.policy_version = 0
        self.started = 0  # generations begun (a test waits for its calls to be generating)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        self.started += 1
        await asyncio.sleep(self.delay_s)
        return Generation(token_ids=[5, 6], logprobs=[-0.5, -0.25], finish_reason="length")

    async def until_started(self, n: int) -> None:
        while self.started < n:
            await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def stand_in(engine: SlowEngine, boot_id: str | None = None):
    """The token server stand-in on a free loopback port: (its URL, counts of the pool's version RPCs and of
    the most at once (each takes 5 ms here, so RPCs sent together overlap), the `BootIdMiddleware` in front,
    if any).
    With `boot_id` its answers name that server life as `VLLMServer`'s do; a test changes the middleware's
    `boot_id` to play a restart."""
    app = make_token_server(engine)  # type: ignore[arg-type]
    counts = {"version_rpcs": 0, "in_flight": 0, "most_at_once": 0}

    @app.middleware("http")
    async def count(request, call_next):
        if request.url.path != "/collective_rpc":
            return await call_next(request)
        counts["version_rpcs"] += 1
        counts["in_flight"] += 1
        counts["most_at_once"] = max(counts["most_at_once"], counts["in_flight"])
        try:
            await asyncio.sleep(0.005)
            return await call_next(request)
        finally:
            counts["in_flight"] -= 1

    boot = BootIdMiddleware(app, boot_id) if boot_id else None  # none: a server that names no life
    server = uvicorn.Server(uvicorn.Config(boot or app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", counts, boot
    finally:
        server.should_exit = True
        await task


async def test_calls_checking_one_server_at_once_share_its_version_rpcs(tmp_path):
    """A server that names no server life: every call checks its version before and after generating; 64
    calls at once used to send 128 RPCs (each a pass through vLLM's engine loop), all at once. Now the calls
    that check at once share one sent after they asked: never two out at once, far fewer in all (how many
    depends on how spread the calls arrive, so the bound is loose), and every call still gets its version."""
    engine = SlowEngine(delay_s=0.2)
    async with stand_in(engine) as (url, counts, _):
        pool = VLLMServerPool([url], checkpoint_dir=tmp_path)
        try:
            gens = await asyncio.gather(*(pool.generate([1, 2, i], SamplingParams(max_tokens=2)) for i in range(64)))
            assert [g.token_ids for g in gens] == [[5, 6]] * 64 and {g.policy_version for g in gens} == {0}
            assert counts["most_at_once"] == 1 and counts["version_rpcs"] <= 64, counts  # 128 when each sent two
            assert pool.stats.failed_calls == 0
        finally:
            await pool.aclose()


async def test_a_version_change_during_calls_still_fails_every_one_of_them(tmp_path):
    """The check after a call must read the version after the call generated, shared or not: a server whose
    version changes while 16 calls generate (a restart, a reload) fails all 16, and the server is lost."""
    engine = SlowEngine(delay_s=1.0)  # long enough that none ends before the last has begun, even under load
    async with stand_in(engine) as (url, _, _):
        pool = VLLMServerPool([url], checkpoint_dir=tmp_path)
        try:
            calls = [asyncio.create_task(pool.generate([1, i], SamplingParams(max_tokens=2))) for i in range(16)]
            await engine.until_started(16)  # all generating, each past its check before
            engine.policy_version = 1
            results = await asyncio.gather(*calls, return_exceptions=True)
            assert all(isinstance(r, ServerUnavailable) and "0 -> 1" in str(r) for r in results), results
            assert pool.stats.failed_calls == 16 and not pool.slots[0].alive
        finally:
            await pool.aclose()


async def test_a_server_naming_its_life_is_asked_its_version_once_per_life(tmp_path):
    """With `BootIdMiddleware` (as `VLLMServer` starts vLLM) the version read once stands while the answers come
    from the same server life: 64 calls at once, then 32 one by one, send at most three RPCs in all, not 192
    (the first read; one for the calls that came while it was out; one more for any that came in the moment
    between its answer and its caller noting the life)."""
    engine = SlowEngine(delay_s=0.05)
    async with stand_in(engine, boot_id="life-1") as (url, counts, _):
        pool = VLLMServerPool([url], checkpoint_dir=tmp_path)
        try:
            await asyncio.gather(*(pool.generate([1, 2, i], SamplingParams(max_tokens=2)) for i in range(64)))
            for i in range(32):
                gen = await pool.generate([3, i], SamplingParams(max_tokens=2))
                assert gen.policy_version == 0
            assert counts["version_rpcs"] <= 3, counts
            assert pool.stats.failed_calls == 0 and pool.slots[0].life == ("life-1", 0)
        finally:
            await pool.aclose()


async def test_a_restart_between_calls_fails_the_next_call_and_the_server_comes_back(tmp_path):
    """A server that restarted (another life id, its version read anew) fails the first call it answers, as
    a version change under a call does; the pool takes it back once it has read the new life's version."""
    engine = SlowEngine(delay_s=0.01)
    async with stand_in(engine, boot_id="life-1") as (url, counts, boot):
        pool = VLLMServerPool([url], checkpoint_dir=tmp_path)
        try:
            await pool.generate([1, 2], SamplingParams(max_tokens=2))
            boot.boot_id = b"life-2"  # restarted
            with pytest.raises(ServerChanged, match="another server life"):
                await pool.generate([1, 2, 5, 6, 9], SamplingParams(max_tokens=2))  # the rollout's next turn
            assert pool.stats.failed_calls == 1 and pool.stats.servers_lost == 1 and not pool.slots[0].alive
            rpcs = counts["version_rpcs"]
            gen = await pool.generate([7, 7], SamplingParams(max_tokens=2))  # a new rollout: the server revived
            assert gen.token_ids == [5, 6] and pool.stats.servers_revived == 1
            assert pool.slots[0].life == ("life-2", 0) and counts["version_rpcs"] == rpcs + 1
        finally:
            await pool.aclose()


async def test_a_version_read_anew_in_the_same_life_during_a_call_fails_that_call(tmp_path):
    """The same life is not enough: if the pool read a newer version of it while the call generated (it loaded
    weights, e.g. a call that began as a revive raced an update), the call's output spans two policies."""
    engine = SlowEngine(delay_s=0.3)
    async with stand_in(engine, boot_id="life-1") as (url, _, _):
        pool = VLLMServerPool([url], checkpoint_dir=tmp_path)
        try:
            await pool.generate([1], SamplingParams(max_tokens=2))
            call = asyncio.create_task(pool.generate([2], SamplingParams(max_tokens=2)))
            await engine.until_started(2)  # generating at version 0
            engine.policy_version = 1
            pool.slots[0].life = ("life-1", 1)  # what the pool holds after loading version 1 and reading it back
            with pytest.raises(ServerChanged, match="0 -> 1"):
                await call
        finally:
            await pool.aclose()
