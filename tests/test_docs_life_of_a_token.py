"""docs/life_of_a_token.md stays true: every dotted name it gives exists (import the module, getattr the rest)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from clawgym_env.layers import LAYERS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "life_of_a_token.md"
DOTTED = re.compile(r"`((?:" + "|".join(LAYERS) + r")(?:\.[A-Za-z_]\w*)+)`")


def names_on_page() -> list[str]:
    return list(dict.fromkeys(DOTTED.findall(PAGE.read_text())))


def resolve(dotted: str) -> object:
    """The object a dotted name points at: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)  # AttributeError names what is missing
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_page_names_the_whole_path():
    names = names_on_page()
    assert len(names) >= 30
    for stage in (
        "ServingProxy._generation_call",
        "CallPipeline.run",
        "ModelCall",
        "build_forest",
        "pack_forests",
        "tree_logprobs",
        "policy_loss",
        "Trainer.update",
    ):
        assert any(name.endswith(stage) for name in names), stage


@pytest.mark.parametrize("dotted", names_on_page())
def test_every_named_function_exists(dotted):
    assert resolve(dotted) is not None


def test_resolve_fails_on_a_missing_name():
    with pytest.raises(AttributeError):
        resolve("trainers.core.Trainer.no_such_method")
