"""`benchmarks/proxy_shards` runs: one proxy process and two shards under the same load, every call answered
and recorded, and the CPU of each side measured (the shards' from /proc, the caller's own)."""

from __future__ import annotations

from benchmarks.proxy_shards import main


def test_one_process_and_two_shards_side_by_side() -> None:
    rows = main(["--shards", "1,2", "--levels", "8", "--min-rollouts", "16", "--calls", "2"])
    assert [(r["shards"], r["n"], r["calls"], r["errors"]) for r in rows] == [(1, 8, 32, 0), (2, 8, 32, 0)]
    one, two = rows
    assert one["shard_cpu_ms_per_call"] == 0 and one["main_cpu_ms_per_call"] > 0
    assert two["shard_cpu_ms_per_call"] > 0  # the shards did the HTTP work
    # with shards the caller's process runs only the engine and the hub: less of its CPU per call
    assert two["main_cpu_ms_per_call"] < one["main_cpu_ms_per_call"]
