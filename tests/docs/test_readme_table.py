"""The README's benchmark table: each row's figure is the headline its command printed, stored with where it
came from (benchmarks.readme_table); a row never run shows no figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.headline import read
from benchmarks.readme_table import ROWS, publish, read_stored, run, table


def test_a_command_run_in_its_own_process_gives_its_headlines_with_their_origin():
    code = "from benchmarks.headline import emit; print('a table'); emit('sandbox', 1.5, 'one-line shell 1.50x')"
    (stored,) = run([["-c", code]])
    assert (stored["key"], stored["value"], stored["figure"]) == ("sandbox", 1.5, "one-line shell 1.50x")
    assert stored["command"] == f"python -c {code}" and stored["cpu"] and stored["commit"] and stored["wall_s"] >= 0
    assert read('x\nHEADLINE {"key": "k", "value": 2, "figure": "f"}\n') == [{"key": "k", "value": 2, "figure": "f"}]


def test_a_command_that_fails_or_prints_no_headline_is_an_error():
    with pytest.raises(RuntimeError, match="printed 0 headlines"):
        run([["-c", "print('no headline')"]])
    with pytest.raises(RuntimeError, match="exited with 3"):
        run([["-c", "import sys; sys.exit(3)"]])


def test_publishing_replaces_a_rows_line_and_keeps_the_others(tmp_path: Path):
    path = tmp_path / "readme_table.jsonl"
    first = {"key": "sandbox", "figure": "old", "date": "d", "load_before": 0.5, "load_after": 0.7, "cpu": "c"}
    publish(path, [first, {**first, "key": "stream", "figure": "kept"}])
    publish(path, [{**first, "figure": "new"}])
    stored = read_stored(path)
    assert {k: v["figure"] for k, v in stored.items()} == {"sandbox": "new", "stream": "kept"}
    text = table(stored)
    assert "| new (d, load 0.5-0.7) | < 3x |" in text and "| kept (d, load 0.5-0.7) |" in text
    unstored = [r for r in ROWS if r.doc is None and r.key not in stored]
    assert text.count("| not stored yet |") == len(unstored) > 0  # no figure without a stored run
