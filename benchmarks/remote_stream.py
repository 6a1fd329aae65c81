"""What reading a vLLM server's token stream costs the process that reads it (the proxy), per token and per call.

    .venv/bin/python -m benchmarks.remote_stream                 # intervals 1, 4, 8; 200-token answers
    .venv/bin/python -m benchmarks.remote_stream --tokens 50 --calls 200
    .venv/bin/python -m benchmarks.remote_stream --prompt-tokens 16000 --intervals 4   # a long context

The server is `token_server` (the stand-in for vLLM's token API) in its own process, serving a
`ScriptedTestEngine` (a named test double) that streams one token per chunk with no delay, so the server
is never what is waited for. In this process a `RemoteEngine` streams `--calls` answers of `--tokens` tokens
for each `stream_interval` (tokens per SSE chunk after the first; vLLM >= 0.12 honours it as the stand-in
does), alternating the intervals round by round, and the process's CPU time per token and per call is
printed side by side. This is the engine side of a streamed call, which the proxy pays on top of its own
work (benchmarks/proxy_load.py, `--chunk-tokens`).
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import servers
from clawgym_env.engines.remote_engine import RemoteEngine
from clawgym_env.interfaces import SamplingParams


def serve(port: int, tokens: int) -> None:
    import uvicorn

    from clawgym_env.engines.scripted import ScriptedTestEngine
    from clawgym_env.engines.token_server import make_token_server
    from clawgym_env.engines.tokenizer import load_qwen_tokenizer

    tokenizer = load_qwen_tokenizer()
    engine = ScriptedTestEngine(tokenizer, lambda _prompt: " word" * tokens, token_delay_s=0.0)
    uvicorn.run(make_token_server(engine, "policy", tokenizer), host="127.0.0.1", port=port, log_level="error")


async def cpu_per_call(engine: RemoteEngine, calls: int, tokens: int, prompt_tokens: int) -> tuple[float, int]:
    """(CPU seconds per call, tokens per call) of `calls` streamed calls."""
    sampling = SamplingParams(max_tokens=tokens + 1)
    prompt = list(range(1, prompt_tokens + 1))
    got = 0
    start = time.process_time()
    for _ in range(calls):
        async for chunk in engine.stream(prompt, sampling):
            got += len(chunk.token_ids)
    return (time.process_time() - start) / calls, got // calls


async def measure(url: str, intervals: list[int], calls: int, tokens: int, rounds: int, prompt_tokens: int) -> None:
    engines = {k: RemoteEngine(url, model="policy", stream_interval=k) for k in intervals}
    for engine in engines.values():  # warm-up: imports, connections
        await cpu_per_call(engine, 3, tokens, prompt_tokens)
    per_call: dict[int, list[float]] = {k: [] for k in intervals}
    per_answer = 0
    for _ in range(rounds):
        for k, engine in engines.items():
            seconds, per_answer = await cpu_per_call(engine, calls, tokens, prompt_tokens)
            per_call[k].append(seconds)
    base = statistics.median(per_call[intervals[0]])
    for k in intervals:
        median = statistics.median(per_call[k])
        print(
            f"stream_interval {k:2d}: {1e3 * median:6.2f} ms CPU per {per_answer}-token call, "
            f"{1e6 * median / per_answer:5.1f} µs per token ({median / base:4.2f}x interval {intervals[0]}; "
            f"rounds {', '.join(f'{1e3 * s:.2f}' for s in per_call[k])} ms)",
            flush=True,
        )
    for engine in engines.values():
        await engine.aclose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals", default="1,4,8", help="stream_interval values, comma-separated")
    parser.add_argument("--tokens", type=int, default=200, help="tokens per answer")
    parser.add_argument("--calls", type=int, default=50, help="calls per interval per round")
    parser.add_argument("--prompt-tokens", type=int, default=3, help="prompt length (a rollout's context grows)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server process's port
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.tokens)
        return
    intervals = [int(k) for k in args.intervals.split(",")]
    servers.measure_against(
        lambda url: measure(url, intervals, args.calls, args.tokens, args.rounds, args.prompt_tokens),
        *("benchmarks.remote_stream", "--serve", "{port}", "--tokens", str(args.tokens)),
    )


if __name__ == "__main__":
    main()
