"""Trajectory reconstruction: recorded ModelCalls -> TrajectoryForest, filters, packing, inspection.

    from clawgym_env.trajectory import build_forest, pack_forests, tree_logprobs
    forest = build_forest(calls, rollout_id=rid, reward=r, options=ForestOptions())
    for batch in pack_forests([forest, ...], token_budget=32_768):
        logprobs = tree_logprobs(model, batch).logprobs     # [T], each unique token once
        loss = -(advantage * logprobs)[batch.loss_mask].sum()

Packing needs torch, inspection needs rich; both are imported lazily here so that reconstruction alone
stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clawgym_env.trajectory.forest import SOURCE_CODE, SOURCE_KINDS, ForestStats, TrajectoryForest
from clawgym_env.trajectory.reconstruct import build_forest

if TYPE_CHECKING:
    from clawgym_env.trajectory.inspect import inspect_run, recording_stats
    from clawgym_env.trajectory.packing import (
        PackedBatch,
        pack_forest,
        pack_forests,
        tree_logprobs,
    )

_LAZY = {
    "PackedBatch": "packing",
    "pack_forest": "packing",
    "pack_forests": "packing",
    "tree_logprobs": "packing",
    "inspect_run": "inspect",
    "recording_stats": "inspect",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"clawgym_env.trajectory.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'clawgym_env.trajectory' has no attribute {name!r}")


__all__ = [
    "SOURCE_CODE",
    "SOURCE_KINDS",
    "ForestStats",
    "PackedBatch",
    "TrajectoryForest",
    "build_forest",
    "inspect_run",
    "pack_forest",
    "pack_forests",
    "recording_stats",
    "tree_logprobs",
]
