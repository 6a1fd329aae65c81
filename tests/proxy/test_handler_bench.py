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
