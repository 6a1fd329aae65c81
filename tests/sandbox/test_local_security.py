"""What a command inside a local sandbox must not be able to do, tried for real."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from clawgym_env.interfaces import SandboxLimits
from clawgym_env.sandbox.local_backend import LocalSandboxBackend
from clawgym_env.sandbox.workspace import WorkspacePathError
from clawgym_env.specs import WorkspaceSpec
from tests.sandbox.conftest import make_task

pytestmark = pytest.mark.usefixtures("sandbox_init")  # every test with the C and the Python init

CONNECT = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    socket.create_connection((host, port), timeout=3).close()
    print("CONNECTED")
except OSError as exc:
    print("REFUSED", type(exc).__name__, exc)
"""


async def test_cannot_write_outside_workspace_and_tmp(backend: LocalSandboxBackend, tmp_path: Path) -> None:
    marker = f"escape-{uuid.uuid4().hex[:8]}"
    host_dir = tmp_path / "host_dir"
    host_dir.mkdir()
    async with await backend.create(make_task()) as box:
        for target in (f"/etc/{marker}", f"/usr/{marker}", f"{host_dir}/{marker}", f"{backend.root}/{marker}"):
            result = await box.exec(["sh", "-c", f"echo x > {target}"])
            assert result.exit_code != 0, target
        assert (
            await box.exec(f"echo ok > /tmp/{marker} && echo ok > /root/{marker} && echo ok > {marker}")
        ).exit_code == 0
    assert not Path(f"/etc/{marker}").exists() and not Path(f"/usr/{marker}").exists()
    assert list(host_dir.iterdir()) == []
    assert not Path(f"/tmp/{marker}").exists() and not Path(f"/root/{marker}").exists()  # private tmpfs, not the host's


async def test_cannot_read_another_sandboxs_workspace(backend: LocalSandboxBackend) -> None:
    secret = f"secret-{uuid.uuid4().hex}"  # made at run time, so no file on disk holds it (this test's source neither)
    async with await backend.create(make_task()) as a, await backend.create(make_task()) as b:
        await a.write_file("secret.txt", secret)
        for attempt in (
            f"cat {a.workspace_dir}/secret.txt",  # a's host path
            f"ls -A {backend.root}",  # the root of all sandbox dirs is an empty tmpfs inside
            "cat /proc/*/root" + a.workspace_path + "/secret.txt",
            f"grep -rs {secret} /tmp /run /root",
        ):
            result = await b.exec(attempt)
            assert secret not in result.stdout, attempt
            assert a.id not in result.stdout, attempt
        assert (await b.exec("ls -A " + b.workspace_path)).stdout == ""
        assert (await a.exec("cat secret.txt")).stdout == secret


