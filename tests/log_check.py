"""The check that a run's log gives back the calls the proxy returned (a log line holds only what its call
adds to earlier lines: clawgym_env.records.delta_line), shared by the proxy and harness tests."""

from __future__ import annotations

from pathlib import Path

import orjson

from clawgym_env.records import ModelCall, read_calls, receipts_path


def assert_log_holds(log_path: Path, calls: list[ModelCall]) -> None:
    """Every call, read back from the log, equals the call the proxy returned (but `delivered`, which the
    receipts file may have set since), and the receipts file notes that each rollout closed."""
    logged = {(c.rollout_id, c.call_index): c for c in read_calls(log_path)}
    if not calls:
        return
    notes = [orjson.loads(raw) for raw in receipts_path(log_path).read_bytes().splitlines()]
    closed = {note["rollout_id"] for note in notes if "last_call" in note}
    assert {c.rollout_id for c in calls} <= closed, "a closed rollout has no RolloutClosed note in the receipts"
    for call in calls:
        back = logged.get((call.rollout_id, call.call_index))
        assert back is not None, f"{call.rollout_id}#{call.call_index} is not in the log"
        assert back.model_dump(exclude={"delivered"}) == call.model_dump(exclude={"delivered"})
