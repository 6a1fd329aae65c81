"""Attacks on the local sandbox and on verification, each run from inside a real sandbox as a harness's
bash tool would run it, with the host backend running as root. This module is the list of what is guarded:

  * host kernel settings (/proc/sys) cannot be changed from inside;
  * root inside has no capability (nor any to regain) and the kernel's knobs are read-only; host secrets
    (/etc/shadow and whatever else under /etc only root may read, /home, /var, the host's /root) are not shown;
  * the answers are not visible: the suite cache, run folders and the rest of the checkout are hidden,
    only the harness CLIs, the Python environment and the code the harness needs are shown (read-only);
  * leftover agent processes cannot touch verification: every process of the agent is killed and its
    cgroup checked empty before the verifier's files are copied in, and the verifier runs in a restarted
    sandbox whose control channel the agent never had (FIFO swap, stolen control socket, rewrite loop);
    the init is not dumpable, so its control socket cannot be taken (pidfd_getfd) while the agent runs;
  * the downloaded workspace keeps no link out of itself, no setuid bit, no FIFO/socket/device, and
    host-side checks read through no-follow opens;
  * a FIFO in the workspace cannot freeze the host's event loop (read_file / write_file);
  * the workspace disk limit is enforced by the kernel (a sized tmpfs), also for writers left running
    after their command returned and for a burst inside one command; /dev/shm is sized;
  * kill reasons say what happened; /proc/1/cmdline does not show the host path of the workspace.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import time
import uuid
from pathlib import Path

import pytest

from clawgym_env.interfaces import SandboxLimits, VerifyContext
from clawgym_env.rollout import verify_stage
from clawgym_env.sandbox.local_backend import LocalSandboxBackend
from clawgym_env.specs import EnvOptions, TaskSpec, WorkspaceSpec
from verifiers.files import AnswerMatches, FileChecksVerifier, TextMatches
from verifiers.script import ScriptVerifier

REPO = Path(__file__).resolve().parents[2]
HONEST_CHECK = "print(0.0)\n"  # the honest checker: the agent's work is wrong


def make_task(files: dict[str, str] | None = None, verifier=None) -> TaskSpec:
    return TaskSpec(
        id="attack", instruction="x", workspace=WorkspaceSpec(files=files or {}), verifier=verifier or (lambda d: 0.0)
    )


def check_py_verifier() -> ScriptVerifier:
    return ScriptVerifier(
        "python3 reward/check.py", files={"check.py": HONEST_CHECK}, files_dest="reward", timeout_s=20
    )


async def verify(box, task: TaskSpec, tmp_path: Path):
    """The verification stage of run_rollout, as a rollout runs it after the harness returned."""
    return await verify_stage(task, box, None, "r-attack", tmp_path / "artifacts", EnvOptions())


# ------------------------------------------------------------------------------------ host exposure
async def test_proc_sys_is_read_only(backend: LocalSandboxBackend) -> None:
    path = Path("/proc/sys/kernel/printk_ratelimit")
    before = path.read_text()
    try:
        async with await backend.create(make_task()) as box:
            result = await box.exec(f"echo {int(before) + 1} > {path}")
        assert result.exit_code != 0
        assert path.read_text() == before
    finally:
        if path.read_text() != before:  # undo the attack's effect on this machine
            path.write_text(before)


async def test_root_inside_has_no_host_powers_and_no_host_secrets(backend: LocalSandboxBackend) -> None:
    async with await backend.create(make_task()) as box:
        shadow = await box.exec("cat /etc/shadow")
        caps = (await box.exec("grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status")).stdout.split()
        knobs = await box.exec(
            "for f in /proc/sysrq-trigger /proc/sys/vm/drop_caches /proc/sys/kernel/core_pattern; "
            "do test -w $f && echo WRITABLE $f; done; true"
        )  # only asks; never writes them
        host_home = await box.exec("ls -A /home /var /srv 2>/dev/null")
        in_root = set((await box.exec("ls -A /root")).stdout.split())
        kcore = await box.exec("head -c 1 /proc/kcore | wc -c")
    assert shadow.exit_code != 0 and "root:" not in shadow.stdout
    assert caps[1::2] == ["0000000000000000"] * 3, caps  # no capability at all, nor any to regain
    assert "WRITABLE" not in knobs.stdout, knobs.stdout
    assert host_home.stdout.strip() == "", host_home.stdout
    # HOME (/root) is the sandbox's own: only the workspace's and the shown Python's mount points are in it
    allowed = {Path(p).parts[2] for p in [*map(str, backend.auto_binds), box.workspace_path] if p.startswith("/root/")}
    assert in_root <= allowed, in_root - allowed
    assert kcore.stdout.strip() == "0"


async def test_answers_and_other_checkout_folders_are_hidden(backend: LocalSandboxBackend) -> None:
    cache = (REPO / ".cache").resolve()
    async with await backend.create(make_task()) as box:
        suites = await box.exec(f"ls -A {cache}/suites")
        runs = await box.exec(f"ls -A {REPO}/runs {cache.parent}/runs")
        tests = await box.exec(f"ls -A {REPO}/tests {REPO}/benchmarks")
        harness = await box.exec(f"ls {cache}/harnesses")
        python = await box.exec([os.path.realpath(sys.executable), "-c", "import pydantic; print('ok')"])
    assert suites.stdout.strip() == "" and runs.stdout.strip() == "" and tests.stdout.strip() == ""
    if (cache / "harnesses").is_dir():
        assert harness.exit_code == 0 and harness.stdout.strip(), harness.stderr  # what the harness needs stays
    assert python.stdout.strip() == "ok", python.stderr


# ------------------------------------------------------------------------- leftovers vs verification
FIFO_SWAP = r"""
mkdir -p reward
setsid sh -c 'while true; do
  if [ -f reward/check.py ]; then rm -f reward/check.py; mkfifo reward/check.py; echo "print(1.0)" > reward/check.py; fi
  sleep 0.001
