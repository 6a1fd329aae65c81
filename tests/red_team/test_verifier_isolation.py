"""Attacks on the script verifier's own files and channels, and on the host's environment, from inside a
real local sandbox, each on a real ClawGymBench task through the verification stage of `run_rollout`:

  * a module the agent plants (`reward/json.py`, or `json.py` beside a `python3 -c` checker) cannot stand in
    for one the checker imports: the reward folder is replaced whole and Python runs isolated;
  * the agent's program, run by the checker, finds no spec with the expected answers (it comes on stdin);
  * a daemon that program starts cannot write the reward line (the checker is not dumpable, so its stdout
    cannot be reopened through /proc, and every leftover is killed before the score is printed);
  * no process in the sandbox shows the host's environment (PID 1 is bwrap, started with a minimal one).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from clawgym_env.interfaces import ProxyEndpoint
from clawgym_env.rollout import verify_stage
from clawgym_env.sandbox.local_backend import LocalSandboxBackend
from clawgym_env.specs import EnvOptions, TaskSpec, WorkspaceSpec
from task_suites import clawgymbench
from verifiers.script import ScriptVerifier

# The shadowing module: the checker's first `import json` prints a perfect score and ends the process.
PLANTED_JSON = "import os\nprint(1.0, flush=True)\nos._exit(0)\n"


def bench_task(level: int, category: str) -> TaskSpec:
    """A real cached ClawGymBench test task of that level and category."""
    tasks = clawgymbench.load("test", level=level, count=24)
    return next(t for t in tasks if t.metadata["category"] == category)


async def verify(box, task: TaskSpec, tmp_path):
    return await verify_stage(task, box, None, "r-attack", tmp_path / "artifacts", EnvOptions())


@pytest.mark.parametrize("category", ["data_processing", "file_manipulation"])
async def test_a_planted_module_does_not_shadow_the_checkers_import(
    backend: LocalSandboxBackend, tmp_path, category: str
) -> None:
    task = bench_task(0, category)
    async with await backend.create(task) as box:  # control: no work done
        control = await verify(box, task, tmp_path)
    async with await backend.create(task) as box:  # the attack: no work done either, one module planted
        planted = await box.exec(f"mkdir -p reward && printf '{PLANTED_JSON}' > reward/json.py && cat reward/json.py")
        assert "_exit" in planted.stdout
        attacked = await verify(box, task, tmp_path)
    assert control.error is None and control.reward == 0.0, control
    assert attacked.error is None and attacked.reward == control.reward, attacked.explanation


async def test_a_module_beside_a_python_c_checker_is_not_imported(backend: LocalSandboxBackend, tmp_path) -> None:
    """Any ScriptVerifier: Python started by the checker does not put its cwd (the workspace) first."""
    verifier = ScriptVerifier(["python3", "-c", "import json; print(json.dumps(0.0))"], timeout_s=20)
    task = TaskSpec(id="attack", instruction="x", workspace=WorkspaceSpec(), verifier=verifier)
    async with await backend.create(task) as box:
        await box.exec(f"printf '{PLANTED_JSON}' > json.py")
        result = await verify(box, task, tmp_path)
    assert result.error is None and result.reward == 0.0, result.explanation


# The agent's wordcount.py computes nothing: it looks for the expected output of its case wherever the
# checker's data could be (the spec file, the checker's stdin, memory and environment) and prints it.
SPEC_THIEF = r"""
import glob, json, os, sys
mine = open(sys.argv[1]).read()
def answer(spec):
    for check in spec.get("checks", []):
        for case in check.get("cases", []):
            if any(isinstance(a, dict) and a.get("content") == mine for a in case["args"]):
                return case["stdout"]
sources = glob.glob("/root/**/spec.json", recursive=True) + glob.glob("reward/*")
parent = os.getppid()
sources += [f"/proc/{parent}/fd/0", f"/proc/{parent}/environ", f"/proc/{parent}/cmdline"]
for path in sources:
    try:
        found = answer(json.loads(open(path).read()))
    except Exception:
        continue
    if found:
        print(found)
        sys.exit(0)
