"""RemoteEngine over real HTTP against the token server (a stand-in for vLLM's and SGLang's APIs)."""

import asyncio
import gc
import logging
import socket
import warnings

import pytest
import uvicorn

from clawgym_env.engines.remote_engine import RemoteEngine, RemoteEngineError
from clawgym_env.engines.token_server import make_token_server
from clawgym_env.engines.transformers_engine import TransformersEngine
from clawgym_env.interfaces import InferenceEngine, SamplingParams


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def serve(app, port: int) -> tuple[uvicorn.Server, asyncio.Task]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    return server, task


@pytest.fixture
async def token_server(tiny_model, qwen_tok):
    engine = TransformersEngine(tiny_model, qwen_tok)
    port = free_port()
    server, task = await serve(make_token_server(engine, "tiny-qwen3", qwen_tok), port)
    yield f"http://127.0.0.1:{port}", engine
    server.should_exit = True
    await task
    engine.close()


@pytest.mark.parametrize("api", ["vllm", "sglang"])
async def test_round_trip_equals_the_engine_behind_it(token_server, api, chat_prompt):
    url, local = token_server
    remote = RemoteEngine(url, api=api)
    assert isinstance(remote, InferenceEngine)
    s = SamplingParams(max_tokens=12, seed=5, temperature=0.8, top_k=100)
    got = await remote.generate(chat_prompt, s)
    want = await local.generate(chat_prompt, s)
    assert got.token_ids == want.token_ids and len(got.token_ids) == 12
    assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    assert got.finish_reason == "length"
    if api == "vllm":
        assert remote.model == "tiny-qwen3"  # discovered from /v1/models
    await remote.aclose()


async def test_an_answer_does_not_carry_the_prompt_back(tiny_model, qwen_tok):
    """A rollout's context grows to tens of thousands of tokens, and the proxy makes every call through this
    client: an answer that echoed the prompt's ids (vLLM's `return_token_ids` does, in the first chunk) would
    make the proxy and the server parse and copy all of them again on every call. The ids still come back,
    read from the logprob tokens (`test_round_trip_equals_the_engine_behind_it`)."""
    engine = TransformersEngine(tiny_model, qwen_tok)
    app = make_token_server(engine, "tiny-qwen3", qwen_tok)
    answered: list[int] = []  # bytes of each /v1/completions answer

    async def counting(scope, receive, send):
        async def counted(message):
            if message["type"] == "http.response.body":
                answered[-1] += len(message.get("body", b""))
            await send(message)

        if scope["type"] == "http" and scope["path"] == "/v1/completions":
            answered.append(0)
            return await app(scope, receive, counted)
        return await app(scope, receive, send)

    port = free_port()
    server, task = await serve(counting, port)
    remote = RemoteEngine(f"http://127.0.0.1:{port}", model="tiny-qwen3")
    s = SamplingParams(max_tokens=6, seed=0, ignore_eos=True)
    for prompt in ([5, 6, 7], list(range(100, 4100))):  # 4,000 ids: ~20 kB of JSON if echoed
        assert len((await remote.generate(prompt, s)).token_ids) == 6
        assert sum([len(c.token_ids) async for c in remote.stream(prompt, s)]) == 6
    short_generate, short_stream, long_generate, long_stream = answered
    assert long_generate < short_generate + 1_000 and long_stream < short_stream + 1_000, answered
    await remote.aclose()
    server.should_exit = True
    await task
    engine.close()


async def test_stop_ids_and_concurrency_over_http(token_server, chat_prompt):
    url, local = token_server
    remote = RemoteEngine(url)
    greedy = await remote.generate(chat_prompt, SamplingParams(max_tokens=6, temperature=0))
    stop = greedy.token_ids[2]
    stopped = await remote.generate(chat_prompt, SamplingParams(max_tokens=6, temperature=0, stop_token_ids=(stop,)))
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == stop
    many = await asyncio.gather(*(remote.generate(chat_prompt, SamplingParams(max_tokens=4, seed=i)) for i in range(8)))
    assert all(len(g.token_ids) == 4 for g in many)
    await remote.aclose()


