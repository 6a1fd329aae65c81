"""benchmarks/proxy_handler.py drives the proxy's hot routes with ASGI scopes, no sockets: every call of a
growing conversation is answered 200, recorded, and spliced (no drift), so its µs per call are the cost of
real work, not of failures."""

from __future__ import annotations

from benchmarks.proxy_handler import measure


async def test_the_handler_benchmark_answers_records_and_splices_every_call():
    report = await measure(rollouts=3, calls=5)
    assert report["statuses"] == {200: 15}
    assert report["recorded"] == 15 and report["drift_events"] == 0
    assert report["handler_us_per_call"] > 0


async def test_the_handler_benchmark_streams_token_by_token_with_the_same_answers():
    """`--chunk-tokens 1`: the engine double streams a chunk per token; every call is still answered,
    recorded and spliced, so the per-token cost it shows is the proxy's streaming path."""
    report = await measure(rollouts=3, calls=5, chunk_tokens=1)
    assert report["statuses"] == {200: 15}
    assert report["recorded"] == 15 and report["drift_events"] == 0


def test_the_remote_stream_benchmark_reads_every_token_at_each_interval(capsys):
    """benchmarks/remote_stream.py against its own token-server process: a row per interval, each call read
    whole (the token count is the answer's)."""
    from benchmarks.remote_stream import main

    main(["--intervals", "1,4", "--tokens", "12", "--calls", "3", "--rounds", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("stream_interval")]
    assert len(rows) == 2 and all("per 13-token call" in row for row in rows), rows
