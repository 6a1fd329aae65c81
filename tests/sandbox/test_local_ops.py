"""The local backend's operations on real bubblewrap sandboxes: seed, exec, files, download, destroy, reap."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import openpyxl
import psutil
import pytest

from clawgym_env.interfaces import Sandbox, SandboxBackend, SandboxUnavailable
from clawgym_env.sandbox import make_backend
from clawgym_env.sandbox.local_backend import LocalSandboxBackend, SandboxError, reap_leftovers
from clawgym_env.specs import WorkspaceSpec
from tests.sandbox.conftest import make_task

pytestmark = pytest.mark.usefixtures("sandbox_init")  # every test with the C and the Python init


def _running(pid: int) -> bool:
    """True if the process exists and is not a zombie waiting for a parent that is gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _xlsx_bytes(tmp_path: Path) -> bytes:
    book = openpyxl.Workbook()
    book.active.append(["item", "qty"])
    book.active.append(["apple", 3])
    path = tmp_path / "seed.xlsx"
    book.save(path)
    return path.read_bytes()


def _sqlite_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "seed.db"
    with sqlite3.connect(path) as db:
        db.execute("create table t (name text, n int)")
        db.execute("insert into t values ('x', 42)")
    return path.read_bytes()


async def test_protocols_and_make_backend(backend: LocalSandboxBackend) -> None:
    assert isinstance(backend, SandboxBackend)
    async with await backend.create(make_task()) as box:
        assert isinstance(box, Sandbox)
    with pytest.raises(ValueError, match="unknown sandbox backend 'docker'"):
        make_backend("docker")
    made = make_backend("local", root=backend.root)
    assert made.name == "local"


