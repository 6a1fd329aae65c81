"""Many concurrent streaming rollouts against one proxy process, its client in other processes.

    .venv/bin/python -m benchmarks.proxy_load                      # N = 1, 64, 1000; calls/s proxy vs direct
    .venv/bin/python -m benchmarks.proxy_load --levels 1000 --rounds 3 --clients 2
    .venv/bin/python -m benchmarks.proxy_load --levels 64 --chunk-tokens 1 --token-delay-ms 5   # streamed tokens
    .venv/bin/python -m benchmarks.proxy_load --levels 64 --remote --chunk-tokens 1   # ... read from a vLLM-style server
    .venv/bin/python -m benchmarks.proxy_load --levels 1,64 --pool    # ... through VLLMServerPool (engine=vllm_server)
    .venv/bin/python -m benchmarks.proxy_load --levels 1000 --pool 2  # ... over 2 servers (rows count the next
                                                                      # turns sent to the server holding them)

Three kinds of process, so the numbers say what the proxy costs and not what its client costs:

- the proxy process (`serve`): a `ServingProxy` on 127.0.0.1 serving a `FastTestEngine` (a named test
  double: pre-tokenized scripted completions, no decode, no history, so the engine costs microseconds and
  the proxy is what is measured). It opens routes on request, watches its own event loop's lag, and runs
  the direct baseline: the very prompt ids the proxy rendered, replayed into the same engine object with
  the same concurrency, in the same process;
- client processes (`client`): each rollout is one keep-alive connection to its own route and key (so no
  per-rollout or per-peer guard is shared between rollouts), making `--calls` streamed Chat Completions
  calls of an append-only tool-calling conversation (a ~2 kB system prompt, 4 tools); the SSE body is read
  chunk by chunk and parsed event by event as an SDK would, so the driver keeps working when the proxy
  streams deltas as they are generated; each call's latency is to the end of its stream;
- the ceiling (`BareServer`, in the proxy process): the proxy's own uvicorn set-up serving an app that only
  reads each request and answers the bytes the proxy answered earlier, driven by the same client. Its calls
  per CPU-second bound what any proxy on this HTTP stack could reach here, so the gap to it is the proxy's own
  work (rendering, parsing, recording), not the server or the client;
- this driver: spawns both, sends commands on the proxy's stdin, and prints one row per level.

Added latency = the client's latency through the proxy - the engine's own latency called directly, at the
same concurrency (median and p99). At N = 1000 both are mostly queueing (Little's law: N / calls per s).

`--chunk-tokens K` makes the double stream K ids per chunk (`--token-delay-ms` apart), as a decoder does;
`--remote` puts it behind the vLLM token API (`token_server`) in a process of its own, reached by a
`RemoteEngine`: the path users train with, the GPU taken out; `--pool [N]` reaches it through a
`VLLMServerPool` over N such processes instead (`engine=vllm_server`: sticky routing, the policy version read
once per server life, which the stand-in's answers name as vLLM's do under `VLLMServerPool`; its rows count
the calls the pool sent to the server holding the context they continue). Per proxy CPU-second the rows give
calls and generated tokens. The direct baseline reads each call as the proxy does (`stream_tokens`: the engine's own
stream, with its pacing, where it has one), so the added latency is the proxy's alone in every mode.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import orjson

# The workload of benchmarks.proxy_bench (a tool-calling agent chat), so the two measure the same calls.
from benchmarks.headline import emit
from benchmarks.proxy_bench import COMPLETIONS, SYSTEM, TOOLS, message_from_events

T = TypeVar("T")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_on(main: Coroutine[Any, Any, T], loop: str = "uvloop") -> T:
    """Run `main` on an event loop of its own: uvloop's when asked and installed, asyncio's otherwise.

    The process-wide event loop policy is left alone: a test suite that calls a benchmark's `main` keeps
    asyncio for every later test (uvloop's pipe transports once closed other rollouts' files,
    `clawgym_env/sandbox/pipes.py`)."""
    factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    if loop == "uvloop":
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:
            pass
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


# ------------------------------------------------------------------------------------------ proxy process
class FastTestEngine:
    """Test double of an inference engine: replays pre-tokenized completions in turn, in microseconds.

    Unlike ScriptedTestEngine it neither decodes the prompt nor keeps any history (a load run would grow
    it without bound); `delay_s` paces a call like a decoder taking that long.
    """

    def __init__(self, tokenizer: Any, completions: list[str], delay_s: float = 0.0) -> None:
        self.tokenizer = tokenizer
        stop = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        self._ids = [list(tokenizer.encode(c, add_special_tokens=False)) + [stop] for c in completions]
        self._turn = 0
        self.delay_s = delay_s
        self.policy_version = 0

    async def generate(self, prompt_ids: list[int], sampling: Any) -> Any:
        from clawgym_env.interfaces import Generation

        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self._turn += 1
        ids = self._ids[self._turn % len(self._ids)][: sampling.max_tokens]
        finish = "stop" if len(ids) == len(self._ids[self._turn % len(self._ids)]) else "length"
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish, policy_version=0)

    def update_weights(self, state_dict: Any, version: int) -> None:
        self.policy_version = version


class StreamingFastTestEngine(FastTestEngine):
    """FastTestEngine with a `stream()` that yields each completion `chunk_tokens` ids at a time, `token_delay_s`
    apart (0: one event-loop turn), as a decoder streaming per step does (vLLM: a chunk per token per step)."""

    def __init__(self, tokenizer: Any, completions: list[str], chunk_tokens: int = 1, token_delay_s: float = 0.0):
        super().__init__(tokenizer, completions)
        self.chunk_tokens, self.token_delay_s = chunk_tokens, token_delay_s

    async def stream(self, prompt_ids: list[int], sampling: Any, *, request_id: str | None = None) -> Any:
        from clawgym_env.interfaces import TokenChunk

        generation = await self.generate(prompt_ids, sampling)
        ids, step = generation.token_ids, self.chunk_tokens
        for start in range(0, len(ids), step):
            await asyncio.sleep(self.token_delay_s * step)
            last = start + step >= len(ids)
            yield TokenChunk(
                ids[start : start + step],
                [0.0] * len(ids[start : start + step]),
                generation.finish_reason if last else None,
            )


class LoopLag:
    """How late a timer that should fire every `interval_s` fires: the event loop's lag, sampled; and how
    long the garbage collector's passes took (each one stops the loop)."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s, self.samples = interval_s, []
        self.gc_pauses: list[tuple[int, float]] = []
        self._gc_start = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_pauses.append((info["generation"], time.perf_counter() - self._gc_start))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval_s)
            self.samples.append(loop.time() - start - self.interval_s)

    def take(self) -> dict[str, float]:
        samples, self.samples = self.samples, []
        ms = [1e3 * max(s, 0.0) for s in samples]
        pauses, self.gc_pauses = self.gc_pauses, []
        full = [1e3 * d for g, d in pauses if g == 2]
        return {
            "lag_p50_ms": pct(ms, 0.5),
            "lag_p99_ms": pct(ms, 0.99),
            "lag_max_ms": max(ms, default=float("nan")),
            "gc_ms_total": 1e3 * sum(d for _, d in pauses),
            "gc_full_passes": len(full),
            "gc_full_max_ms": max(full, default=0.0),
        }