done' >/dev/null 2>&1 < /dev/null &
"""

REWRITE_LOOP = r"""
setsid sh -c 'while true; do
  if [ -f reward/check.py ] && ! grep -q "1.0" reward/check.py; then echo "print(1.0)" > reward/check.py; fi
done' >/dev/null 2>&1 < /dev/null &
"""

# A leftover process takes the init's control socket (pidfd_getfd), stops the init, and answers the host's
# next exec request itself: "1.0" on the command's stdout and exit 0.
STEAL_CONTROL = r"""
import ctypes, os, signal, socket, array, sys, time
libc = ctypes.CDLL(None, use_errno=True)
SYS_pidfd_open, SYS_pidfd_getfd = 434, 438
def find_init():
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if argv[0] == b"/run/clawgym/init":  # the C init: <control fd> is its first argument
            return int(pid), int(argv[1])
        if b"-c" in argv and b"CONTROL" in argv[argv.index(b"-c") + 1]:  # the Python init
            return int(pid), int(argv[argv.index(b"-c") + 2])
    return None
if os.fork():
    sys.exit(0)
os.setsid()
found = find_init()
pidfd = libc.syscall(SYS_pidfd_open, found[0], 0)
fd = libc.syscall(SYS_pidfd_getfd, pidfd, found[1], 0)
open("/tmp/stolen", "w").write(f"{found} {pidfd} {fd}")
os.kill(found[0], signal.SIGSTOP)
control = socket.socket(fileno=fd)
while True:
    data, anc, _, _ = control.recvmsg(1 << 20, socket.CMSG_SPACE(12))
    fds = array.array("i")
    for level, kind, payload in anc:
        fds.frombytes(payload[: len(payload) - len(payload) % 4])
    fields = data.split(b"\0")
    if fields[0] == b"exec" and len(fds) == 3:
        os.write(fds[1], b"1.0\n")
        for f in fds:
            os.close(f)
        control.send(b"exit %s 0 0" % fields[1])
