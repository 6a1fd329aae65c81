"""Fixtures for the proxy tests: the real Qwen tokenizer, the ChatML renderer, a proxy on loopback."""

from __future__ import annotations

import pytest

from clawgym_env.chat import ChatMLRenderer
from clawgym_env.engines.scripted import ScriptedTestEngine
from clawgym_env.engines.tokenizer import load_qwen_tokenizer
from clawgym_env.interfaces import Policy
from clawgym_env.proxy import ServingProxy
from clawgym_env.records import ModelCall
from tests.log_check import assert_log_holds

WRITE_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}
LS_SCHEMA = {"type": "object", "properties": {"dir": {"type": "string"}}}


def tagged(name: str, arguments: dict, text: str = "") -> str:
    """A completion in Qwen's native tool-call format, pretty-printed like the model writes it."""
    import json

    call = json.dumps({"name": name, "arguments": arguments}, indent=1)
    return (text + "\n" if text else "") + f"<tool_call>\n{call}\n</tool_call>"


@pytest.fixture(scope="session")
def tokenizer():
    return load_qwen_tokenizer()


@pytest.fixture(scope="session")
def renderer(tokenizer):
    return ChatMLRenderer(tokenizer)


@pytest.fixture(scope="session")
def tiny_model():
    """A real (tiny, random) Qwen3 model, loaded once."""
    from clawgym_env.engines.models import load_policy_model

    model, _ = load_policy_model("tiny-qwen3")
    return model


@pytest.fixture
async def tiny_policy(tiny_model, renderer):
    """The tiny model on a TransformersEngine of its own (closed after the test)."""
    from clawgym_env.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model, seed=0, max_batch_size=4)
    yield Policy(engine=engine, renderer=renderer, name="tiny")
    await engine.aclose()


@pytest.fixture
def scripted_policy(tokenizer, renderer):
    def make(completions, name: str = "policy", max_context: int = 32_768) -> Policy:
        return Policy(
            engine=ScriptedTestEngine(tokenizer, completions), renderer=renderer, name=name, max_context=max_context
        )

    return make


class LogCheckingProxy(ServingProxy):
    """A ServingProxy that keeps what `close_rollout` returned, so a test can read the same calls back from
    the log: a log line holds only what its call adds to earlier lines (clawgym_env.records.delta_line)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.returned: list[ModelCall] = []

    def close_rollout(self, rollout_id: str) -> list[ModelCall]:
        calls = super().close_rollout(rollout_id)
        self.returned += calls
        return calls


@pytest.fixture
async def proxy(tmp_path):
    server = LogCheckingProxy(tmp_path / "run", port=0)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
    assert_log_holds(server.log_path, server.returned)
