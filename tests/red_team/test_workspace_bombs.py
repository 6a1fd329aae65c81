"""Workspace and output bombs: what an agent leaves in its sandbox must not reach the host unbounded.

Each attack runs from inside a real sandbox (as a harness's bash tool would) and is then verified through
`verify_stage`, as `run_rollout` does after the harness returned. Asserted every time: no exception, no
host folder left behind, the host copy bounded (what it wrote on disk, what the DownloadReport refused),
and the host's event loop (shared with every other rollout's model calls) never stalled for a second.

  * 4,096 nested folders (Python 3.11's shutil.rmtree and os.fwalk recurse: RecursionError);
  * sparse files (4 KiB in the sandbox, their full length on the host);
  * hard links (one inode, written once per name);
  * many tiny files (the copy's removal on the event loop);
  * `head -c 300M /dev/zero; echo; echo 0.5` (every byte kept in host memory), locally and through Daytona.

Each bomb is sized so that the unfixed code stays well under 2 GB of host memory and disk (it failed every
test here: see docs/security.md for what it did), and every test removes what it made with `rm -rf` (pytest's
own clean-up recurses).
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

from clawgym_env.interfaces import SandboxLimits
from clawgym_env.rollout import verify_stage
from clawgym_env.sandbox import host_files, local_sandbox
from clawgym_env.sandbox.local_backend import LocalSandboxBackend
from clawgym_env.specs import EnvOptions, TaskSpec, WorkspaceSpec
from tests.red_team.loop_lag import LoopLag
from verifiers.script import ScriptVerifier

MiB = 1 << 20


def make_task(verifier=None) -> TaskSpec:
    return TaskSpec(id="bomb", instruction="x", workspace=WorkspaceSpec(files={}), verifier=verifier or (lambda d: 0.0))


@pytest.fixture
def host_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where verify_stage makes its host copy (tempfile's folder), to see what it leaves behind."""
    folder = tmp_path / "host-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    subprocess.run(["rm", "-rf", "--", str(folder)], check=False)  # whatever a failed guard left (of any depth)


def left_behind(host_tmp: Path) -> list[str]:
    return [p.name for p in host_tmp.iterdir() if p.name.startswith("clawgym-verify-")]


