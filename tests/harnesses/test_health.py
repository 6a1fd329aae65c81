"""The health check end to end on the fast harnesses (the CLI command runs all five)."""

from __future__ import annotations

from harness_adapters.health import render_table, run_health


async def test_health_rows_for_codex_and_whitebox() -> None:
    rows = await run_health(("Codex", "WhiteBox"))
    assert [r.harness for r in rows] == ["Codex", "WhiteBox"]
    assert all(r.healthy and r.calls == 2 for r in rows), [r.detail for r in rows]
    assert rows[0].version == "0.171.0"
    assert render_table(rows).row_count == 2
