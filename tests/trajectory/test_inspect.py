"""Inspection and recording statistics, on recordings written through the real CallLog."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawgym_env.records import CallLog
from clawgym_env.trajectory.inspect import inspect_run, markdown_table, recording_stats
from clawgym_env.trajectory.synthetic_recordings import synthetic_rollout


def record(tmp_path: Path) -> Path:
    """Two harness shapes in one run: Claude-Code-like append-only and OpenClaw-chat-like reordering."""
    run = tmp_path / "run"
    with CallLog(run / "calls.jsonl") as log:
        shapes = [
            ("cc-0", dict(mode="append", retry_prob=0.5, compaction_at=4, subagent_at=1)),
            ("oc-0", dict(mode="openclaw_chat", retry_prob=0.3, fail_prob=0.3)),
        ]
        for seed, (rid, shape) in enumerate(shapes):
            for call in synthetic_rollout(seed + 11, rollout_id=rid, turns=6, **shape).calls:
                log.append(call)
    return run


def test_stats_table_for_two_harness_shapes(tmp_path: Path) -> None:
    rows = {r["rollout"]: r for r in recording_stats(record(tmp_path))}
    cc, oc = rows["cc-0"], rows["oc-0"]
    # append-only: one full-history branch (the ratio of two equal token counts is exactly 1.0)
    assert cc["branches"] == 1 and cc["packed/per-branch"] == 1.0
    assert cc["compaction calls"] > 0 and cc["subagent calls"] == 2
    assert oc["branches"] > 1 and oc["relocated splice tokens"] > 0 and oc["packed/per-branch"] < 1.0
    assert oc["unique tokens"] < oc["prompt tokens sent"]
    table = markdown_table(list(rows.values()))
    assert table.count("\n") == 4 and "| cc-0 |" in table


def test_inspect_run_text_and_self_contained_html(tmp_path: Path) -> None:
    run = record(tmp_path)
    text, html_path = inspect_run(run, None, reward=0.75)  # the first rollout by default
    assert "rollout cc-0" in text and "reward 0.750" in text
    assert "[set aside: compaction]" in text and "[set aside: subagent]" in text
    assert "dead leaf" in text and "generate s" in text
    subagent_part = text.split("[set aside: subagent]")[1].split("[set aside")[0]
    assert "generated" in subagent_part and "tools" not in subagent_part  # the subagent's own tree, own prompt
    page = html_path.read_text()
    assert html_path.parent == run / "inspect" and page.startswith("<!doctype html>")
    assert "set aside (compaction)" in page.lower() and "<table>" in page
    assert "<script" not in page and "<link" not in page and "http" not in page  # no external asset
    text2, _ = inspect_run(run / "calls.jsonl", "oc-0", decode=lambda ids: " ".join(map(str, ids)))
    assert "rollout oc-0" in text2 and "failed" in text2


def test_inspect_run_says_what_is_missing(tmp_path: Path) -> None:
    run = record(tmp_path)
    with pytest.raises(ValueError, match="not in"):
        inspect_run(run, "nope")
    with pytest.raises(FileNotFoundError, match="no calls.jsonl"):
        (tmp_path / "empty").mkdir()
        inspect_run(tmp_path / "empty", None)


def test_inspect_finds_a_rollout_in_a_sharded_proxys_run(tmp_path: Path) -> None:
    """A `ShardedProxy` writes one log per shard (`shard-K/calls.jsonl`): a rollout is read from its shard's."""
    run = tmp_path / "run"
    for shard, rid in enumerate(("first", "second")):
        with CallLog(run / f"shard-{shard}" / "calls.jsonl") as log:
            for call in synthetic_rollout(shard, rollout_id=rid, turns=3).calls:
                log.append(call)
    text, _ = inspect_run(run, "second")
    assert "rollout second" in text
    assert "rollout first" in inspect_run(run, None)[0]