async def test_seeding_binary_files_folders_and_functions(sandbox_root: Path, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    (folder / "docs").mkdir(parents=True)
    (folder / "docs" / "readme.md").write_text("# seeded folder")

    def seed(ws: Path) -> None:
        (ws / "made_by_function.json").write_text(json.dumps({"ok": True}))

    workspace = WorkspaceSpec(
        files={"data/book.xlsx": _xlsx_bytes(tmp_path), "data/app.db": _sqlite_bytes(tmp_path), "hi.txt": "hi"},
        directory=folder,
        function=seed,
    )
    # the venv's python (with openpyxl) is visible read-only; its base interpreter may sit under the private
    # /root, so it is bound in the way a harness install would be
    backend = LocalSandboxBackend(root=sandbox_root, ro_binds={sys.base_prefix: sys.base_prefix})
    async with backend, await backend.create(make_task(workspace)) as box:
        check = (
            "import openpyxl, sqlite3, json\n"
            "ws = openpyxl.load_workbook('data/book.xlsx').active\n"
            "db = sqlite3.connect('data/app.db')\n"
            "print(ws['A2'].value, ws['B2'].value, db.execute('select n from t').fetchone()[0],"
            " open('docs/readme.md').read(), json.load(open('made_by_function.json'))['ok'])\n"
        )
        result = await box.exec([sys.executable, "-c", check])
        assert result.exit_code == 0, result.stderr
        assert result.stdout.split() == ["apple", "3", "42", "#", "seeded", "folder", "True"]
        assert sorted(await box.list_files()) == [
            "data/app.db",
            "data/book.xlsx",
            "docs/readme.md",
            "hi.txt",
            "made_by_function.json",
        ]


async def test_exec_argv_shell_cwd_env_stdin_and_exit_codes(backend: LocalSandboxBackend) -> None:
    async with await backend.create(make_task({"sub/f.txt": "in sub"})) as box:
        shell = await box.exec("echo out; echo err >&2; exit 3")
        assert (shell.exit_code, shell.stdout, shell.stderr, shell.killed_reason) == (3, "out\n", "err\n", None)
        assert shell.duration_s > 0
        cwd = await box.exec(["cat", "f.txt"], cwd="sub")
        assert cwd.stdout == "in sub"
        assert (await box.exec(["pwd"])).stdout.strip() == box.workspace_path
        env = await box.exec("echo $GREETING $HOME", env={"GREETING": "hello"})
        assert env.stdout.strip() == "hello /root"
        piped = await box.exec(["wc", "-c"], stdin=b"x" * 300_000)
        assert piped.stdout.strip() == "300000"
        big = await box.exec(["head", "-c", "2000000", "/dev/zero"])
        assert len(big.stdout) == 2_000_000
        missing = await box.exec(["no-such-program"])
        assert missing.exit_code == 127 and "no-such-program" in missing.stderr
        not_executable = await box.exec(["./f.txt"], cwd="sub")
        assert not_executable.exit_code == 127 and "Permission denied" in not_executable.stderr
        no_cwd = await box.exec(["true"], cwd="no-such-folder")
        assert no_cwd.exit_code == 127 and "no-such-folder" in no_cwd.stderr
        # the PATH searched is the command's own (per-call env), as execvp would
        tool = "#!/bin/sh\necho from my tool\n"
        await box.write_file("bin/mytool", tool)
        await box.exec(["chmod", "+x", "bin/mytool"])
        mine = await box.exec(["mytool"], env={"PATH": f"{box.workspace_path}/bin:/usr/bin:/bin"})
        assert mine.stdout == "from my tool\n", mine


async def test_a_command_holds_only_its_stdin_stdout_stderr(backend: LocalSandboxBackend) -> None:
    # neither the control socket nor the pipe ends received by the init leak into commands
    async with await backend.create(make_task()) as box:
        listing = await box.exec(["python3", "-c", "import os; print(sorted(os.listdir('/proc/self/fd')))"])
        assert listing.stdout.strip() == "['0', '1', '2', '3']"  # 3: the listing's own folder handle
        groups = await box.exec("ps -o pid=,pgid=,sid= -p $$")  # own session and process group
        pid, pgid, sid = groups.stdout.split()
        assert pid == pgid == sid


async def test_host_environment_does_not_leak_in(backend: LocalSandboxBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN_FOR_TEST", "do-not-leak")
    async with await backend.create(make_task()) as box:
        result = await box.exec(["env"])
        assert "do-not-leak" not in result.stdout and "PATH=" in result.stdout


async def test_read_write_list_and_download(backend: LocalSandboxBackend, tmp_path: Path) -> None:
    async with await backend.create(make_task({"a.txt": "a"})) as box:
        await box.write_file("nested/b.bin", b"\x00\x01")
        await box.write_file(f"{box.workspace_path}/c.txt", "c")
        await box.write_file("/tmp/scratch/t.txt", "tmp")
        assert await box.read_file("nested/b.bin") == b"\x00\x01"
        assert await box.read_file("/tmp/scratch/t.txt") == b"tmp"
        assert (await box.exec(["cat", "/tmp/scratch/t.txt", "c.txt"])).stdout == "tmpc"
        assert await box.list_files() == ["a.txt", "c.txt", "nested/b.bin"]
        assert await box.list_files("nested") == ["b.bin"]
        # /tmp is private: only what this sandbox wrote, plus host folders bound back in read-only when the
        # checkout itself lives under /tmp (see host_paths_needed_inside)
        bound = tuple(str(p.relative_to("/tmp")) + "/" for p in backend.auto_binds if str(p).startswith("/tmp/"))
        assert [f for f in await box.list_files("/tmp") if not f.startswith(bound)] == ["scratch/t.txt"]
        await box.exec("echo result > out.txt && ln -s /etc/passwd link_to_host")
        dest = await box.download_workspace(tmp_path / "final")
        assert (dest / "out.txt").read_text() == "result\n"
        assert not (dest / "link_to_host").is_symlink()  # a link out of the workspace is not copied
        assert box.last_download.skipped == {"link_to_host": "link out of the workspace"}
        for bad in ("/etc/passwd", "../../etc/passwd", "/root/other"):
            with pytest.raises(PermissionError, match="outside the sandbox's workspace"):
                await box.read_file(bad)
        with pytest.raises(PermissionError, match="outside"):
            await box.write_file("/etc/evil", "x")


async def test_symlinks_made_inside_are_not_followed_by_host_file_access(
    backend: LocalSandboxBackend, tmp_path: Path
) -> None:
    secret = tmp_path / "host_secret.txt"
    secret.write_text("host only")
    async with await backend.create(make_task()) as box:
        await box.exec(f"ln -s {secret} leak.txt && ln -s {tmp_path} leakdir")
        with pytest.raises(FileNotFoundError, match="symlinks are not followed"):
            await box.read_file("leak.txt")
        with pytest.raises(PermissionError):
            await box.read_file("leakdir/host_secret.txt")
        with pytest.raises(PermissionError):
            await box.write_file("leakdir/new.txt", "x")
        assert not (tmp_path / "new.txt").exists()


def _running_commands(marker: str) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if marker in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


async def test_destroy_is_idempotent_and_removes_everything(backend: LocalSandboxBackend) -> None:
    box = await backend.create(make_task({"a.txt": "a"}))
    await box.exec("sleep 30.25 >/dev/null 2>&1 &")
    assert len(_running_commands("sleep 30.25")) == 1
    bwrap_pid = box._process.pid
    assert box.host_dir.exists()
    await box.destroy()  # returns once everything is killed; reaping and removal go on in the background
    await box.destroy()
    with pytest.raises(SandboxError, match="destroyed"):
        await box.exec("true")
    await box.wait_removed()
    assert not box.host_dir.exists()
    assert not _running(bwrap_pid)
    assert _running_commands("sleep 30.25") == []


async def test_destroyed_when_the_body_raises(backend: LocalSandboxBackend) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        async with backend.sandbox(make_task()) as box:
            host_dir = box.host_dir
            raise RuntimeError("boom")
    await backend.wait_removed()
    assert not host_dir.exists()


async def test_destroyed_when_cancelled(backend: LocalSandboxBackend) -> None:
    created: list = []

    async def rollout() -> None:
        async with backend.sandbox(make_task()) as box:
            created.append(box)
            await box.exec("sleep 30")

    task = asyncio.create_task(rollout())
    while not created:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await created[0].wait_removed()
    assert not created[0].host_dir.exists()


async def test_backend_aclose_destroys_what_is_left(sandbox_root: Path) -> None:
    backend = LocalSandboxBackend(root=sandbox_root)
    boxes = [await backend.create(make_task()) for _ in range(2)]
    await backend.aclose()
    assert all(not b.host_dir.exists() for b in boxes)


async def test_many_concurrent_sandboxes(backend: LocalSandboxBackend) -> None:
    async def one(i: int) -> str:
        async with backend.sandbox(make_task({"n.txt": str(i)})) as box:
            return (await box.exec("cat n.txt")).stdout

    assert await asyncio.gather(*(one(i) for i in range(8))) == [str(i) for i in range(8)]


SCRIPT_THAT_CRASHES = """
import asyncio, os, sys
sys.path.insert(0, {repo!r})
from clawgym_env.sandbox.local_backend import LocalSandboxBackend
from clawgym_env.specs import TaskSpec
async def main():
    backend = LocalSandboxBackend(root={root!r})
    box = await backend.create(TaskSpec(id="t", instruction="i", verifier=lambda d: 1.0))
    print(box.id, box._process.pid, flush=True)
    os._exit(1)  # a crash: no atexit, no destroy
asyncio.run(main())
"""

SCRIPT_THAT_EXITS = SCRIPT_THAT_CRASHES.replace("os._exit(1)", "sys.exit(0)")


def test_reaper_cleans_up_after_a_crashed_run(sandbox_root: Path) -> None:
    repo = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT_THAT_CRASHES.format(repo=repo, root=str(sandbox_root))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    box_id, bwrap_pid = done.stdout.split()
    assert (sandbox_root / box_id / "sandbox.json").exists()
    assert reap_leftovers(sandbox_root) == [box_id]
    assert not (sandbox_root / box_id).exists()
    assert not _running(int(bwrap_pid))
    assert reap_leftovers(sandbox_root) == []


def test_reaper_leaves_live_sandboxes_alone(sandbox_root: Path) -> None:
    async def scenario() -> None:
        async with LocalSandboxBackend(root=sandbox_root) as backend:
            box = await backend.create(make_task())
            assert reap_leftovers(sandbox_root) == []
            assert (await box.exec("echo alive")).stdout == "alive\n"

    asyncio.run(scenario())


def test_process_exit_destroys_sandboxes(sandbox_root: Path) -> None:
    repo = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT_THAT_EXITS.format(repo=repo, root=str(sandbox_root))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    box_id, _ = done.stdout.split()
    assert not (sandbox_root / box_id).exists()


SCRIPT_THAT_EXITS_WHILE_REMOVING = SCRIPT_THAT_CRASHES.replace(
    "os._exit(1)  # a crash: no atexit, no destroy",
    "await box.exec('sleep 30.75 >/dev/null 2>&1 &')\n    await box.destroy()\n    assert box.host_dir.exists()",
)  # then asyncio.run cancels the background removal and the interpreter exits


def test_exit_right_after_destroy_still_removes_everything(sandbox_root: Path) -> None:
    repo = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT_THAT_EXITS_WHILE_REMOVING.format(repo=repo, root=str(sandbox_root))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    box_id, bwrap_pid = done.stdout.split()
    assert not (sandbox_root / box_id).exists()
    assert not _running(int(bwrap_pid)) and _running_commands("sleep 30.75") == []


def test_missing_bubblewrap_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        LocalSandboxBackend(root=tmp_path, bwrap="/nonexistent/bwrap")


def test_broken_namespaces_are_a_clear_error(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"  # a stand-in bwrap that fails the way a kernel without user namespaces does
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailable, match="user and mount namespaces"):
        LocalSandboxBackend(root=tmp_path, bwrap=str(fake))


async def test_the_whole_sandbox_runs_in_its_cgroup(backend: LocalSandboxBackend) -> None:
    if backend.limit_mode != "cgroup":
        pytest.skip("this machine gives no writable cgroup (rlimit mode is tested in test_local_security)")
    async with await backend.create(make_task()) as box:
        await box.exec("sleep 30.5 >/dev/null 2>&1 &")
        (sleeper,) = _running_commands("sleep 30.5")
        for procs in box._cgroup.procs_files:  # joined before bwrap started (C launcher or shell)
            members = {int(pid) for pid in procs.read_text().split()}
            assert box._process.pid in members and sleeper in members