async def direct_baseline(engine: Any, prompts: list[list[int]], n: int, sampling: Any) -> dict[str, Any]:
    """The same prompt ids straight into the engine, `n` at a time: what the proxy's callers would wait without it.

    Each call goes through `stream_tokens` and is read to its end, as the proxy reads a streamed call: the
    engine's own `stream()` where it has one (the streaming modes, `--remote`), else `generate()`. (Baseline
    and proxy on different engine calls made the added latency negative in `--remote` mode: RemoteEngine's
    `generate()`, retried through tenacity and answered with the prompt's ids, costs more than its stream.)
    """
    from clawgym_env.engines.token_stream import stream_tokens

    queue = list(prompts)
    latencies: list[float] = []

    async def worker() -> None:
        while queue:
            prompt = queue.pop()
            start = time.perf_counter()
            async for _ in stream_tokens(engine, prompt, sampling):
                pass
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(n)))
    return {"calls": len(latencies), "latencies": latencies, "wall_s": time.perf_counter() - start}


def next_turn(messages: list[dict[str, Any]], events: list[bytes]) -> None:
    """The client's side of the conversation: the answer (from its SSE payloads), then tool results for its
    tool calls, or a user message when it made none."""
    message = message_from_events(events)
    messages.append(message)
    for call in message.get("tool_calls") or ():
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "a.txt b.txt c.txt"})
    if not message.get("tool_calls"):
        messages.append({"role": "user", "content": "go on"})


