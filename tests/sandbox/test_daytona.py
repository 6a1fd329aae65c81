"""The Daytona backend through the real `daytona` SDK against DaytonaApiStandIn (a recorded-response stand-in)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from clawgym_env.interfaces import ProxyEndpoint, Sandbox, SandboxBackend, SandboxLimits, SandboxUnavailable
from clawgym_env.sandbox import make_backend
from clawgym_env.sandbox.daytona import DaytonaSandboxBackend, network_policy
from clawgym_env.sandbox.workspace import WorkspacePathError
from clawgym_env.specs import WorkspaceSpec
from tests.sandbox.conftest import make_task
from tests.sandbox.daytona_standin import DaytonaApiStandIn


@pytest.fixture
async def standin():
    server = DaytonaApiStandIn()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def daytona_backend(standin: DaytonaApiStandIn):
    backend = make_backend("daytona", api_key="test-key", api_url=standin.base_url)
    yield backend
    await backend.aclose()


async def test_full_lifecycle_through_the_sdk(
    daytona_backend: DaytonaSandboxBackend, standin: DaytonaApiStandIn, tmp_path: Path
) -> None:
    assert isinstance(daytona_backend, SandboxBackend)
    task = make_task({"a.txt": "hello", "bin/blob": b"\x00\x01\xff"}, mount_path=str(tmp_path / "remote_ws"))
    proxy = ProxyEndpoint(public_url="https://proxy.example.org/")
    box = await daytona_backend.create(task, proxy=proxy)
    assert isinstance(box, Sandbox)
    assert box.proxy_base_url == "https://proxy.example.org/"
    created = next(r for r in standin.requests if r["path"] == "/sandbox")
    assert created["auth"] == "Bearer test-key"
    assert created["body"]["networkBlockAll"] is False and created["body"]["domainAllowList"] == "proxy.example.org"
    assert created["body"]["autoDeleteInterval"] == 0  # ephemeral
    assert created["body"]["labels"]["clawgym"] == "1"

    result = await box.exec("cat a.txt; echo oops >&2; exit 4")
    assert (result.exit_code, result.stdout, result.stderr) == (4, "hello", "oops\n")
    assert (await box.exec(["wc", "-c"], stdin=b"12345")).stdout.strip() == "5"
    assert (await box.exec("echo $X", env={"X": "from-env"})).stdout == "from-env\n"
    timed = await box.exec("sleep 5", timeout_s=1)
    assert timed.killed_reason == "timeout" and timed.timed_out

    await box.write_file("out/new.txt", "written")
    assert await box.read_file("out/new.txt") == b"written"
    assert await box.read_file("bin/blob") == b"\x00\x01\xff"
    assert await box.list_files() == ["a.txt", "bin/blob", "out/new.txt"]
    with pytest.raises(PermissionError, match="outside"):
        await box.read_file("/etc/passwd")
    dest = await box.download_workspace(tmp_path / "downloaded")
    assert (dest / "out" / "new.txt").read_text() == "written"

    await box.destroy()
    await box.destroy()
    assert [r["method"] for r in standin.requests if r["path"].startswith("/sandbox/")] == ["DELETE"]
    assert standin.sandboxes == {}
    with pytest.raises(RuntimeError, match="destroyed"):
        await box.exec("true")


async def test_no_proxy_blocks_all_network_and_bad_paths_create_nothing(
    daytona_backend: DaytonaSandboxBackend, standin: DaytonaApiStandIn, tmp_path: Path
) -> None:
    async with await daytona_backend.create(make_task(mount_path=str(tmp_path / "ws"))) as box:
        assert box.proxy_base_url is None
    assert standin.requests[[r["path"] for r in standin.requests].index("/sandbox")]["body"]["networkBlockAll"] is True
    source = tmp_path / "src"
    source.mkdir()
    (source / "link").symlink_to("/etc")
    before = len([r for r in standin.requests if r["path"] == "/sandbox"])
    with pytest.raises(WorkspacePathError):
        await daytona_backend.create(make_task(WorkspaceSpec(directory=source)))
    assert len([r for r in standin.requests if r["path"] == "/sandbox"]) == before  # refused before creating


async def test_proxy_without_public_url_is_a_clear_error(daytona_backend: DaytonaSandboxBackend) -> None:
    with pytest.raises(ValueError, match="public_url"):
        await daytona_backend.create(make_task(), proxy=ProxyEndpoint(unix_socket=Path("/tmp/p.sock")))


def test_network_policy() -> None:
    assert network_policy(None) == {"network_block_all": True}
    assert network_policy(ProxyEndpoint(public_url="http://10.1.2.3:8000/x")) == {
        "network_block_all": False,
        "network_allow_list": "10.1.2.3/32",
    }
    assert network_policy(ProxyEndpoint(public_url="https://p.example.com"), ["pypi.org"]) == {
        "network_block_all": False,
        "domain_allow_list": "pypi.org,p.example.com",
    }


def test_image_params_carry_resource_limits(daytona_backend: DaytonaSandboxBackend) -> None:
    backend = DaytonaSandboxBackend(api_key="k", api_url="http://127.0.0.1:9", image="python:3.12-slim")
    params = backend._params(make_task(), None, SandboxLimits(memory_mb=3000, workspace_mb=5000, wall_time_s=600))
    assert (params.resources.memory, params.resources.disk, params.auto_stop_interval, params.ephemeral) == (
        3,
        5,
        10,
        True,
    )


def test_missing_credentials_and_sdk_are_clear_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN", "DAYTONA_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no .env file to pick credentials from
    with pytest.raises(SandboxUnavailable, match="DAYTONA_API_KEY"):
        DaytonaSandboxBackend()
    monkeypatch.setitem(sys.modules, "daytona", None)
    with pytest.raises(SandboxUnavailable, match="pip install"):
        DaytonaSandboxBackend(api_key="k")