try:  # the checker's memory: the spec was parsed there
    fd = os.open(f"/proc/{parent}/mem", os.O_RDONLY)
    for line in open(f"/proc/{parent}/maps"):
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        if "rw" not in line.split()[1] or end - start > 1 << 26:
            continue
        try:
            os.lseek(fd, start, 0)
            blob = os.read(fd, end - start)
        except OSError:
            continue
        at = blob.find(mine.encode())
        if at >= 0:
            tail = blob[at:at + 4096].decode(errors="ignore")
            if '"stdout": "' in tail:
                print(tail.split('"stdout": "')[1].split('"')[0])
                sys.exit(0)
except OSError:
    pass
print("no answer found")
"""


async def test_the_agents_program_cannot_read_the_checkers_spec(backend: LocalSandboxBackend, tmp_path) -> None:
    task = bench_task(1, "scripting")
    script = next(c["script"] for c in _spec(task)["checks"] if c["kind"] == "script_output")
    async with await backend.create(task) as box:
        await box.write_file(script, SPEC_THIEF)
        result = await verify(box, task, tmp_path)
        spec_in_box = await box.exec("ls reward; find / -name spec.json -not -path '/proc/*' 2>/dev/null")
    assert result.error is None and result.subscores == {"hidden_tests": 0.0}, result.explanation
    assert result.reward == 0.0
    assert "spec.json" not in spec_in_box.stdout, spec_in_box.stdout


# The agent's program starts a daemon (its own session) that reopens the checker's stdout, the host's pipe,
# through /proc and writes a perfect score there, also after the checker has exited.
REWARD_WRITER = r"""
import os, time
checker = os.getppid()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        try:
            fd = os.open(f"/proc/{checker}/fd/1", os.O_WRONLY)
        except OSError:
            os._exit(0)
        null = os.open("/dev/null", os.O_RDWR)
        for std in (0, 1, 2):  # let go of the program's own pipes: the checker then does not wait for this
            os.dup2(null, std)
        end = time.time() + 3
        while time.time() < end:
            os.write(fd, b"1.0\n")
            time.sleep(0.002)
        os._exit(0)
    os._exit(0)
print("0")
"""


async def test_a_daemon_of_the_agents_program_cannot_write_the_reward_line(
    backend: LocalSandboxBackend, tmp_path
) -> None:
    task = bench_task(1, "scripting")
    script = next(c["script"] for c in _spec(task)["checks"] if c["kind"] == "script_output")
    async with await backend.create(task) as box:
        await box.write_file(script, REWARD_WRITER)
        result = await verify(box, task, tmp_path)
    assert result.error is None and result.subscores == {"hidden_tests": 0.0}, result.explanation
    assert result.reward == 0.0, result.explanation


async def test_no_process_in_the_sandbox_shows_the_host_environment(tmp_path, monkeypatch) -> None:
    secrets = {
        "HF_TOKEN": "hf_fake_host_secret_1",
        "WANDB_API_KEY": "wandb_fake_host_secret_2",
        "DAYTONA_API_KEY": "daytona_fake_host_secret_3",
        "OLDPWD": "/home/someone/fake-host-project",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", "/opt/fake-host-only-bin:" + os.environ["PATH"])
    async with LocalSandboxBackend(root=tmp_path / "sandboxes", init="auto") as backend:
        async with await backend.create(TaskSpec(id="env", instruction="x", verifier=lambda d: 0.0)) as box:
            await box.exec("setsid sleep 30 >/dev/null 2>&1 < /dev/null &")  # a leftover, as a harness leaves one
            seen = await box.exec(
                "for p in /proc/[0-9]*; do echo \"== $p $(cat $p/comm)\"; tr '\\0' '\\n' < $p/environ; done"
            )
            pid1 = await box.exec("tr '\\0' '\\n' < /proc/1/environ")
    assert seen.exit_code == 0 and "== /proc/1 " in seen.stdout, seen.stderr
    assert pid1.exit_code == 0  # readable, and empty of the host's variables
    for value in [*secrets.values(), "/opt/fake-host-only-bin"]:
        assert value not in seen.stdout, f"{value} is visible inside:\n{seen.stdout}"


def _spec(task: TaskSpec) -> dict:
    verifier = task.verifier
    assert isinstance(verifier, ScriptVerifier) and verifier.files_dir is not None
    return json.loads((verifier.files_dir / "spec.json").read_text())


def test_the_checker_sweeps_nothing_outside_a_clawgym_sandbox(tmp_path) -> None:
    """Run where PID 1 is not bwrap (here: a PID namespace of its own, so a broken guard harms nothing
    else), the checker kills only its program's session: a process it did not start lives on."""
    spec = {
        "checks": [
            {"name": "out", "kind": "script_output", "script": "prog.py", "cases": [{"args": [], "stdout": "x"}]}
        ]
    }
    (tmp_path / "prog.py").write_text("print('x')\n")
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    check = Path(clawgymbench.TEMPLATE / "check.py")
    script = f"sleep 30 & python3 -I {check} < spec.json; kill -0 $! && echo bystander-alive"
    run = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.stdout.split() == ['{"out":', "1.0}", "1.0", "bystander-alive"], run.stdout + run.stderr


