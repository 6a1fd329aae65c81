"""Fixtures for the sandbox tests: a real bubblewrap backend under a per-test root folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawgym_env.sandbox.local_backend import LocalSandboxBackend
from clawgym_env.sandbox.native_init import find_compiler
from clawgym_env.specs import TaskSpec


def make_task(workspace=None, **kwargs) -> TaskSpec:
    return TaskSpec(
        id=kwargs.pop("id", "t1"), instruction="do it", workspace=workspace, verifier=lambda d: 1.0, **kwargs
    )


@pytest.fixture(params=["c", "python"])
def sandbox_init(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test once with each sandbox init: the compiled C one and the Python fallback. Every backend
    the test builds without an explicit `init=` picks it up from $CLAWGYM_SANDBOX_INIT."""
    if request.param == "c" and find_compiler() is None:
        pytest.skip("no C compiler here, so only the Python init can run (test_native_init covers that fallback)")
    monkeypatch.setenv("CLAWGYM_SANDBOX_INIT", request.param)
    return request.param


@pytest.fixture
def sandbox_root(tmp_path: Path) -> Path:
    return tmp_path / "sandboxes"


@pytest.fixture
async def backend(sandbox_root: Path, sandbox_init: str):
    async with LocalSandboxBackend(root=sandbox_root) as b:
        assert b.init_kind == sandbox_init
        yield b
    leftovers = [p.name for p in sandbox_root.iterdir()] if sandbox_root.exists() else []
    assert leftovers == [], f"sandboxes left behind: {leftovers}"