"""


@pytest.mark.parametrize("attack", ["fifo_swap", "rewrite_loop"])
async def test_leftover_processes_cannot_rig_the_script_verifier(
    backend: LocalSandboxBackend, tmp_path: Path, attack: str
) -> None:
    task = make_task(verifier=check_py_verifier())
    async with await backend.create(task) as box:
        started = await box.exec(FIFO_SWAP if attack == "fifo_swap" else REWRITE_LOOP)
        assert started.exit_code == 0
        await asyncio.sleep(0.2)
        verdict = await verify(box, task, tmp_path)
    assert verdict.error is None and verdict.reward == 0.0, verdict


async def test_stolen_control_socket_cannot_answer_the_verifier(backend: LocalSandboxBackend, tmp_path: Path) -> None:
    task = make_task(verifier=ScriptVerifier("echo 0.0", timeout_s=20))
    async with await backend.create(task) as box:
        await box.write_file("steal.py", STEAL_CONTROL)
        await box.exec("setsid python3 steal.py >/dev/null 2>&1 </dev/null &", timeout_s=5)
        await asyncio.sleep(1.0)  # the thief has the socket and the init is stopped
        verdict = await verify(box, task, tmp_path)
    assert verdict.error is None and verdict.reward == 0.0, verdict


TRY_STEAL = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    if argv[0] == b"/run/clawgym/init":  # the C init: <control fd> is its first argument
        fd_number = int(argv[1])
    elif argv[0].endswith(b"python3") and b"-c" in argv and b"CONTROL" in argv[argv.index(b"-c") + 1]:
        fd_number = int(argv[argv.index(b"-c") + 2])  # the Python init (bwrap's own argv names it too)
    else:
        continue
    pidfd = libc.syscall(434, int(pid), 0)
    got = libc.syscall(438, pidfd, fd_number, 0)
    print("STOLEN" if got >= 0 else os.strerror(ctypes.get_errno()))
"""


@pytest.mark.parametrize("init", ["c", "python"])
async def test_the_init_control_socket_cannot_be_taken_while_the_agent_runs(tmp_path: Path, init: str) -> None:
    async with LocalSandboxBackend(root=tmp_path / "sandboxes", init=init) as backend:
        async with await backend.create(make_task()) as box:
            result = await box.exec(["python3", "-c", TRY_STEAL])
            fds = await box.exec("for f in /proc/2/fd/*; do readlink $f; done 2>&1; true")  # pid 2: the init
    assert result.stdout.strip() == "Operation not permitted", result
    assert "socket:" not in fds.stdout, fds.stdout  # its fds cannot be opened or resolved either


async def test_agent_processes_are_gone_before_the_verifier_runs(backend: LocalSandboxBackend, tmp_path: Path) -> None:
    task = make_task(verifier=ScriptVerifier("ps -eo comm= | grep -c sleep || true", timeout_s=20))
    async with await backend.create(task) as box:
        await box.exec("setsid sleep 1000 >/dev/null 2>&1 < /dev/null & nohup sleep 1000 >/dev/null 2>&1 &")
        assert "sleep" in (await box.exec("ps -eo comm=")).stdout
        verdict = await verify(box, task, tmp_path)
    assert verdict.error is None and verdict.reward == 0.0, verdict  # no sleep left (the count printed 0)


# --------------------------------------------------------------------------- the downloaded workspace
async def test_links_out_of_the_workspace_are_not_followed(backend: LocalSandboxBackend, tmp_path: Path) -> None:
    secret = f"host-secret-{uuid.uuid4().hex}"
    host_file = tmp_path / "host.txt"
    host_file.write_text(secret)
    async with await backend.create(make_task()) as other:
        await other.write_file("theirs.txt", secret)
        verifier = FileChecksVerifier([AnswerMatches("answer.txt", secret), TextMatches("other.txt", secret)])
        task = make_task(verifier=verifier)
        async with await backend.create(task) as box:
            await box.exec(f"ln -s {host_file} answer.txt && ln -s {other.workspace_dir}/theirs.txt other.txt")
            verdict = await verify(box, task, tmp_path)
    assert verdict.reward == 0.0 and secret not in verdict.explanation, verdict


