"""File checks on good, wrong and malformed workspaces (real csv/json/sqlite/xlsx/docx files)."""

import json
import sqlite3
from pathlib import Path

import docx
import openpyxl
import pytest

from clawgym_env.interfaces import VerifyContext
from clawgym_env.specs import TaskSpec
from verifiers import (
    AnswerMatches,
    CsvMatches,
    DocxText,
    FileChecksVerifier,
    FileExists,
    JsonMatches,
    SqliteQuery,
    TextMatches,
    VerifierConfigError,
    XlsxCells,
)


def good(ws: Path) -> Path:
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "answer.txt").write_text("$1,234.5\n")
    (ws / "note.md").write_text("# Title\n\nHello World.\n")
    (ws / "totals.csv").write_text("region,total\nNorth,1200\nSouth,830.5\n")
    (ws / "summary.json").write_text(json.dumps({"total": 2030.5, "top": {"region": "North"}, "items": [1, 2]}))
    conn = sqlite3.connect(ws / "db.sqlite")
    conn.execute("create table t (name text, amount real)")
    conn.executemany("insert into t values (?, ?)", [("a", 1.0), ("b", 2.5)])
    conn.commit()
    conn.close()
    wb = openpyxl.Workbook()
    wb.active.title = "Data"
    wb.active["A1"], wb.active["B2"] = "Region", 42
    wb.save(ws / "book.xlsx")
    d = docx.Document()
    d.add_paragraph("Memo to the Board")
    d.add_paragraph("The total is 2,030.50 dollars.")
    d.save(ws / "memo.docx")
    return ws


CHECKS = [
    FileExists("note.md", non_empty=True),
    TextMatches("note.md", "# title hello world", mode="normalized"),
    TextMatches("note.md", ["hello", "title"], mode="contains", name="note_contains"),
    TextMatches("note.md", [r"^# \w+"], mode="regex", name="note_regex"),
    AnswerMatches("answer.txt", 1234.5),
    CsvMatches(
        "totals.csv",
        columns=["region", "total"],
        rows=[{"region": "south", "total": 830.5}, {"region": "North", "total": "1,200"}],
        key="region",
    ),
    JsonMatches("summary.json", expected={"total": 2030.5, "top.region": "north", "items.1": 2}, required=["items"]),
    SqliteQuery("db.sqlite", "select name, amount from t", [("b", 2.5), ("a", 1)]),
    XlsxCells("book.xlsx", {"Data!A1": "region", "B2": 42}),
    DocxText("memo.docx", contains=["memo to the board", "2,030.50"]),
]


def verify(ws: Path, checks=CHECKS, **kw):
    import asyncio

    v = FileChecksVerifier(checks, **kw)
    ctx = VerifyContext(sandbox=None, task=TaskSpec(id="t", instruction="x", verifier=v), workspace_dir=ws)
    return asyncio.run(v.verify(ctx))


def test_good_workspace_passes_every_check(tmp_path):
    result = verify(good(tmp_path / "ws"))
    assert result.error is None
    assert result.reward == 1.0, result.explanation
    assert set(result.subscores) == {c.name for c in CHECKS}


def test_wrong_workspace_fails_the_wrong_facts(tmp_path):
    ws = good(tmp_path / "ws")
    (ws / "answer.txt").write_text("1300")
    (ws / "totals.csv").write_text("region,total\nNorth,1200\nSouth,999\n")
    (ws / "summary.json").write_text(json.dumps({"total": 2030.5, "top": {"region": "South"}, "items": [1, 2]}))
    wb = openpyxl.load_workbook(ws / "book.xlsx")
    wb["Data"]["B2"] = 41
    wb.save(ws / "book.xlsx")
    result = verify(ws)
    assert result.error is None
    s = result.subscores
    assert s["answer:answer.txt"] == 0.0
    assert s["csv:totals.csv"] == 0.5  # columns right, rows wrong
    assert s["json:summary.json"] == pytest.approx(3 / 4)
    assert s["xlsx:book.xlsx"] == 0.5
    assert s["docx:memo.docx"] == 1.0
    assert 0.0 < result.reward < 1.0
    assert "FAIL answer:answer.txt" in result.explanation


def test_malformed_files_score_zero_with_reason_not_error(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ["summary.json", "book.xlsx", "memo.docx", "db.sqlite", "totals.csv"]:
        (ws / name).write_text("this is not the right format {")
    (ws / "answer.txt").write_bytes(b"\xff\xfe\x00bad")
    result = verify(ws)
    assert result.error is None
    for name in ["json:summary.json", "xlsx:book.xlsx", "docx:memo.docx", "sqlite:db.sqlite", "answer:answer.txt"]:
        assert result.subscores[name] == 0.0, name
    assert result.reward < 0.5
    assert "not valid JSON" in result.explanation and "not a SQLite database" in result.explanation


def test_empty_workspace_scores_zero(tmp_path):
    (tmp_path / "ws").mkdir()
    result = verify(tmp_path / "ws")
    assert result.error is None and result.reward == 0.0
    assert "does not exist" in result.explanation


def test_weights_and_config_errors(tmp_path):
    ws = good(tmp_path / "ws")
    (ws / "answer.txt").write_text("0")
    checks = [FileExists("note.md"), AnswerMatches("answer.txt", 1234.5)]
    result = verify(ws, checks, weights={"answer:answer.txt": 3})
    assert result.reward == pytest.approx(0.25)
    with pytest.raises(VerifierConfigError):
        FileChecksVerifier(checks, weights={"typo": 1})
    with pytest.raises(VerifierConfigError):
        FileChecksVerifier([FileExists("a"), FileExists("a")])
    with pytest.raises(VerifierConfigError):
        CsvMatches("x.csv")


def test_escaping_paths_are_a_verifier_error(tmp_path):
    result = verify(good(tmp_path / "ws"), [FileExists("../outside.txt")])
    assert result.error is not None and ".." in result.error
