"""File checks: small, named, fact-anchored tests of the final workspace.

Each check reads files under the host copy of the workspace and returns a `CheckOutcome` (score in
[0, 1] and a one-line detail). A missing or malformed file is the agent's failure (score 0 with the
reason), not a verifier error. `FileChecksVerifier` runs a list of checks as named sub-scores, in a child
process with a memory and a time limit (`verifiers.isolated`): a file built to be slow or huge to parse stalls
neither the event loop nor the host.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import reprlib
import sqlite3
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from clawgym_env.interfaces import VerifierResult, VerifyContext
from clawgym_env.specs import check_relative_path
from verifiers.answer import match_answer, normalize_text
from verifiers.base import (
    BaseVerifier,
    VerifierConfigError,
    check_weights,
    host_workspace,
    weighted_mean,
)
from verifiers.isolated import DEFAULT_MEMORY_MB, CheckLimitError, run_isolated


def refuse_outside(workspace: Path, target: Path) -> str | None:
    """Why `target` may not be read (a link leading out of the workspace, or not a regular file), or None.

    The checks open files by path, so the path must resolve inside the workspace to a regular file: a link
    to a host file must not be read, and a FIFO would block the reader forever.
    """
    root = os.path.realpath(workspace)
    real = os.path.realpath(target)
    if real != root and not real.startswith(root + os.sep):
        return "is a link that leads out of the workspace; not read"
    with contextlib.suppress(OSError):
        if not stat.S_ISREG(os.stat(real).st_mode):
            return "is not a regular file (a folder, FIFO, socket or device); not read"
    return None


@dataclass
class CheckOutcome:
    score: float
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.score >= 1.0 - 1e-9


def _ok(detail: str = "ok") -> CheckOutcome:
    return CheckOutcome(1.0, detail)


def _fail(detail: str) -> CheckOutcome:
    return CheckOutcome(0.0, detail)


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 120


def _shown(value: Any) -> str:
    """A value read from the agent's file, for a detail: its repr cut short (a cell may hold 300 MB)."""
    return _SHORT.repr(value)


def values_match(actual: Any, expected: Any, rel_tol: float = 1e-2) -> bool:
    """Compare a value read from a file with an expected one (tolerant numbers, normalized strings)."""
    if type(actual) is type(expected) and actual == expected:
        return True
    if expected is None:
        return actual is None or str(actual).strip() == ""
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(actual, (list, tuple))
            and len(actual) == len(expected)
            and all(values_match(a, e, rel_tol) for a, e in zip(actual, expected))
        )
    if isinstance(expected, Mapping):
        return (
            isinstance(actual, Mapping)
            and set(map(str, actual)) == set(map(str, expected))
            and all(values_match(actual.get(k), v, rel_tol) for k, v in expected.items())
        )
    if actual is None:
        return False
    return match_answer(actual, expected, rel_tol=rel_tol)