def bytes_on_disk(root: Path) -> int:
    """What a folder holds on disk (st_blocks), each inode once; no recursion."""
    seen: set[tuple[int, int]] = set()
    total, stack = 0, [str(root)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                if (info.st_dev, info.st_ino) in seen:
                    continue
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
    return total


async def verify(box, task: TaskSpec) -> tuple:
    """run_rollout's verification stage (no artifacts kept: the host copy is a temporary folder)."""
    async with LoopLag() as lag:
        verdict = await verify_stage(task, box, None, "r-bomb", None, EnvOptions())
        await asyncio.sleep(0.05)  # let the ticker wake once more: a stall at the very end counts too
    return verdict, lag


def measuring_verifier(measured: dict):
    async def check(workspace: Path) -> float:  # what the host copy holds, measured off the event loop
        measured["bytes"] = await asyncio.to_thread(bytes_on_disk, workspace)
        measured["names"] = sorted(os.listdir(workspace))
        measured["dir"] = workspace
        return 0.0

    return check


# ------------------------------------------------------------------------------------ workspace bombs
NEST = """
import os
for _ in range(4096):
    os.mkdir("d")
    os.chdir("d")
open("deep.txt", "w").write("x")
"""


@pytest.fixture
def sandbox_root(tmp_path: Path) -> Path:
    """The backend's root (conftest: tmp_path / "sandboxes"), removed with `rm -rf` after the backend closed
    (ask for it before `backend`): a failed guard leaves a 4,096-deep tree there, which pytest cannot remove."""
    yield tmp_path / "sandboxes"
    subprocess.run(["rm", "-rf", "--", str(tmp_path / "sandboxes")], check=False)


@pytest.mark.parametrize("workspace", ["tmpfs", "host folder"])
async def test_thousands_of_nested_folders_neither_raise_nor_stay_on_the_host(
    sandbox_root: Path, backend: LocalSandboxBackend, host_tmp: Path, monkeypatch: pytest.MonkeyPatch, workspace: str
) -> None:
    if workspace == "host folder":  # as where the host cannot mount: the tree is on host disk until removal
        monkeypatch.setattr(local_sandbox, "mount_workspace", lambda path, size_mb: False)
    measured: dict = {}
    task = make_task(measuring_verifier(measured))
    async with await backend.create(task) as box:
        made = await box.exec(["python3", "-c", NEST])
        assert made.exit_code == 0, made.stderr
        await box.exec("echo 42 > answer.txt")
        verdict, lag = await verify(box, task)  # raised RecursionError (shutil.rmtree in its finally)
        report = box.last_download
        async with LoopLag() as removal:  # the sandbox's own removal (rm -rf of its folder, in a thread)
            await box.destroy()
            await box.wait_removed()
    assert verdict.error is None, verdict
    assert measured["names"] == ["answer.txt", "d"] and measured["bytes"] < 2 * MiB, measured
    depth = host_files.MAX_DEPTH
    assert report.folders == depth and report.files == 1, report  # pruned at the depth limit
    assert sum(n for why, n in report.refused.items() if "deeper" in why) == 1, report.refused
    assert [why for why in report.skipped.values() if "deeper" in why] == [f"deeper than {depth} folders"]
    assert left_behind(host_tmp) == [] and not box.host_dir.exists()
    assert lag.worst_s < 1.0 and removal.worst_s < 1.0, (lag.worst_s, removal.worst_s)


async def test_sparse_files_are_not_expanded_on_the_host(backend: LocalSandboxBackend, host_tmp: Path) -> None:
    measured: dict = {}
    task = make_task(measuring_verifier(measured))
    limits = SandboxLimits(workspace_mb=16)  # 16 sparse files at the size limit: 256 MiB long, nothing used
    async with await backend.create(task, limits=limits) as box:
        made = await box.exec("for i in $(seq 16); do truncate -s 16M sparse$i || exit 1; done; du -sk . | cut -f1")
        assert made.exit_code == 0 and int(made.stdout) < 1024, made
        verdict, lag = await verify(box, task)  # wrote 256 MiB to the host
        report = box.last_download
    assert verdict.error is None, verdict
    assert measured["bytes"] < MiB, measured["bytes"]  # the budget is the workspace's size; holes stay holes
    assert report.bytes <= 16 * MiB and len(measured["names"]) <= 1, (report, measured["names"])
    assert sum(n for why, n in report.refused.items() if "size" in why) >= 15, report.refused
    assert len([why for why in report.skipped.values() if "size" in why]) >= 15, report.skipped  # listed by name
    assert left_behind(host_tmp) == []
    assert lag.worst_s < 1.0, lag.worst_s


LINK_FARM = """
import os
with open("base", "wb") as f:
    f.write(os.urandom(512 << 10))
for i in range(500):
    os.link("base", f"l{i}")
"""


async def test_hard_links_are_copied_once_and_relinked(backend: LocalSandboxBackend, host_tmp: Path) -> None:
    measured: dict = {}
    links: dict = {}

    async def check(workspace: Path) -> float:
        await measuring_verifier(measured)(workspace)
        links["nlink"] = os.stat(workspace / "l499").st_nlink
        links["same"] = os.path.samefile(workspace / "base", workspace / "l499")
        return 0.0

    task = make_task(check)
    async with await backend.create(task, limits=SandboxLimits(workspace_mb=64)) as box:
        made = await box.exec(["python3", "-c", LINK_FARM])
        assert made.exit_code == 0, made.stderr
        verdict, lag = await verify(box, task)  # 512 KiB in the sandbox; 250 MiB on the host before
        report = box.last_download
    assert verdict.error is None, verdict
    assert measured["bytes"] < 2 * MiB, measured["bytes"]
    assert links == {"nlink": 501, "same": True} and len(measured["names"]) == 501
    assert report.files == 1 and report.hard_links == 500 and report.bytes == 512 << 10, report
    assert left_behind(host_tmp) == []
    assert lag.worst_s < 1.0, lag.worst_s


LINK_CHAIN = """
import os
open("answer.txt", "w").write("42")
os.symlink("answer.txt", "c0")
for i in range(1, 1200):
    os.symlink(f"c{i - 1}", f"c{i}")
"""


async def test_a_long_symlink_chain_is_refused_not_resolved_recursively(
    backend: LocalSandboxBackend, host_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_files, "MAX_LINKS", 1000, raising=False)  # the default (10,000) holds 10x more
    measured: dict = {}
    task = make_task(measuring_verifier(measured))
    async with await backend.create(task) as box:
        made = await box.exec(["python3", "-c", LINK_CHAIN])
        assert made.exit_code == 0, made.stderr
        verdict, lag = await verify(box, task)  # os.path.realpath recursed once per link: RecursionError
        report = box.last_download
    assert verdict.error is None, verdict
    assert report.links <= 1000 and report.refused.get("over the limit of 1000 links") == 200, report.refused
    # the kernel resolves at most 40 links: a link deeper in the chain is dropped, those that dangle since stay
    assert report.links + sum(report.refused.values()) == 1200 and report.files == 1, report
    assert len(measured["names"]) == 1 + report.links, len(measured["names"])
    assert left_behind(host_tmp) == []
    assert lag.worst_s < 1.0, lag.worst_s


TINY_FILES = """
import os
for d in range(60):
    os.mkdir(f"d{d}")
    for i in range(1000):
        open(f"d{d}/f{i}", "w").close()
"""


async def test_many_tiny_files_do_not_stall_the_event_loop(backend: LocalSandboxBackend, host_tmp: Path) -> None:
    task = make_task()
    async with await backend.create(task) as box:
        made = await box.exec(["python3", "-c", TINY_FILES], timeout_s=60)
        assert made.exit_code == 0, made.stderr
        verdict, lag = await verify(box, task)  # the copy's rmtree ran on the event loop
        report = box.last_download
    assert verdict.error is None, verdict
    assert report.files == 60_000, report
    assert left_behind(host_tmp) == []
    # removing the copy on the event loop stalled it 0.5-0.95 s here (copy and removal now run in threads:
    # 0.02-0.1 s), so the bound is tighter than the others' 1 s
    assert lag.worst_s < 0.3, lag.worst_s


# ------------------------------------------------------------------------------------- output bombs
class PeakRss:
    """The host process's peak RSS growth while the block runs (sampled every 5 ms)."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.base = self.peak = self.process.memory_info().rss

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self.process.memory_info().rss)
            await asyncio.sleep(0.005)

    async def __aenter__(self) -> PeakRss:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.base


async def test_command_output_is_capped_keeping_head_and_tail(backend: LocalSandboxBackend) -> None:
    task = make_task(ScriptVerifier("head -c 300M /dev/zero; echo; echo 0.5", timeout_s=60))
    async with await backend.create(task) as box:
        async with PeakRss() as rss, LoopLag() as lag:
            result = await box.exec("echo first; head -c 300M /dev/zero; echo; echo 0.5", timeout_s=60)
        assert rss.growth < 128 * MiB, rss.growth  # all 300 MiB (and copies) were kept
        assert lag.worst_s < 1.0, lag.worst_s
        assert result.exit_code == 0
        assert result.stdout.startswith("first\n") and result.stdout.splitlines()[-1] == "0.5"
        cap = box.limits.max_output_bytes
        assert result.stdout_dropped_bytes == 300 * MiB + 11 - cap and result.stderr_dropped_bytes == 0
        assert f"{result.stdout_dropped_bytes} bytes dropped" in result.stdout
        assert len(result.stdout) < cap + 200
        verdict, _ = await verify(box, task)  # a script verifier reads the reward from the last line
    assert verdict.error is None and verdict.reward == 0.5, verdict


async def test_daytona_command_output_is_capped_keeping_head_and_tail(tmp_path: Path) -> None:
    pytest.importorskip("daytona")
    from clawgym_env.sandbox import make_backend
    from tests.sandbox.daytona_standin import DaytonaApiStandIn

    standin = DaytonaApiStandIn()
    await standin.start()
    try:
        backend = make_backend("daytona", api_key="k", api_url=standin.base_url)
        task = TaskSpec(id="bomb", instruction="x", mount_path=str(tmp_path / "ws"), verifier=lambda d: 0.0)
        async with backend, await backend.create(task, limits=SandboxLimits(max_output_bytes=MiB)) as box:
            result = await box.exec("echo first; head -c 64M /dev/zero; echo; echo 0.5; head -c 8M /dev/zero >&2")
    finally:
        await standin.stop()
    assert result.exit_code == 0, result.stderr[-300:]
    assert result.stdout.startswith("first\n") and result.stdout.splitlines()[-1] == "0.5"
    assert result.stdout_dropped_bytes == 64 * MiB + 11 - MiB and result.stderr_dropped_bytes == 7 * MiB
    assert len(result.stdout) < MiB + 200 and len(result.stderr) < MiB + 200