async def test_hidden_paths_are_empty_inside(sandbox_root: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"  # e.g. a run folder with recorded model calls
    run_dir.mkdir()
    (run_dir / "calls.jsonl").write_text("recorded")
    async with LocalSandboxBackend(root=sandbox_root, hidden_paths=[run_dir]) as backend:
        async with await backend.create(make_task()) as box:
            assert (await box.exec(f"ls -A {run_dir}")).stdout == ""
            assert (await box.exec(f"cat {run_dir}/calls.jsonl")).exit_code != 0


async def test_cannot_connect_anywhere_but_the_proxy_route(backend: LocalSandboxBackend) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"host service\n")
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)  # a service on the host's loopback
    port = server.sockets[0].getsockname()[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            pass  # reachable from the host itself
        async with await backend.create(make_task()) as box:
            for host, target_port in (("127.0.0.1", port), ("1.1.1.1", 80), ("8.8.8.8", 53)):
                result = await box.exec(["python3", "-c", CONNECT, host, str(target_port)])
                assert result.stdout.startswith("REFUSED"), (host, result.stdout, result.stderr)
            interfaces = await box.exec(["cat", "/proc/net/dev"])
            assert [line.split(":")[0].strip() for line in interfaces.stdout.splitlines()[2:]] == ["lo"]
    finally:
        server.close()
        await server.wait_closed()


async def test_cannot_see_host_processes(backend: LocalSandboxBackend) -> None:
    marker = f"hostproc{uuid.uuid4().hex[:8]}"
    host_process = subprocess.Popen(["sh", "-c", f"exec -a {marker} sleep 30"])
    try:
        async with await backend.create(make_task()) as box:
            result = await box.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; ls -d /proc/[0-9]* | wc -l")
            assert marker not in result.stdout
            assert int(result.stdout.split()[-1]) < 10  # only the sandbox's own few processes
            assert (await box.exec(["kill", "-0", str(host_process.pid)])).exit_code != 0
    finally:
        host_process.kill()
        host_process.wait()


async def test_killed_at_time_limit_with_reason(backend: LocalSandboxBackend) -> None:
    async with await backend.create(make_task()) as box:
        result = await box.exec("sleep 20", timeout_s=0.5)
        assert result.timed_out and result.killed_reason == "timeout" and result.duration_s < 5
        assert (await box.exec("echo still usable")).stdout == "still usable\n"


async def test_wall_time_limit_ends_the_sandbox(backend: LocalSandboxBackend) -> None:
    box = await backend.create(make_task(), limits=SandboxLimits(wall_time_s=1.0))
    result = await box.exec("sleep 20")
    assert result.killed_reason == "wall_time" and result.timed_out and result.duration_s < 5
    for _ in range(100):  # destroy runs in the background once the wall time is up
        if not box.host_dir.exists():
            break
        await asyncio.sleep(0.05)
    assert not box.host_dir.exists()


ALLOCATE = "x = bytearray(400 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096]); print('allocated')"


@pytest.mark.parametrize("use_cgroups", [True, False], ids=["cgroup", "rlimit"])
async def test_killed_at_memory_limit_with_reason(sandbox_root: Path, use_cgroups: bool) -> None:
    async with LocalSandboxBackend(root=sandbox_root, use_cgroups=use_cgroups) as backend:
        async with await backend.create(make_task(), limits=SandboxLimits(memory_mb=128)) as box:
            result = await box.exec(["python3", "-c", ALLOCATE])
            assert "allocated" not in result.stdout
            assert result.exit_code != 0 and result.killed_reason == "memory", result
            small = await box.exec(["python3", "-c", "x = bytearray(16 * 1024 * 1024); print('fits')"])
            assert small.stdout == "fits\n"


async def test_workspace_disk_limit(backend: LocalSandboxBackend) -> None:
    async with await backend.create(make_task(), limits=SandboxLimits(workspace_mb=8)) as box:
        result = await box.exec("head -c 50000000 /dev/zero > big.bin")
        assert result.exit_code != 0 and result.killed_reason == "disk", result
        assert (box.workspace_dir / "big.bin").stat().st_size <= 8 * 1024 * 1024
        await box.exec("rm big.bin")
        # the kernel refuses writes past the quota (a sized tmpfs): each write fails, the total stays in bounds
        many = await box.exec(
            "for i in 1 2 3 4 5 6; do head -c 4000000 /dev/zero > f$i.bin; done; du -sk .", timeout_s=10
        )
        assert "No space left on device" in many.stderr, many
        assert int(many.stdout.split()[0]) <= 8 * 1024, many


async def test_process_count_limit(sandbox_root: Path) -> None:
    async with LocalSandboxBackend(root=sandbox_root) as backend:
        async with await backend.create(make_task(), limits=SandboxLimits(max_processes=20)) as box:
            result = await box.exec("for i in $(seq 40); do sleep 1 & done; echo all-started; wait", timeout_s=15)
            assert "all-started" not in result.stdout and "Cannot fork" in result.stderr, result
            if backend.limit_mode == "cgroup":
                assert result.killed_reason == "pids"
            await asyncio.sleep(1.0)
            assert (await box.exec("echo recovered")).stdout == "recovered\n"


async def test_task_paths_cannot_escape(backend: LocalSandboxBackend, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    source = tmp_path / "source"
    source.mkdir()
    (source / "ok.txt").write_text("ok")
    (source / "escape").symlink_to(outside)
    with pytest.raises(WorkspacePathError, match="points outside"):
        await backend.create(make_task(WorkspaceSpec(files={"a.txt": "a"}, directory=source)))
    assert list(backend.root.iterdir()) == []  # the half-made sandbox was removed
    assert list(outside.iterdir()) == []

    async with await backend.create(make_task({"a.txt": "a"})) as box:
        for bad in ("../../../etc/evil", "/etc/evil", "/root/evil"):
            with pytest.raises(PermissionError):
                await box.write_file(bad, "x")
        assert await box.list_files() == ["a.txt"]