class BareServer:
    """The ceiling: the proxy's own uvicorn set-up (same protocol class, guards included, same loop) serving an
    ASGI app that reads the request body and answers with bytes the proxy sent earlier, in one `send`.

    It renders, generates and records nothing, so its calls per CPU-second bound what any proxy on this HTTP
    stack can reach on this machine with this client; the answers are the real proxy's captured SSE bodies
    (one per turn of a rollout), so the client parses the same events and sends the same next requests."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers
        self.served = 0
        self.server: Any = None
        self._task: asyncio.Task[None] | None = None
        self.port = 0

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:  # the whole request body, as the proxy reads it
            message = await receive()
            more = message.get("more_body", False)
        body = self.answers[self.served % len(self.answers)]
        self.served += 1
        headers = [(b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def start(self) -> None:
        import uvicorn

        from clawgym_env.proxy.guards import GuardState, ProxyGuards, protocol_for

        config = uvicorn.Config(
            self.app,
            interface="asgi3",
            host="127.0.0.1",
            port=0,
            lifespan="off",
            access_log=False,
            log_level="warning",
            http=protocol_for(GuardState(ProxyGuards())),
        )
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self._task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            await asyncio.sleep(0.005)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.server.should_exit = True
        await self._task


async def capture_answers(port: int, proxy: Any, policy: Any, calls: int) -> list[bytes]:
    """One rollout of the client's conversation through the real proxy: the raw SSE body of each answer."""
    import httpx

    from clawgym_env.interfaces import RolloutLimits

    route = proxy.open_rollout("capture", policy, RolloutLimits(max_calls=calls + 1))
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Task x"}]
    answers = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}{route.path_prefix}") as http:
        for _ in range(calls):
            request = {"model": "policy", "stream": True, "tools": TOOLS, "messages": messages}
            response = await http.post(
                "/v1/chat/completions", json=request, headers={"authorization": f"Bearer {route.api_key}"}
            )
            answers.append(response.content)
            events = [line[6:].encode() for line in response.text.split("\n") if line.startswith("data: ")]
            next_turn(messages, events)
    proxy.close_rollout("capture")
    return [b"%x\r\n%s\r\n0\r\n\r\n" % (len(a), a) for a in answers]  # one chunk, then the last


def engine_double(tokenizer: Any, args: argparse.Namespace) -> FastTestEngine:
    if args.chunk_tokens:
        return StreamingFastTestEngine(tokenizer, COMPLETIONS, args.chunk_tokens, args.token_delay_ms / 1e3)
    return FastTestEngine(tokenizer, COMPLETIONS, args.engine_delay_ms / 1e3)


def engine_server(args: argparse.Namespace) -> None:
    """`--remote`'s engine process: the engine double behind `token_server` (the vLLM token API stand-in),
    its answers naming a server life as `VLLMServer`'s vLLM does (PROXY_LOAD_NO_BOOT_HEADER=1: as a server
    started without `BootIdMiddleware`, whose version the pool reads before and after every call)."""
    import uvicorn

    from clawgym_env.engines.server_boot import BootIdMiddleware, new_boot_id
    from clawgym_env.engines.token_server import make_token_server
    from clawgym_env.engines.tokenizer import load_qwen_tokenizer

    tokenizer = load_qwen_tokenizer()
    app = make_token_server(engine_double(tokenizer, args), "policy", tokenizer)  # type: ignore[arg-type]
    served = app if os.environ.get("PROXY_LOAD_NO_BOOT_HEADER") else BootIdMiddleware(app, new_boot_id())
    uvicorn.run(served, host="127.0.0.1", port=args.port, log_level="error", loop="uvloop")


async def remote_engine(args: argparse.Namespace) -> tuple[Any, list[subprocess.Popen[bytes]]]:
    """A RemoteEngine (what a vLLM server is reached by) on a started `engine-server` process, or with
    `--pool N` a VLLMServerPool over N of them."""
    from benchmarks import servers
    from clawgym_env.engines.remote_engine import RemoteEngine

    started = [
        servers.start(
            "benchmarks.proxy_load",
            *("engine-server", "--port", "{port}"),
            *("--chunk-tokens", str(args.chunk_tokens), "--token-delay-ms", str(args.token_delay_ms)),
            *("--engine-delay-ms", str(args.engine_delay_ms)),
        )
        for _ in range(max(1, args.pool))
    ]
    for url, _ in started:
        await servers.wait_healthy(url)
    urls, processes = [url for url, _ in started], [process for _, process in started]
    if args.pool:  # what `engine=vllm_server` trains with: the pool's routing and per-call version checks
        from clawgym_env.engines.vllm_server import VLLMServerPool

        return VLLMServerPool(urls, model="policy"), processes
    return RemoteEngine(urls[0], model="policy"), processes