async def test_retries_until_the_server_comes_up(tiny_model, qwen_tok, chat_prompt):
    engine = TransformersEngine(tiny_model, qwen_tok)
    port = free_port()
    remote = RemoteEngine(f"http://127.0.0.1:{port}", model="m", retries=8)
    pending = asyncio.create_task(remote.generate(chat_prompt, SamplingParams(max_tokens=3)))
    await asyncio.sleep(0.5)  # the first attempts hit a closed port
    assert not pending.done()
    server, task = await serve(make_token_server(engine, "m"), port)
    gen = await asyncio.wait_for(pending, timeout=30)
    assert len(gen.token_ids) == 3
    server.should_exit = True
    await task
    await remote.aclose()
    engine.close()


async def test_server_errors_are_reported_not_retried(token_server):
    url, _ = token_server
    remote = RemoteEngine(url, model="tiny-qwen3")
    with pytest.raises(RemoteEngineError, match="400.*outside the model's vocabulary"):
        await remote.generate([1, 10**8], SamplingParams(max_tokens=2))
    with pytest.raises(NotImplementedError, match="set_policy_version"):
        remote.update_weights({}, 1)
    remote.set_policy_version(4)
    assert (await remote.generate([1, 2, 3], SamplingParams(max_tokens=1))).policy_version == 4
    await remote.aclose()


async def test_vllm_stream_yields_what_generate_returns(token_server, chat_prompt):
    """`stream: true` over HTTP: several chunks as the engine decodes, together the same generation."""
    url, local = token_server
    remote = RemoteEngine(url)
    s = SamplingParams(max_tokens=16, seed=9, temperature=0.9)
    chunks = [chunk async for chunk in remote.stream(chat_prompt, s)]
    want = await local.generate(chat_prompt, s)
    assert len(chunks) > 2 and all(c.finish_reason is None for c in chunks[:-1])
    assert chunks[-1].finish_reason == want.finish_reason == "length"
    assert [t for c in chunks for t in c.token_ids] == want.token_ids
    assert [lp for c in chunks for lp in c.logprobs] == pytest.approx(want.logprobs, abs=1e-4)
    with pytest.raises(RemoteEngineError, match="400"):
        _ = [chunk async for chunk in remote.stream([10**9], s)]  # an id outside the vocabulary
    await remote.aclose()


@pytest.mark.parametrize("interval", [1, 4])
async def test_vllm_stream_interval_sends_fewer_chunks_of_the_same_generation(token_server, chat_prompt, interval):
    """`stream_interval`: the first tokens at once, then a chunk per `interval` tokens or more, then the end;
    the ids and logprobs are the generation's, none lost or repeated.

    A chunk may hold more than `interval` tokens: the engine hands over every token decoded since the stream
    last read (as vLLM's output collector merges a slow reader's outputs), so under load two decode steps can
    arrive as one chunk. On an idle machine the sizes are [1, interval, interval, ..., rest]."""
    url, local = token_server
    remote = RemoteEngine(url, stream_interval=interval)
    s = SamplingParams(max_tokens=15, seed=2, temperature=0.9)
    chunks = [chunk async for chunk in remote.stream(chat_prompt, s)]
    want = await local.generate(chat_prompt, s)
    sizes = [len(c.token_ids) for c in chunks if c.token_ids]  # the engine may end on an empty chunk
    assert all(size >= interval for size in sizes[1:-1]), sizes  # never cut below the interval
    assert len(sizes) <= 2 + 14 // interval, sizes  # the first, the full intervals, the rest: fewer if merged
    assert [t for c in chunks for t in c.token_ids] == want.token_ids
    assert [lp for c in chunks for lp in c.logprobs] == pytest.approx(want.logprobs, abs=1e-4)
    assert chunks[-1].finish_reason == "length"
    await remote.aclose()


def test_one_engine_serves_one_event_loop_after_another(tiny_model, qwen_tok, chat_prompt, caplog):
    """An evaluation runs each harness in its own Runtime (its own event loop) on one engine: httpx's pooled
    connections belong to the loop that opened them, so each loop gets its own client (before, the second
    loop failed with "Event loop is closed")."""
    import threading
    import time

    engine = TransformersEngine(tiny_model, qwen_tok)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            make_token_server(engine, "tiny-qwen3", qwen_tok),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        remote = RemoteEngine(f"http://127.0.0.1:{port}", api="vllm")
        sampling = SamplingParams(max_tokens=4, seed=0)
        with warnings.catch_warnings(record=True) as warned, caplog.at_level(logging.ERROR, logger="asyncio"):
            warnings.simplefilter("always")
            runs = [asyncio.run(remote.generate(chat_prompt, sampling)).token_ids for _ in range(3)]
            gc.collect()  # the ended loops' connections go (nobody called aclose()): quietly, sockets closed
        assert runs[0] == runs[1] == runs[2] and len(runs[0]) > 0
        assert len(remote._pools) == 1  # the ended loops' connections were let go, not kept with their loops
        unclosed = [str(w.message) for w in warned if "Unclosed" in str(w.message)]
        assert not unclosed and "Unclosed" not in caplog.text, (unclosed, caplog.text)
    finally:
        server.should_exit = True
        thread.join(10)
        engine.close()


