"""Each harness driven by the tiny random Qwen3 model (a real TransformersEngine): the rollout completes,
whatever its reward, and its calls rebuild into a forest."""

from __future__ import annotations

import pytest

from clawgym_env.interfaces import Policy
from harness_adapters.health import make_adapter
from tests.harnesses.helpers import one_rollout, renderer

_ENGINE = None


def tiny_policy() -> Policy:
    global _ENGINE
    if _ENGINE is None:
        from clawgym_env.engines.models import load_policy_model
        from clawgym_env.engines.transformers_engine import TransformersEngine

        model, tokenizer = load_policy_model("tiny-qwen3")
        _ENGINE = TransformersEngine(model, tokenizer, seed=0)
    return Policy(engine=_ENGINE, renderer=renderer(), name="policy")


async def smoke(harness: str) -> None:
    result = await one_rollout(make_adapter(harness), tiny_policy(), max_new_tokens=24, max_calls=4)
    assert result.harness_result is not None, result.failure
    assert len(result.calls) >= 1
    assert all(c.generated_ids and len(c.logprobs) == len(c.generated_ids) for c in result.calls)
    if result.status == "ok":
        assert result.forest.stats.calls == len(result.calls)
        assert result.forest.stats.generated_tokens == sum(len(c.generated_ids) for c in result.calls)
    else:  # a random model may break a harness; it must still be a counted failure with a reason
        assert result.failure is not None and result.failure.reason


async def test_tiny_model_smoke_whitebox() -> None:
    await smoke("WhiteBox")


@pytest.mark.slow
@pytest.mark.parametrize("harness", ["ClaudeCode", "Codex", "Pi"])
async def test_tiny_model_smoke_cli(harness: str) -> None:
    await smoke(harness)


@pytest.mark.slow
async def test_tiny_model_smoke_openclaw() -> None:
    await smoke("OpenClaw")