async def serve(args: argparse.Namespace) -> None:
    """The proxy process: JSON commands on stdin, one JSON answer line each on stdout."""
    from clawgym_env.chat import ChatMLRenderer
    from clawgym_env.engines.tokenizer import load_qwen_tokenizer
    from clawgym_env.interfaces import Policy, RolloutLimits, SamplingParams
    from clawgym_env.proxy import ServingProxy

    tokenizer = load_qwen_tokenizer()
    engine_processes: list[subprocess.Popen[bytes]] = []
    if args.remote or args.pool:  # the engine double behind the vLLM-style token API, in a process of its own
        engine, engine_processes = await remote_engine(args)
    else:
        engine = engine_double(tokenizer, args)
    policy = Policy(engine=engine, renderer=ChatMLRenderer(tokenizer))  # type: ignore[arg-type]
    proxy = ServingProxy(args.run_dir, port=0, unix_socket=None, fsync=args.fsync)
    await proxy.start()
    if args.gc_threshold:
        gc.set_threshold(*(int(x) for x in args.gc_threshold.split(",")))
    lag = LoopLag()
    lag_task = asyncio.create_task(lag.run())
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    # The transport owns (and closes) the pipe it reads: give it a duplicate of stdin, so the interpreter's own
    # sys.stdin never closes a descriptor number the transport already closed and the process reused.
    stdin = os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
    prompts: list[list[int]] = []
    handler_s: list[float] = []
    opened = 0
    out = sys.stdout.buffer

    def answer(value: dict[str, Any]) -> None:
        out.write(orjson.dumps(value) + b"\n")
        out.flush()

    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.process_time)  # CPU time: other processes on the cores do not inflate it

    def fsyncs_now() -> int:
        return getattr(getattr(proxy, "_group", None), "fsyncs", 0)

    def pool_counts() -> dict[str, int]:  # a VLLMServerPool's calls, and those sent to the server holding their context
        stats = getattr(engine, "stats", None)
        if not hasattr(stats, "routed_by_context"):
            return {}
        return {"calls": stats.calls, "routed_by_context": stats.routed_by_context}

    def log_bytes() -> int:  # the durable log: call records and delivery receipts
        return sum(f.stat().st_size for f in Path(proxy.log_path).parent.glob(Path(proxy.log_path).stem + ".*"))

    bare: BareServer | None = None
    answer({"port": proxy.endpoint.port, "pid": os.getpid(), "loop": type(loop).__module__})
    while line := await reader.readline():
        cmd = orjson.loads(line)
        if cmd["cmd"] == "open":
            routes = []
            for _ in range(cmd["n"]):
                opened += 1
                route = proxy.open_rollout(f"load{opened}", policy, RolloutLimits(max_calls=cmd["calls"] + 1))
                routes.append([route.path_prefix, route.api_key])
            prompts, handler_s = [], []
            lag.take()
            cpu_at_open = time.process_time()
            fsyncs_at_open, log_at_open, pool_at_open = fsyncs_now(), log_bytes(), pool_counts()
            if profiler is not None:
                profiler.enable()
            answer({"routes": routes})
        elif cmd["cmd"] == "close":
            cpu_s = time.process_time() - cpu_at_open
            rss_open = rss_mb()  # with all the level's rollouts open and played out: what a proxy holds
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(str(args.profile))
            errors = calls = tokens = 0
            for rid in list(proxy._rollouts):
                for call in proxy.close_rollout(rid):
                    calls += 1
                    tokens += len(call.generated_ids)
                    errors += call.error is not None or call.drift_events > 0
                    prompts.append(call.prompt_ids)
                    handler_s.append(call.timings.total_s or 0.0)
            answer(
                {
                    "calls": calls,
                    "generated_tokens": tokens,
                    "errors": errors,
                    "cpu_s": cpu_s,
                    "handler_p50_ms": 1e3 * pct(handler_s, 0.5),
                    "handler_p99_ms": 1e3 * pct(handler_s, 0.99),
                    "rss_mb": rss_mb(),  # after close_rollout handed every call out whole
                    "rss_open_mb": rss_open,
                    "open_fds": len(os.listdir("/proc/self/fd")),
                    "guards": proxy.guard_stats().model_dump(),
                    "tables": proxy.table_sizes(),
                    "fsyncs": fsyncs_now() - fsyncs_at_open,
                    "log_bytes": log_bytes() - log_at_open,
                    "pool": {k: v - pool_at_open[k] for k, v in pool_counts().items()},
                    **lag.take(),
                }
            )
        elif cmd["cmd"] == "direct":
            sampling = SamplingParams(max_tokens=1024, stop_token_ids=tuple(policy.renderer.stop_token_ids))
            answer(await direct_baseline(engine, prompts, cmd["n"], sampling))
        elif cmd["cmd"] == "bare":  # the ceiling (BareServer), in this same process, answering captured bytes
            if bare is None:
                bare = BareServer(await capture_answers(proxy.endpoint.port, proxy, policy, cmd["calls"]))
                await bare.start()
            bare.served = 0
            cpu_at_open = time.process_time()
            answer({"port": bare.port})
        elif cmd["cmd"] == "bare_done":
            answer({"calls": bare.served if bare else 0, "cpu_s": time.process_time() - cpu_at_open})
        elif cmd["cmd"] == "stats":
            answer({"rss_mb": rss_mb(), "open_fds": len(os.listdir("/proc/self/fd")), **lag.take()})
        elif cmd["cmd"] == "quit":
            break
    lag_task.cancel()
    if bare is not None:
        await bare.stop()
    await proxy.stop()
    if engine_processes:
        from benchmarks import servers

        for process in engine_processes:
            servers.stop(process)