class FileCheck:
    """Base of the checks: `name` (the sub-score name) and `path` (relative to the workspace)."""

    name: str
    path: str

    def _file(self, workspace: Path) -> Path:
        check_relative_path(self.path)
        return Path(workspace) / self.path

    def run(self, workspace: Path) -> CheckOutcome:
        target = self._file(workspace)
        refused = refuse_outside(Path(workspace), target)
        if refused:
            return _fail(f"{self.path} {refused}")
        if not target.is_file():
            return _fail(f"{self.path} does not exist")
        try:
            return self._check(target)
        except (UnicodeDecodeError, ValueError, KeyError, IndexError, TypeError, OSError, sqlite3.Error) as exc:
            return _fail(f"{self.path} could not be read as expected: {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - third-party parsers raise their own errors on junk files
            if type(exc).__module__.split(".")[0] in {"openpyxl", "docx", "zipfile", "lxml", "PIL"}:
                return _fail(f"{self.path} is malformed: {type(exc).__name__}: {exc}")
            raise

    def _check(self, target: Path) -> CheckOutcome:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass
class FileExists(FileCheck):
    path: str
    name: str = ""
    non_empty: bool = False

    def __post_init__(self) -> None:
        self.name = self.name or f"exists:{self.path}"

    def _check(self, target: Path) -> CheckOutcome:
        if self.non_empty and target.stat().st_size == 0:
            return _fail(f"{self.path} is empty")
        return _ok(f"{self.path} exists")


@dataclass
class TextMatches(FileCheck):
    """Text of a file: `exact`, `normalized` (case/space/punctuation-insensitive), `contains` or `regex`."""

    path: str
    expected: str | Sequence[str]
    mode: Literal["exact", "normalized", "contains", "regex"] = "normalized"
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"text:{self.path}"
        if self.mode not in ("exact", "normalized", "contains", "regex"):
            raise VerifierConfigError(f"TextMatches mode {self.mode!r}; use exact, normalized, contains or regex")

    def _check(self, target: Path) -> CheckOutcome:
        text = target.read_text(encoding="utf-8")
        wanted = [self.expected] if isinstance(self.expected, str) else list(self.expected)
        if self.mode == "exact":
            ok = text == wanted[0] or text.rstrip("\n") == wanted[0].rstrip("\n")
            return _ok() if ok else _fail(f"{self.path} differs from the expected text")
        if self.mode == "normalized":
            ok = normalize_text(text) == normalize_text(wanted[0])
            return _ok() if ok else _fail(f"{self.path} does not match the expected text (normalized)")
        if self.mode == "contains":
            norm = normalize_text(text)
            missing = [w for w in wanted if normalize_text(w) not in norm]
            score = 1.0 - len(missing) / len(wanted)
            return CheckOutcome(score, "all present" if not missing else f"{self.path} lacks {missing}")
        missing = [w for w in wanted if not re.search(w, text, re.MULTILINE)]
        return CheckOutcome(1.0 - len(missing) / len(wanted), "all match" if not missing else f"no match for {missing}")


@dataclass
class AnswerMatches(FileCheck):
    """A short answer file (answer.txt) compared with `match_answer`."""

    path: str
    expected: Any
    rel_tol: float = 1e-2
    abs_tol: float = 1e-9
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"answer:{self.path}"

    def _check(self, target: Path) -> CheckOutcome:
        text = target.read_text(encoding="utf-8").strip()
        if match_answer(text, self.expected, rel_tol=self.rel_tol, abs_tol=self.abs_tol):
            return _ok(f"{self.path} = {text[:60]!r} matches {self.expected!r}")
        return _fail(f"{self.path} = {text[:60]!r}, expected {self.expected!r}")


@dataclass
class CsvMatches(FileCheck):
    """CSV structure and values: required `columns`, `row_count`, expected `rows` (dicts by column).

    With `key` set, rows are matched by that column (order-insensitive); otherwise `ordered` decides.
    The score is the fraction of the requested facts that hold.
    """

    path: str
    columns: Sequence[str] | None = None
    rows: Sequence[Mapping[str, Any]] | None = None
    row_count: int | None = None
    key: str | None = None
    ordered: bool = True
    rel_tol: float = 1e-2
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"csv:{self.path}"
        if self.columns is None and self.rows is None and self.row_count is None:
            raise VerifierConfigError("CsvMatches needs at least one of columns, rows, row_count")

    def _check(self, target: Path) -> CheckOutcome:
        text = target.read_text(encoding="utf-8-sig")
        reader = csv.DictReader(io.StringIO(text))
        header = [h.strip() for h in (reader.fieldnames or [])]
        if not header:
            return _fail(f"{self.path} has no header row")
        data = [{(k or "").strip(): (v or "").strip() for k, v in row.items()} for row in reader]
        facts: list[tuple[bool, str]] = []
        if self.columns is not None:
            norm_header = [normalize_text(h) for h in header]
            missing = [c for c in self.columns if normalize_text(c) not in norm_header]
            facts.append((not missing, f"missing columns {missing}" if missing else "columns ok"))
        if self.row_count is not None:
            facts.append((len(data) == self.row_count, f"{len(data)} rows, expected {self.row_count}"))
        if self.rows is not None:
            by_norm = {normalize_text(h): h for h in header}

            def cell(row: Mapping[str, str], col: str) -> str | None:
                real = by_norm.get(normalize_text(col))
                return row.get(real) if real is not None else None

            def same(row: Mapping[str, str], want: Mapping[str, Any]) -> bool:
                return all(values_match(cell(row, c), v, self.rel_tol) for c, v in want.items())

            expected = list(self.rows)
            if self.key is not None:
                found = 0
                for want in expected:
                    cands = [r for r in data if values_match(cell(r, self.key), want[self.key], self.rel_tol)]
                    found += any(same(r, want) for r in cands)
                ok = found == len(expected) and len(data) == len(expected)
                facts.append((ok, f"{found}/{len(expected)} expected rows found, {len(data)} rows in file"))
            elif self.ordered:
                ok = len(data) == len(expected) and all(same(r, w) for r, w in zip(data, expected))
                facts.append((ok, "rows match in order" if ok else "rows differ from the expected rows (in order)"))
            else:
                remaining = list(data)
                for want in expected:
                    hit = next((r for r in remaining if same(r, want)), None)
                    if hit is not None:
                        remaining.remove(hit)
                ok = not remaining and len(data) == len(expected)
                facts.append((ok, "rows match" if ok else "rows differ from the expected rows"))
        score = sum(ok for ok, _ in facts) / len(facts)
        return CheckOutcome(score, "; ".join(d for _, d in facts))


def _json_get(data: Any, dotted: str) -> Any:
    cur = data
    for part in dotted.split(".") if dotted else []:
        if isinstance(cur, list):
            cur = cur[int(part)]
        elif isinstance(cur, Mapping):
            if part not in cur:
                raise KeyError(dotted)
            cur = cur[part]
        else:
            raise KeyError(dotted)
    return cur


@dataclass
class JsonMatches(FileCheck):
    """JSON values at dotted paths (`"totals.north"`, `"items.0.name"`) and required keys/types."""

    path: str
    expected: Mapping[str, Any] = field(default_factory=dict)
    required: Sequence[str] = ()
    rel_tol: float = 1e-2
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"json:{self.path}"
        if not self.expected and not self.required:
            raise VerifierConfigError("JsonMatches needs `expected` values or `required` keys")

    def _check(self, target: Path) -> CheckOutcome:
        try:
            data = json.loads(target.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            return _fail(f"{self.path} is not valid JSON: {exc}")
        facts: list[tuple[bool, str]] = []
        for key in self.required:
            try:
                _json_get(data, key)
                facts.append((True, f"{key} present"))
            except (KeyError, IndexError, ValueError):
                facts.append((False, f"{key} missing"))
        for key, want in self.expected.items():
            try:
                got = _json_get(data, key)
            except (KeyError, IndexError, ValueError):
                facts.append((False, f"{key} missing"))
                continue
            ok = values_match(got, want, self.rel_tol)
            facts.append((ok, f"{key}={_shown(got)}" + ("" if ok else f" (expected {want!r})")))
        score = sum(ok for ok, _ in facts) / len(facts)
        return CheckOutcome(score, "; ".join(d for ok, d in facts if not ok) or "all values match")


@dataclass
class SqliteQuery(FileCheck):
    """Run `query` on a SQLite file (opened read-only) and compare its rows with `expected`."""

    path: str
    query: str
    expected: Sequence[Sequence[Any]]
    ordered: bool = False
    rel_tol: float = 1e-2
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"sqlite:{self.path}"

    def _check(self, target: Path) -> CheckOutcome:
        if not target.read_bytes()[:16].startswith(b"SQLite format 3"):
            return _fail(f"{self.path} is not a SQLite database")
        conn = sqlite3.connect(f"file:{target}?mode=ro", uri=True)
        try:
            rows = [tuple(r) for r in conn.execute(self.query).fetchall()]
        finally:
            conn.close()
        want = [tuple(r) for r in self.expected]
        if self.ordered:
            ok = values_match(rows, want, self.rel_tol)
        else:
            key = lambda r: tuple(str(v) for v in r)  # noqa: E731
            ok = values_match(sorted(rows, key=key), sorted(want, key=key), self.rel_tol) or values_match(
                sorted(map(list, rows), key=key), sorted(map(list, want), key=key), self.rel_tol
            )
        return (
            _ok(f"query returned the expected {len(want)} rows")
            if ok
            else _fail(f"query returned {_shown(rows[:5])}{'...' if len(rows) > 5 else ''}, expected {want[:5]!r}")
        )


@dataclass
class XlsxCells(FileCheck):
    """Cell values of a spreadsheet: {"Sheet1!B3": 42, "C7": "North"} (no sheet: the active sheet)."""

    path: str
    cells: Mapping[str, Any]
    rel_tol: float = 1e-2
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"xlsx:{self.path}"
        if not self.cells:
            raise VerifierConfigError("XlsxCells needs at least one cell")

    def _check(self, target: Path) -> CheckOutcome:
        import openpyxl

        wb = openpyxl.load_workbook(target, data_only=True, read_only=True)
        try:
            good, bad = 0, []
            for ref, want in self.cells.items():
                sheet_name, _, coord = ref.rpartition("!")
                if sheet_name and sheet_name not in wb.sheetnames:
                    bad.append(f"{ref}: no sheet {sheet_name!r}")
                    continue
                ws = wb[sheet_name] if sheet_name else wb.active
                got = ws[coord].value
                if values_match(got, want, self.rel_tol):
                    good += 1
                else:
                    bad.append(f"{ref}={_shown(got)} (expected {want!r})")
        finally:
            wb.close()
        return CheckOutcome(good / len(self.cells), "; ".join(bad) or "all cells match")


def docx_text(path: Path) -> str:
    """All paragraph and table text of a .docx file, one paragraph per line."""
    import docx

    document = docx.Document(str(path))
    parts = [p.text for p in document.paragraphs]
    for table in document.tables:
        for row in table.rows:
            parts.append(" | ".join(c.text for c in row.cells))
    return "\n".join(parts)


@dataclass
class DocxText(FileCheck):
    """Text of a Word document: `contains` these phrases (normalized), or `equals` a text."""

    path: str
    contains: Sequence[str] = ()
    equals: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"docx:{self.path}"
        if not self.contains and self.equals is None:
            raise VerifierConfigError("DocxText needs `contains` phrases or an `equals` text")

    def _check(self, target: Path) -> CheckOutcome:
        text = normalize_text(docx_text(target))
        if self.equals is not None:
            return _ok() if text == normalize_text(self.equals) else _fail(f"{self.path} text differs")
        missing = [p for p in self.contains if normalize_text(p) not in text]
        return CheckOutcome(1 - len(missing) / len(self.contains), f"lacks {missing}" if missing else "all present")


class FileChecksVerifier(BaseVerifier):
    """Runs file checks as named sub-scores; reward is their weighted mean.

    The checks run in a child process of `memory_mb` MiB of address space, killed at `timeout_s`.
    """

    def __init__(
        self,
        checks: Sequence[FileCheck],
        *,
        weights: Mapping[str, float] | None = None,
        name: str = "file_checks",
        timeout_s: float = 60.0,
        memory_mb: int = DEFAULT_MEMORY_MB,
    ) -> None:
        if not checks:
            raise VerifierConfigError("FileChecksVerifier needs at least one check")
        names = [c.name for c in checks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise VerifierConfigError(f"check names must be unique; repeated: {dupes} (pass name=...)")
        check_weights(names, dict(weights or {}))
        self.checks = list(checks)
        self.weights = dict(weights or {})
        self.name = name
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb

    def run_checks(self, workspace: Path) -> VerifierResult:
        outcomes = {c.name: c.run(workspace) for c in self.checks}
        scores = {k: o.score for k, o in outcomes.items()}
        lines = [f"{'PASS' if o.passed else 'FAIL'} {k}: {o.detail}" for k, o in outcomes.items()]
        return VerifierResult(
            reward=weighted_mean(scores, self.weights), subscores=scores, explanation="\n".join(lines)
        )

    async def _verify(self, ctx: VerifyContext) -> VerifierResult:
        async with host_workspace(ctx) as workspace:
            try:
                return await run_isolated(
                    self.run_checks, workspace, timeout_s=self.timeout_s, memory_mb=self.memory_mb
                )
            except CheckLimitError as exc:
                return VerifierResult.failure(f"{self.name} {exc}")
