"""A real local backend (C init) under a per-test root, as the attacks below run against."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawgym_env.sandbox.local import LocalSandboxBackend


@pytest.fixture
async def backend(tmp_path: Path):
    async with LocalSandboxBackend(root=tmp_path / "sandboxes", init="auto") as b:
        yield b