# ----------------------------------------------------------------------------------------- client process
class Conn:
    """One keep-alive HTTP/1.1 connection; reads a chunked SSE body event by event."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def post_sse(self, head: bytes, body: bytes) -> tuple[int, list[bytes], float]:
        """Send one request; return the status, the `data:` payloads of the SSE events, and the time to the first."""
        start = time.perf_counter()
        self.writer.write(head + body)
        raw_head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(raw_head[9:12])
        lowered = raw_head.lower()
        events: list[bytes] = []
        first = 0.0
        if b"transfer-encoding: chunked" not in lowered:
            at = lowered.index(b"content-length:") + 15
            length = int(lowered[at : lowered.index(b"\r\n", at)])
            data = await self.reader.readexactly(length)
            return status, [data], time.perf_counter() - start
        pending = b""
        while True:
            size = int(await self.reader.readuntil(b"\r\n"), 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                return status, events, first
            pending += chunk[:-2]
            while (end := pending.find(b"\n\n")) >= 0:
                event, pending = pending[:end], pending[end + 2 :]
                if not first:
                    first = time.perf_counter() - start
                for line in event.split(b"\n"):
                    if line.startswith(b"data: "):
                        events.append(line[6:])


async def client(args: argparse.Namespace) -> None:
    """Drive `--concurrency` rollouts over the routes in `--routes`; print one JSON line of results."""
    routes = orjson.loads(Path(args.routes).read_bytes())
    queue = list(reversed(routes))
    latencies: list[float] = []
    firsts: list[float] = []
    errors: list[str] = []
    tools = orjson.dumps(TOOLS)

    async def rollout(conn: Conn, prefix: str, key: str) -> None:
        head_start = (
            f"POST {prefix}/v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {key}\r\n"
            "content-type: application/json\r\ncontent-length: "
        ).encode()
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Task {prefix}"},
        ]
        for _ in range(args.calls):
            body = b'{"model":"policy","stream":true,"tools":' + tools + b',"messages":' + orjson.dumps(messages) + b"}"
            start = time.perf_counter()
            status, events, first = await conn.post_sse(head_start + str(len(body)).encode() + b"\r\n\r\n", body)
            latencies.append(time.perf_counter() - start)
            firsts.append(first)
            if status != 200 or not events or events[-1] != b"[DONE]":
                errors.append(f"{status}: {b''.join(events)[:200]!r}")
                return
            next_turn(messages, events)

    async def worker(ready: asyncio.Event) -> None:
        conns: dict[int, Conn] = {}  # a route may name its own port (a ShardedProxy's shard): one connection each
        await ready.wait()
        while queue:
            prefix, key, *at = queue.pop()
            port = at[0] if at else args.port
            try:
                if port not in conns:
                    conns[port] = Conn(*await asyncio.open_connection("127.0.0.1", port, limit=1 << 20))
                await rollout(conns[port], prefix, key)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                if port in conns:
                    conns.pop(port).writer.close()
        for conn in conns.values():
            conn.writer.close()

    ready = asyncio.Event()
    workers = [asyncio.create_task(worker(ready)) for _ in range(args.concurrency)]
    await asyncio.sleep(0)
    start = time.perf_counter()
    ready.set()
    await asyncio.gather(*workers)
    wall = time.perf_counter() - start
    cpu = time.process_time()
    sys.stdout.write(
        json.dumps(
            {
                "latencies": latencies,
                "firsts": firsts,
                "errors": errors,
                "wall_s": wall,
                "cpu_s": cpu,
                "pid": os.getpid(),
            }
        )
        + "\n"
    )


# ----------------------------------------------------------------------------------------------- driver
class ProxyProcess:
    """The proxy process, driven by JSON lines on its stdin."""

    def __init__(
        self,
        run_dir: Path,
        engine_delay_ms: float = 0.0,
        fsync: bool = False,
        loop: str = "uvloop",
        stream: tuple[int, float] = (0, 0.0),
        remote: bool = False,
        pool: int = 0,
    ) -> None:
        cmd = [sys.executable, "-m", "benchmarks.proxy_load", "serve", "--run-dir", str(run_dir), "--loop", loop]
        cmd += ["--engine-delay-ms", str(engine_delay_ms)] + (["--fsync"] if fsync else [])
        cmd += ["--chunk-tokens", str(stream[0]), "--token-delay-ms", str(stream[1])] + (["--remote"] if remote else [])
        cmd += ["--pool", str(int(pool))] if pool else []
        if os.environ.get("PROXY_LOAD_GC_THRESHOLD"):
            cmd += ["--gc-threshold", os.environ["PROXY_LOAD_GC_THRESHOLD"]]
        if os.environ.get("PROXY_LOAD_PROFILE"):
            cmd += ["--profile", os.environ["PROXY_LOAD_PROFILE"]]
        # PROXY_LOAD_CODE_DIR: serve from another checkout (A/B against older proxy code, same driver and client)
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=os.environ.get("PROXY_LOAD_CODE_DIR")
        )
        hello = self._read()
        self.port, self.pid, self.loop = hello["port"], hello["pid"], hello["loop"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the proxy process exited with {self.proc.wait()}")
        return orjson.loads(line)

    def ask(self, cmd: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps({"cmd": cmd, **fields}) + b"\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask("quit")
            except (OSError, RuntimeError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def client_commands(port: int, routes: list[Any], n: int, calls: int, clients: int, work: Path) -> list[list[str]]:
    """The client processes' command lines: `routes` split between them (each written to a file in `work`),
    `n` rollouts at a time in all. A route may name its own port (a sharded proxy); `port` is the others'."""
    commands = []
    for i in range(clients):
        path = work / f"routes-{n}-{i}.json"
        path.write_bytes(orjson.dumps(routes[i::clients]))
        share = n // clients + (1 if i < n % clients else 0)
        cmd = [sys.executable, "-m", "benchmarks.proxy_load", "client", "--port", str(port)]
        commands.append(cmd + ["--routes", str(path), "--concurrency", str(share), "--calls", str(calls)])
    return commands


