"""Many concurrent streaming rollouts against one proxy process (issue #18), with benchmarks/proxy_load.py:
the proxy in its own process serving a fast engine double, the rollouts driven from a client process over
real loopback HTTP, each rollout on its own route and key, its SSE answers read event by event.

Asserted: no call fails or drifts, the bare-server ceiling (the same client, the proxy's captured answers)
served every call, the proxy's connection guards refused nothing, and its RSS after a
second identical round is within a bound of the first (nothing kept per rollout or per connection).
"""

from __future__ import annotations

import pytest

from benchmarks.proxy_load import ProxyProcess, run_level


def two_rounds(tmp_path, n: int, calls: int, clients: int) -> list[dict]:
    proxy = ProxyProcess(tmp_path / "run")
    try:
        return [run_level(proxy, n, n, calls, clients, tmp_path) for _ in range(2)]
    finally:
        proxy.close()


def check(rows: list[dict], n: int, calls: int, rss_bound_mb: float) -> None:
    for row in rows:
        assert row["errors"] == 0, row["error_samples"]
        assert row["calls"] == n * calls
        assert row["guards"]["peer_refusals"] == 0 and row["guards"]["header_timeouts"] == 0
        assert row["proxy_calls_per_s"] > 0 and row["added_median_ms"] == row["added_median_ms"]  # not NaN
        # the ceiling: the same client against a bare server answering the proxy's captured bytes parsed every
        # answer as a proxy answer (the conversation went on) and was served every call
        assert row["bare_errors"] == 0 and row["bare_calls"] == n * calls and row["bare_calls_per_cpu_s"] > 0
    assert rows[1]["proxy_rss_mb"] - rows[0]["proxy_rss_mb"] < rss_bound_mb, [r["proxy_rss_mb"] for r in rows]


def test_200_concurrent_streaming_rollouts_in_one_proxy_process(tmp_path):
    rows = two_rounds(tmp_path, n=200, calls=2, clients=1)
    check(rows, 200, 2, rss_bound_mb=16)


@pytest.mark.slow
def test_1000_concurrent_streaming_rollouts_in_one_proxy_process(tmp_path):
    rows = two_rounds(tmp_path, n=1000, calls=4, clients=2)
    check(rows, 1000, 4, rss_bound_mb=32)


def test_rollouts_through_a_remote_engine_streaming_token_by_token(tmp_path):
    """`--remote --chunk-tokens 1`: the engine double behind the vLLM token API in its own process, read by a
    RemoteEngine a chunk per token (the real path's shape): every call answered, none drifting."""
    proxy = ProxyProcess(tmp_path / "run", stream=(1, 0.0), remote=True)
    try:
        row = run_level(proxy, 16, 16, 3, 1, tmp_path)
    finally:
        proxy.close()
    assert row["errors"] == 0, row["error_samples"]
    assert row["calls"] == 16 * 3 and row["proxy_calls_per_cpu_s"] > 0 and row["proxy_tokens_per_cpu_s"] > 0


def test_rollouts_through_a_pool_of_two_servers_keep_to_theirs(tmp_path):
    """`--pool 2`: two engine processes behind a `VLLMServerPool` (`engine=vllm_server`: the version read once
    per server life, which their answers name; sticky routing). 64 rollouts of 3 calls at once: every call
    answered, and every call after a rollout's first went to the server holding its context: the proxy's
    spliced prompt extends the previous call's prompt + generated ids exactly, id for id."""
    proxy = ProxyProcess(tmp_path / "run", remote=True, pool=2)
    try:
        row = run_level(proxy, 64, 64, 3, 1, tmp_path)
    finally:
        proxy.close()
    assert row["errors"] == 0, row["error_samples"]
    assert row["calls"] == 64 * 3 and row["proxy_calls_per_cpu_s"] > 0
    assert row["pool"] == {"calls": 64 * 3, "routed_by_context": 64 * 2}, row["pool"]
