"""Fixtures for the sandbox tests: a real bubblewrap backend under a per-test root folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawgym_env.sandbox.local import LocalSandboxBackend
from clawgym_env.specs import TaskSpec


def make_task(workspace=None, **kwargs) -> TaskSpec:
    return TaskSpec(id=kwargs.pop("id", "t1"), instruction="do it", workspace=workspace, verifier=lambda d: 1.0, **kwargs)


@pytest.fixture
def sandbox_root(tmp_path: Path) -> Path:
    return tmp_path / "sandboxes"


@pytest.fixture
async def backend(sandbox_root: Path):
    async with LocalSandboxBackend(root=sandbox_root) as b:
        yield b
    leftovers = [p.name for p in sandbox_root.iterdir()] if sandbox_root.exists() else []
    assert leftovers == [], f"sandboxes left behind: {leftovers}"