def drive_clients(port: int, routes: list[Any], n: int, calls: int, clients: int, work: Path) -> list[dict[str, Any]]:
    """Run the client processes over `routes`, `n` rollouts at a time in all; their result lines."""
    commands = client_commands(port, routes, n, calls, clients, work)
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE) for cmd in commands]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        results.append(orjson.loads(out.splitlines()[-1]))
    return results


def run_level(proxy: ProxyProcess, n: int, rollouts: int, calls: int, clients: int, work: Path) -> dict[str, Any]:
    """`rollouts` rollouts of `calls` streamed calls, `n` at a time, split over `clients` client processes;
    then the same client against the bare server (the ceiling) and the engine called directly."""
    clients = max(1, min(clients, n))
    routes = proxy.ask("open", n=rollouts, calls=calls)["routes"]
    results = drive_clients(proxy.port, routes, n, calls, clients, work)
    closed = proxy.ask("close")
    direct = proxy.ask("direct", n=n)
    bare_results = drive_clients(proxy.ask("bare", calls=calls)["port"], routes, n, calls, clients, work)
    bare = proxy.ask("bare_done")
    bare_latencies = [x for r in bare_results for x in r["latencies"]]
    latencies = [x for r in results for x in r["latencies"]]
    errors = [e for r in results for e in r["errors"]]
    wall = max(r["wall_s"] for r in results)
    p_med, d_med = statistics.median(latencies), statistics.median(direct["latencies"])
    return {
        "n": n,
        "rollouts": rollouts,
        "calls": len(latencies),
        "errors": len(errors) + closed["errors"],
        "error_samples": errors[:3],
        "proxy_calls_per_s": len(latencies) / wall,
        "proxy_cpu_ms_per_call": 1e3 * closed["cpu_s"] / max(len(latencies), 1),
        "proxy_calls_per_cpu_s": len(latencies) / closed["cpu_s"] if closed["cpu_s"] else float("nan"),
        "proxy_tokens_per_cpu_s": closed["generated_tokens"] / closed["cpu_s"] if closed["cpu_s"] else float("nan"),
        "direct_calls_per_s": direct["calls"] / direct["wall_s"],
        "bare_calls_per_s": len(bare_latencies) / max(r["wall_s"] for r in bare_results),
        "bare_calls_per_cpu_s": bare["calls"] / bare["cpu_s"] if bare["cpu_s"] else float("nan"),
        "bare_median_ms": 1e3 * statistics.median(bare_latencies),
        "bare_calls": bare["calls"],
        "bare_errors": sum(len(r["errors"]) for r in bare_results),
        "client_cpu_ms_per_call": 1e3 * sum(r["cpu_s"] for r in results) / max(len(latencies), 1),
        "proxy_median_ms": 1e3 * p_med,
        "direct_median_ms": 1e3 * d_med,
        "added_median_ms": 1e3 * (p_med - d_med),
        "added_p99_ms": 1e3 * (pct(latencies, 0.99) - pct(direct["latencies"], 0.99)),
        "first_event_median_ms": 1e3 * statistics.median(x for r in results for x in r["firsts"]),
        "handler_p50_ms": closed["handler_p50_ms"],
        "handler_p99_ms": closed["handler_p99_ms"],
        "loop_lag_p99_ms": closed["lag_p99_ms"],
        "loop_lag_max_ms": closed["lag_max_ms"],
        "gc_ms_per_call": closed.get("gc_ms_total", float("nan")) / max(len(latencies), 1),
        "gc_full_passes": closed.get("gc_full_passes"),
        "log_fsyncs": closed.get("fsyncs"),
        "log_kb_per_call": closed.get("log_bytes", 0) / 1024 / max(len(latencies), 1),
        "gc_full_max_ms": closed.get("gc_full_max_ms"),
        "proxy_rss_mb": closed["rss_mb"],
        "proxy_rss_open_mb": closed.get("rss_open_mb", float("nan")),
        "proxy_open_fds": closed["open_fds"],
        "client_processes": clients,
        "client_cpu_s": sum(r["cpu_s"] for r in results),
        "wall_s": wall,
        "load_avg": os.getloadavg()[0],
        "guards": closed["guards"],
        "pool": closed.get("pool", {}),  # with --pool: calls through the pool, and those routed by context
    }


