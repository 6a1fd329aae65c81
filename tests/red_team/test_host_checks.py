"""Host-side checks against files built to be slow or huge to parse.

`FileChecksVerifier`, `CheckFunctionVerifier`, RubricVerifier's code criteria and PinchBench's grader read what the
policy wrote, on the host. In a worker thread they held the GIL while they parsed: a .xlsx whose shared string
inflates from 43 KB to 40 MB, or a 50 MB answer.txt run through `match_answer`'s regular expressions, froze the
event loop every other rollout's model calls share, grew the host's memory by hundreds of MB, and ran on past the
verifier's timeout (a thread cannot be killed). Each attack goes through `verify()` on a host copy of the
workspace, as `verify_stage` runs it; asserted:

  * the event loop never stalls for a second (`LoopLag`);
  * this process's peak RSS grows by less than 200 MB (the parsing happens in a child process);
  * a check past its time or memory limit ends there, as a verifier failure that names the limit, and what it
    started is killed with it.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
import zipfile
from pathlib import Path

import psutil

from clawgym_env.interfaces import VerifierResult, VerifyContext
from tests.red_team.loop_lag import LoopLag
from verifiers import AnswerMatches, CheckFunctionVerifier, FileChecksVerifier, XlsxCells

MiB = 1 << 20
BOMB_MB = 40  # the shared string, inflated; the unfixed code took ~15 s, ~9 s of it with the loop stalled
TIME_LIMIT_S = 4.0
MAX_STALL_S = 1.0
MAX_RSS_GROWTH_MB = 200

_SHEET_NS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_REL_NS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_PKG_REL_NS = "http://schemas.openxmlformats.org/package/2006/relationships"
_XLSX_PARTS = {
    "[Content_Types].xml": (
        '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
        '<Default Extension="xml" ContentType="application/xml"/>'
        '<Override PartName="/xl/workbook.xml" '
        'ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
        '<Override PartName="/xl/worksheets/sheet1.xml" '
        'ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
        '<Override PartName="/xl/sharedStrings.xml" '
        'ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/></Types>'
    ),
    "_rels/.rels": (
        f'<Relationships xmlns="{_PKG_REL_NS}"><Relationship Id="rId1" '
        f'Type="{_REL_NS}/officeDocument" Target="xl/workbook.xml"/></Relationships>'
    ),
    "xl/workbook.xml": (
        f'<workbook xmlns="{_SHEET_NS}" xmlns:r="{_REL_NS}">'
        '<sheets><sheet name="Sheet1" sheetId="1" r:id="rId1"/></sheets></workbook>'
    ),
    "xl/_rels/workbook.xml.rels": (
        f'<Relationships xmlns="{_PKG_REL_NS}">'
        f'<Relationship Id="rId1" Type="{_REL_NS}/worksheet" Target="worksheets/sheet1.xml"/>'
        f'<Relationship Id="rId2" Type="{_REL_NS}/sharedStrings" Target="sharedStrings.xml"/></Relationships>'
    ),
    "xl/worksheets/sheet1.xml": (
        f'<worksheet xmlns="{_SHEET_NS}"><sheetData>'
        '<row r="1"><c r="A1" t="s"><v>0</v></c></row></sheetData></worksheet>'
    ),
}


def write_xlsx_bomb(path: Path, inflated_mb: int) -> None:
    """A valid workbook whose A1 is shared string 0: one `<t>` of `inflated_mb` MiB of "A", deflated ~1000:1."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, xml in _XLSX_PARTS.items():
            zf.writestr(name, '<?xml version="1.0" encoding="UTF-8"?>' + xml)
        with zf.open("xl/sharedStrings.xml", "w", force_zip64=True) as out:
            out.write(f'<?xml version="1.0" encoding="UTF-8"?><sst xmlns="{_SHEET_NS}" count="1"><si><t>'.encode())
            for _ in range(inflated_mb):
                out.write(b"A" * MiB)
            out.write(b"</t></si></sst>")


