"""Building the C init (cached per source and compiler) and the fallback to the Python init without one."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from clawgym_env.interfaces import SandboxUnavailable
from clawgym_env.sandbox.local_backend import LocalSandboxBackend
from clawgym_env.sandbox.native_init import build_init, find_compiler
from tests.sandbox.conftest import make_task

BWRAP = shutil.which("bwrap") or "bwrap"


@pytest.mark.skipif(find_compiler() is None, reason="needs a C compiler (the Python init is tested without one below)")
def test_build_is_cached_and_a_failing_compiler_is_a_clear_error(tmp_path: Path) -> None:
    built = build_init(cache=tmp_path)
    assert os.access(built, os.X_OK) and built.parent == tmp_path
    stamp = built.stat().st_mtime_ns
    assert build_init(cache=tmp_path) == built and built.stat().st_mtime_ns == stamp  # reused, not rebuilt
    built.chmod(0o777)  # writable by others: someone could have swapped it, and it runs on the host
    with pytest.raises(RuntimeError, match="writable by others"):
        build_init(cache=tmp_path)
    built.chmod(0o755)
    broken = tmp_path / "broken-cc"  # a stand-in compiler that fails like a broken toolchain
    broken.write_text("#!/bin/sh\necho 'cc1: internal compiler error' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(RuntimeError, match="internal compiler error"):
        build_init(compiler=str(broken), cache=tmp_path / "other")
    assert [p.name for p in (tmp_path / "other").iterdir()] == []  # no half-built binary left
    with pytest.raises(RuntimeError, match="cannot write the C init"):
        build_init(cache=Path("/proc/clawgym-no-such-folder"))


async def test_without_a_compiler_auto_falls_back_to_the_python_init(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CLAWGYM_SANDBOX_INIT", raising=False)
    with pytest.raises(SandboxUnavailable, match="apt-get install -y gcc"):
        LocalSandboxBackend(root=tmp_path / "sandboxes", bwrap=BWRAP, init="c")
    with caplog.at_level(logging.WARNING):
        backend = LocalSandboxBackend(root=tmp_path / "sandboxes", bwrap=BWRAP)
    assert backend.init_kind == "python" and "Python sandbox init" in caplog.text
    async with backend, await backend.create(make_task({"a.txt": "x"})) as box:
        assert (await box.exec(["/bin/cat", "a.txt"])).stdout == "x"
    with pytest.raises(ValueError, match="init must be"):
        LocalSandboxBackend(root=tmp_path / "sandboxes", bwrap=BWRAP, init="rust")