def format_row(r: dict[str, Any]) -> str:
    return (
        f"N={r['n']:>4} calls={r['calls']:>5} errors={r['errors']} | calls/s proxy {r['proxy_calls_per_s']:7.0f} "
        f"direct {r['direct_calls_per_s']:8.0f} bare {r['bare_calls_per_s']:6.0f} | per CPU-s proxy "
        f"{r['proxy_calls_per_cpu_s']:6.0f} ({r['proxy_tokens_per_cpu_s']:7.0f} tokens) bare "
        f"{r['bare_calls_per_cpu_s']:6.0f} | bare median {r['bare_median_ms']:.2f} ms | added median {r['added_median_ms']:7.2f} ms p99 "
        f"{r['added_p99_ms']:8.2f} ms | handler p50 {r['handler_p50_ms']:.2f} ms | loop lag p99 "
        f"{r['loop_lag_p99_ms']:.1f} ms max {r['loop_lag_max_ms']:.1f} | GC full {r['gc_full_passes']} max "
        f"{r['gc_full_max_ms']:.0f} ms | log {r['log_kb_per_call']:.1f} kB/call | RSS {r['proxy_rss_open_mb']:.0f} MB open, "
        f"{r['proxy_rss_mb']:.0f} MB closed "
        f"fds {r['proxy_open_fds']} | clients {r['client_processes']} cpu {r['client_cpu_s']:.1f} s "
        f"wall {r['wall_s']:.1f} s | load {r['load_avg']:.2f}"
        + (
            f" | pool: {r['pool']['routed_by_context']} of {r['pool']['calls']} calls to the server holding their context"
            if r.get("pool")
            else ""
        )
    )