async def test_host_checks_do_not_follow_links_in_a_given_copy(tmp_path: Path) -> None:
    secret = f"host-secret-{uuid.uuid4().hex}"
    (tmp_path / "host.txt").write_text(secret)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "answer.txt").symlink_to(tmp_path / "host.txt")
    os.mkfifo(workspace / "fifo.txt")
    verifier = FileChecksVerifier([AnswerMatches("answer.txt", secret), TextMatches("fifo.txt", "x")], timeout_s=5)
    started = time.monotonic()
    result = await verifier.verify(VerifyContext(sandbox=None, task=make_task(), workspace_dir=workspace))
    assert result.reward == 0.0 and secret not in result.explanation, result
    assert time.monotonic() - started < 3  # the FIFO was refused, not opened (that would block)


async def test_download_drops_setuid_links_out_fifos_and_devices(backend: LocalSandboxBackend, tmp_path: Path) -> None:
    async with await backend.create(make_task()) as box:
        made = await box.exec(
            "cp /bin/sh rootsh && chmod 6755 rootsh && mkfifo pipe && ln -s /etc/passwd out"
            " && ln -s rootsh in && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\""
        )
        assert made.exit_code == 0, made.stderr
        dest = await box.download_workspace(tmp_path / "copy")
        report = box.last_download
    mode = os.lstat(dest / "rootsh").st_mode
    assert stat.S_ISREG(mode) and not mode & (stat.S_ISUID | stat.S_ISGID), oct(mode)
    assert not (dest / "pipe").exists() and not (dest / "sock").exists() and not (dest / "out").is_symlink()
    assert os.readlink(dest / "in") == "rootsh"  # a link that stays inside is kept
    assert report.skipped == {"pipe": "fifo", "sock": "socket", "out": "link out of the workspace"}


# ------------------------------------------------------------------------------------- event loop
async def test_a_fifo_cannot_freeze_the_event_loop(backend: LocalSandboxBackend) -> None:
    async with await backend.create(make_task()) as box:
        assert (await box.exec("mkdir reward && mkfifo reward/reward.sh && mkfifo answer.txt")).exit_code == 0
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        started = time.monotonic()
        await asyncio.wait_for(box.write_file("reward/reward.sh", "echo 1.0"), 3)
        with pytest.raises(OSError):
            await asyncio.wait_for(box.read_file("answer.txt"), 3)
        ticker.cancel()
        assert time.monotonic() - started < 2
        assert (await box.exec("cat reward/reward.sh")).stdout == "echo 1.0"  # replaced by a regular file


# -------------------------------------------------------------------------------------- limits
async def test_disk_limit_holds_for_leftover_writers_and_bursts(backend: LocalSandboxBackend) -> None:
    limits = SandboxLimits(workspace_mb=8, memory_mb=1024)
    async with await backend.create(make_task(), limits=limits) as box:
        burst = await box.exec("dd if=/dev/zero of=burst bs=1M count=40 2>&1")
        assert burst.exit_code != 0 and burst.killed_reason == "disk", burst
        await box.exec("rm -f burst")
        left = await box.exec(
            "setsid sh -c 'sleep 0.1; dd if=/dev/zero of=late bs=1M count=70' >/dev/null 2>&1 </dev/null &"
        )
        assert left.exit_code == 0
        await asyncio.sleep(1.5)
        used = (await box.exec("du -sm . | cut -f1")).stdout.strip()
        assert int(used) <= 8, used
        shm = await box.exec("dd if=/dev/zero of=/dev/shm/big bs=1M count=200 2>&1")
        assert shm.exit_code != 0 and shm.killed_reason == "disk", shm
        assert (await box.exec("true")).exit_code == 0  # the sandbox survived


async def test_kill_reasons_say_what_happened(backend: LocalSandboxBackend) -> None:
    async with await backend.create(make_task()) as box:
        userns = await box.exec("unshare -U true")
        cmdline = (
            await box.exec("tr '\\0' ' ' < /proc/1/cmdline; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '")
        ).stdout
    assert userns.exit_code != 0 and userns.killed_reason != "disk", userns
    assert str(box.host_dir) not in cmdline and str(backend.root) not in cmdline, cmdline