@pytest.mark.parametrize("init", ["c", "python"])
async def test_the_mount_table_names_no_host_path_of_the_socket_or_the_init(tmp_path, init: str) -> None:
    """Finding 4's second half: /proc/self/mountinfo showed where the proxy's socket and the compiled init
    live on the host. The socket now reaches the init as an open file and the init as data; the relay still
    works."""
    socket_dir = tmp_path / "host-only-proxy-folder"
    socket_dir.mkdir()
    server = await asyncio.start_unix_server(_answer_ok, path=str(socket_dir / "proxy.sock"))
    try:
        async with LocalSandboxBackend(root=tmp_path / "sandboxes", init=init) as backend:
            task = TaskSpec(id="mounts", instruction="x", verifier=lambda d: 0.0)
            async with await backend.create(task, proxy=ProxyEndpoint(unix_socket=socket_dir / "proxy.sock")) as box:
                mounts = await box.exec(
                    "cat /proc/self/mountinfo /proc/1/mountinfo; ls -la /proc/1/fd /run/clawgym || true"
                )
                reply = await box.exec(["curl", "-sS", box.proxy_base_url + "/"])
                init_binary = backend.init_binary
    finally:
        server.close()
        await server.wait_closed()
    assert mounts.exit_code == 0 and "/proc" in mounts.stdout, mounts.stderr
    assert reply.stdout == "ok", reply.stderr
    assert "host-only-proxy-folder" not in mounts.stdout, mounts.stdout
    assert str(tmp_path) not in mounts.stdout, mounts.stdout  # nor bwrap's stderr file (it was init.stderr there)
    if init_binary is not None:
        assert init_binary.name not in mounts.stdout and str(init_binary.parent) not in mounts.stdout, mounts.stdout


async def _answer_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    await writer.drain()
    writer.close()


async def test_writing_to_bwraps_stderr_fills_nothing_on_the_host(tmp_path) -> None:
    """An attack nobody listed: bwrap (PID 1 inside) had a host file as stderr, and /proc/1/fd/2 reopened it
    for writing, so commands could fill the host's disk (each up to the file-size rlimit). It is a pipe now,
    drained into a bounded buffer."""
    async with LocalSandboxBackend(root=tmp_path / "sandboxes", init="auto") as backend:
        async with await backend.create(TaskSpec(id="flood", instruction="x", verifier=lambda d: 0.0)) as box:
            flood = await box.exec(
                "for i in 1 2 3 4; do head -c 20000000 /dev/zero > /proc/1/fd/2 & done; wait; echo done"
            )
            on_host = sum(f.stat().st_size for f in box.host_dir.rglob("*") if f.is_file() and not f.is_symlink())
            still = await box.exec("echo alive")
    assert flood.stdout.strip() == "done", flood.stderr
    assert still.stdout == "alive\n"
    assert on_host < 1_000_000, f"{on_host} bytes written to the sandbox's host folder"