def bench(
    levels: list[int],
    calls: int = 4,
    rounds: int = 1,
    clients: int = 1,
    min_rollouts: int = 256,
    engine_delay_ms: float = 0.0,
    fsync: bool = False,
    loop: str = "uvloop",
    stream: tuple[int, float] = (0, 0.0),
    remote: bool = False,
    pool: int = 0,
) -> dict[str, Any]:
    """`stream`: (ids per chunk, ms per token) of a streaming engine double; (0, 0) replays each answer whole.
    `remote`: the double runs behind the vLLM-style token API in its own process, reached by a RemoteEngine
    (`pool` > 0: through a VLLMServerPool over that many such processes)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="clawgym-proxy-load-") as tmp:
        work = Path(tmp)
        proxy = ProxyProcess(work / "run", engine_delay_ms, fsync, loop, stream, remote, pool)
        try:
            run_level(proxy, 8, 16, 2, 1, work)  # warm-up: imports, block cache, first connections
            rss_start = proxy.ask("stats")["rss_mb"]
            for n in levels:
                for _ in range(rounds):
                    rows.append(run_level(proxy, n, max(n, min_rollouts), calls, 1 if n < 64 else clients, work))
                    print(format_row(rows[-1]), flush=True)
            end = proxy.ask("stats")
        finally:
            proxy.close()
    return {"loop": proxy.loop, "rss_start_mb": rss_start, "rss_end_mb": end["rss_mb"], "rows": rows}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy_load", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="role")
    double = argparse.ArgumentParser(add_help=False)  # the engine double (`engine_double`), served or in-process
    double.add_argument("--engine-delay-ms", type=float, default=0.0)
    double.add_argument("--chunk-tokens", type=int, default=0)
    double.add_argument("--token-delay-ms", type=float, default=0.0)
    e = sub.add_parser("engine-server", parents=[double])
    e.add_argument("--port", type=int, required=True)
    s = sub.add_parser("serve", parents=[double])
    s.add_argument("--run-dir", type=Path, required=True)
    s.add_argument("--remote", action="store_true")
    s.add_argument("--pool", type=int, default=0)
    s.add_argument("--fsync", action="store_true")
    s.add_argument("--profile", type=Path, help="cProfile each level's serving into this file")
    s.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio"))
    s.add_argument("--gc-threshold", default="", help="gc.set_threshold(a, b, c) after the proxy starts: 'a,b,c'")
    c = sub.add_parser("client")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--routes", type=Path, required=True)
    c.add_argument("--concurrency", type=int, required=True)
    c.add_argument("--calls", type=int, required=True)
    parser.add_argument("--levels", default="1,64,1000", help="concurrent rollouts, comma-separated")
    parser.add_argument("--calls", type=int, default=4, help="streamed calls per rollout")
    parser.add_argument("--rounds", type=int, default=1, help="runs per level (RSS must stay flat across them)")
    parser.add_argument("--clients", type=int, default=1, help="client processes for N >= 64")
    parser.add_argument("--min-rollouts", type=int, default=256, help="rollouts per level at least")
    parser.add_argument("--engine-delay-ms", type=float, default=0.0)
    parser.add_argument(
        "--chunk-tokens", type=int, default=0, help="the engine streams this many ids per chunk (0: each answer whole)"
    )
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="with --chunk-tokens: ms per token")
    parser.add_argument(
        "--remote", action="store_true", help="the engine double behind the vLLM token API, reached by RemoteEngine"
    )
    parser.add_argument(
        "--pool",
        type=int,
        nargs="?",
        const=1,
        default=0,
        help="--remote through a VLLMServerPool (engine=vllm_server) over this many engine processes (1 if no number)",
    )
    parser.add_argument("--fsync", action="store_true", help="the proxy's CallLog fsyncs (group commit)")
    parser.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio"), help="the proxy process's loop")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    if args.role == "serve":
        run_on(serve(args), args.loop)
        return None
    if args.role == "client":
        run_on(client(args))
        return None
    if args.role == "engine-server":
        engine_server(args)
        return None
    levels = [int(x) for x in args.levels.split(",")]
    report = bench(
        levels,
        args.calls,
        args.rounds,
        args.clients,
        args.min_rollouts,
        args.engine_delay_ms,
        args.fsync,
        args.loop,
        (args.chunk_tokens, args.token_delay_ms),
        args.remote or args.pool,
        args.pool,
    )
    print(
        f"proxy loop {report['loop']}; proxy RSS {report['rss_start_mb']:.0f} MB after warm-up, "
        f"{report['rss_end_mb']:.0f} MB at the end"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    top = [r for r in report["rows"] if r["n"] == max(levels)]
    errors, rss = sum(r["errors"] for r in top), [r["proxy_rss_mb"] for r in top]
    emit(
        "proxy_load",
        errors,
        f"{errors} errors at N = {max(levels):,}, RSS after closing {' → '.join(f'{x:.0f}' for x in rss)} MB "
        f"over {len(top)} rounds, {statistics.median(r['proxy_calls_per_cpu_s'] for r in top):,.0f} calls per proxy "
        "CPU-second",
    )
    return report


if __name__ == "__main__":
    main()
