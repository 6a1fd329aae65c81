"""TrajectoryForest: one rollout's model calls as a token trie, in flat arrays.

Nodes are tokens, stored in topological order (a parent's index is below its children's). Shared
history is stored once; each root-to-leaf path is one full multi-turn trajectory. The same arrays are
the packed training layout: each unique token appears once, its position id is its depth, and its
attention reaches exactly its ancestors (see clawgym_env.trajectory.packing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel

# Codes of `TrajectoryForest.source`, where each context token came from as far as the renderer knows.
SOURCE_KINDS: tuple[str, ...] = (
    "generated",
    "system",
    "tools",
    "user",
    "tool",
    "assistant_spliced",
    "assistant_rendered",
    "template",
    "unknown",
)
SOURCE_CODE = {name: code for code, name in enumerate(SOURCE_KINDS)}


class ForestStats(BaseModel):
    """Counts of what reconstruction saw and what each filter did; summed across rollouts by trainers."""

    calls: int = 0
    failed_calls: int = 0
    unique_tokens: int = 0
    generated_tokens: int = 0
    branch_tokens: int = 0  # sum of the lengths of all surviving root-to-leaf paths
    leaves: int = 0
    dead_leaves_removed: int = 0
    compaction_calls_set_aside: int = 0
    subagent_calls_set_aside: int = 0
    dropped_overfork: int = 0
    drift_events: int = 0

    def __add__(self, other: ForestStats) -> ForestStats:
        return ForestStats(**{k: getattr(self, k) + getattr(other, k) for k in type(self).model_fields})


@dataclass
class TrajectoryForest:
    rollout_id: str
    task_id: str = ""
    harness: str = ""
    reward: float | None = None
    status: str = "ok"  # "ok" | "failed" | "empty"
    failure: str | None = None
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    parents: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # -1 for a root
    generated: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    logprobs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # nan for context
    policy_versions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # -1 for context
    call_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    source: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    leaves: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    auxiliary: list[TrajectoryForest] = field(default_factory=list)
    stats: ForestStats = field(default_factory=ForestStats)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_branches(self) -> int:
        return int(self.leaves.shape[0])

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def depths(self) -> np.ndarray:
        """Position id of each node: its depth in its branch (roots at 0)."""
        depth = np.zeros(self.num_tokens, np.int64)
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                depth[i] = depth[p] + 1
        return depth

    def branch(self, leaf: int) -> np.ndarray:
        """Node indexes from the root to `leaf`."""
        path = []
        node = int(leaf)
        while node >= 0:
            path.append(node)
            node = int(self.parents[node])
        return np.asarray(path[::-1], np.int64)

    def branches(self) -> list[np.ndarray]:
        return [self.branch(leaf) for leaf in self.leaves.tolist()]

    def branch_tokens(self) -> list[list[int]]:
        return [self.tokens[b].tolist() for b in self.branches()]

    @classmethod
    def failed(cls, rollout_id: str, reason: str, **kwargs: Any) -> TrajectoryForest:
        return cls(rollout_id=rollout_id, status="failed", failure=reason, **kwargs)

    def __repr__(self) -> str:
        return (
            f"TrajectoryForest(rollout={self.rollout_id!r}, status={self.status}, reward={self.reward}, "
            f"tokens={self.num_tokens}, branches={self.num_branches}, aux={len(self.auxiliary)})"
        )