async def test_streamed_calls_reuse_one_kept_alive_connection(tiny_model, qwen_tok, chat_prompt):
    """Each streamed call reads its response to the end, so the next call goes over the same connection: a
    response left unread closes it, and a new TCP connection per call costs ~1 ms of this process's CPU
    and, at thousands of calls a second, leaves the host's ephemeral ports in TIME_WAIT."""
    engine = TransformersEngine(tiny_model, qwen_tok)
    app = make_token_server(engine, "m", qwen_tok)
    peers: list[int] = []

    @app.middleware("http")
    async def note_peer(request, call_next):
        peers.append(request.client.port)
        return await call_next(request)

    port = free_port()
    server, task = await serve(app, port)
    remote = RemoteEngine(f"http://127.0.0.1:{port}", model="m")
    for seed in range(3):
        chunks = [chunk async for chunk in remote.stream(chat_prompt, SamplingParams(max_tokens=3, seed=seed))]
        assert chunks[-1].finish_reason == "length"
    # as the proxy reads (TokenFeed): stop at the chunk with the finish reason, and close the stream there
    for seed in range(3):
        stream = remote.stream(chat_prompt, SamplingParams(max_tokens=3, seed=seed))
        async for chunk in stream:
            if chunk.finish_reason is not None:
                break
        await stream.aclose()
        assert chunk.finish_reason == "length"
    assert len(peers) == 6 and len(set(peers)) == 1, peers
    await remote.aclose()
    server.should_exit = True
    await task
    engine.close()


async def test_a_server_that_is_gone_raises_unreachable_an_oserror_after_the_retries():
    """Nothing listens: the retries run out and `RemoteEngineUnreachable` says so. It is a ConnectionError, which
    is how VLLMServerPool tells a lost server from one that answered with an error."""
    from clawgym_env.engines.remote_engine import RemoteEngineUnreachable

    remote = RemoteEngine(f"http://127.0.0.1:{free_port()}", model="m", retries=2)
    with pytest.raises(RemoteEngineUnreachable, match="ClientConnectorError") as failed:
        await remote.generate([1, 2, 3], SamplingParams(max_tokens=2))
    assert isinstance(failed.value, OSError) and isinstance(failed.value, RemoteEngineError)
    with pytest.raises(RemoteEngineUnreachable):
        _ = [chunk async for chunk in remote.stream([1, 2, 3], SamplingParams(max_tokens=2))]
    await remote.aclose()


async def test_more_than_a_hundred_streams_are_in_flight_at_once(qwen_tok):
    """One RemoteEngine carries a call per rollout in flight: 120 concurrent streams all reach the server
    together (httpx's default pool held all but 100 back until others finished)."""
    from clawgym_env.engines.scripted import ScriptedTestEngine

    class Counting(ScriptedTestEngine):  # a test double that counts the streams it serves at once
        active = peak = 0

        async def stream(self, prompt_ids, sampling, *, request_id=None):
            Counting.active += 1
            Counting.peak = max(Counting.peak, Counting.active)
            try:
                async for chunk in super().stream(prompt_ids, sampling, request_id=request_id):
                    yield chunk
            finally:
                Counting.active -= 1

    engine = Counting(qwen_tok, lambda _prompt: "one two three", token_delay_s=0.3)
    port = free_port()
    server, task = await serve(make_token_server(engine, "m", qwen_tok), port)
    remote = RemoteEngine(f"http://127.0.0.1:{port}", model="m", stream_interval=1)

    async def one() -> list[int]:
        return [t async for chunk in remote.stream([1, 2], SamplingParams(max_tokens=8)) for t in chunk.token_ids]

    answers = await asyncio.gather(*(one() for _ in range(120)))
    assert all(len(ids) == 4 for ids in answers)
    assert Counting.peak > 100, Counting.peak
    await remote.aclose()
    server.should_exit = True
    await task
