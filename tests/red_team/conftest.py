"""What the attacks run against: a real local backend (C init) under a per-test root; the real Qwen tokenizer
and its ChatML renderer (the proxy's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawgym_env.chat import ChatMLRenderer
from clawgym_env.engines.tokenizer import load_qwen_tokenizer
from clawgym_env.sandbox.local_backend import LocalSandboxBackend


@pytest.fixture
async def backend(tmp_path: Path):
    async with LocalSandboxBackend(root=tmp_path / "sandboxes", init="auto") as b:
        yield b


@pytest.fixture(scope="module")
def tokenizer():
    return load_qwen_tokenizer()


@pytest.fixture(scope="module")
def renderer(tokenizer):
    return ChatMLRenderer(tokenizer)