class PeakRss:
    """By how many MB this process's peak RSS during the block exceeded its RSS (psutil) at the start: the
    kernel's high-water mark (VmHWM, reset through /proc/self/clear_refs), which a sampler thread starved of the
    GIL would miss."""

    def __enter__(self) -> PeakRss:
        self.before = psutil.Process().memory_info().rss
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current RSS
        return self

    def __exit__(self, *exc: object) -> None:
        status = Path("/proc/self/status").read_text()
        peak = int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE).group(1)) * 1024
        self.growth_mb = round((peak - self.before) / MiB)


async def verify_measured(verifier, workspace: Path) -> tuple[VerifierResult, dict[str, float]]:
    """`verifier.verify()` on a host copy of the workspace, with the loop's worst stall, RSS growth, duration."""
    with PeakRss() as rss:
        async with LoopLag() as lag:
            start = time.monotonic()
            result = await verifier.verify(VerifyContext(sandbox=None, task=None, workspace_dir=workspace))
            elapsed = time.monotonic() - start
    measured = {"elapsed_s": round(elapsed, 1), "stall_s": round(lag.worst_s, 2), "rss_growth_mb": rss.growth_mb}
    return result, {**measured, "error": result.error, "explanation": result.explanation[:300]}


async def test_a_spreadsheet_bomb_ends_at_its_time_limit_without_stalling_the_loop(tmp_path: Path) -> None:
    write_xlsx_bomb(tmp_path / "report.xlsx", BOMB_MB)
    assert (tmp_path / "report.xlsx").stat().st_size < 100_000
    verifier = FileChecksVerifier([XlsxCells("report.xlsx", {"Sheet1!A1": 42})], timeout_s=TIME_LIMIT_S)
    result, measured = await verify_measured(verifier, tmp_path)
    assert result.reward == 0.0 and result.error, measured
    assert re.search(rf"(timed out after|time limit of) {TIME_LIMIT_S:g} s", result.error), measured
    assert measured["elapsed_s"] < TIME_LIMIT_S + 1.5, measured
    assert measured["stall_s"] < MAX_STALL_S, measured
    assert measured["rss_growth_mb"] < MAX_RSS_GROWTH_MB, measured


async def test_a_50_mb_answer_is_matched_without_stalling_the_loop(tmp_path: Path) -> None:
    with open(tmp_path / "answer.txt", "w") as out:  # "1 1 1 ...": 50 MiB, written a MiB at a time
        for _ in range(50):
            out.write("1 " * (MiB // 2))
    verifier = FileChecksVerifier([AnswerMatches("answer.txt", 42)], timeout_s=20)
    result, measured = await verify_measured(verifier, tmp_path)
    assert result.reward == 0.0, measured  # a wrong answer, or (on a slow machine) its time limit
    assert result.error is None or "20 s" in result.error, measured
    assert measured["stall_s"] < MAX_STALL_S, measured
    assert measured["rss_growth_mb"] < MAX_RSS_GROWTH_MB, measured


def allocate(workspace: Path, mb: int) -> bool:
    return len(bytearray(mb * MiB)) > 0


async def test_a_check_past_its_memory_limit_fails_naming_the_limit(tmp_path: Path) -> None:
    verifier = CheckFunctionVerifier(lambda ws: allocate(ws, 1024), name="greedy", memory_mb=512)
    result, measured = await verify_measured(verifier, tmp_path)
    assert result.reward == 0.0 and result.error and "memory limit is 512 MiB" in result.error, measured
    assert measured["stall_s"] < MAX_STALL_S and measured["rss_growth_mb"] < MAX_RSS_GROWTH_MB, measured


def start_a_sleeper(workspace: Path) -> float:
    sleeper = subprocess.Popen(["sleep", "25"])
    (workspace / "sleeper.pid").write_text(str(sleeper.pid))
    time.sleep(20)
    return 1.0


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_what_a_check_started_is_killed_at_its_time_limit(tmp_path: Path) -> None:
    verifier = CheckFunctionVerifier(start_a_sleeper, timeout_s=2)
    result, measured = await verify_measured(verifier, tmp_path)
    assert result.error and re.search(r"(timed out after|time limit of) 2 s", result.error), measured
    pid = int((tmp_path / "sleeper.pid").read_text())
    for _ in range(20):
        if not running(pid):
            break
        await asyncio.sleep(0.1)
    assert not running(pid), f"the check's `sleep 25` (pid {pid}) outlived its time limit"
