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
    # rollouts reported as failed/empty, and spliced copies of a generation that sit at
    # another tree position than where it was sampled (non-prefix harnesses): context there, never trained twice
    failed_rollouts: int = 0
    empty_rollouts: int = 0
    compaction_trees: int = 0
    subagent_trees: int = 0
    relocated_splice_tokens: int = 0
    # did each call's prompt extend the previous call of its agent (clawgym_env.prefix)? breaks by reason
    prefix_extended: int = 0
    prefix_breaks: int = 0
    breaks_drift: int = 0
    breaks_edited_history: int = 0
    breaks_harness_rewrite: int = 0
    breaks_compaction: int = 0
    breaks_retry: int = 0
    new_roots: int = 0  # first calls of another system prompt / tool set (subagents, side calls): not breaks
    rewritten_turns: int = 0  # echoes spliced after undoing a known harness rewrite (not drift)

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
    depth: np.ndarray | None = None  # position id of each node (filled by reconstruction; computed when None)
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
        if self.depth is not None and self.depth.shape[0] == self.num_tokens:
            return self.depth
        # pointer jumping: O(T log T) in numpy instead of a Python loop over every node
        idx = np.arange(self.num_tokens)
        depth = (self.parents >= 0).astype(np.int64)  # distance to `up`
        up = np.where(self.parents >= 0, self.parents, idx)  # roots point at themselves
        while self.num_tokens and np.any(up[up] != up):
            depth = depth + depth[up]
            up = up[up]
        self.depth = depth
        return depth

    def _run_starts(self) -> np.ndarray:
        """For each node, the first node of the contiguous chain (parent == index - 1) it belongs to."""
        n = self.num_tokens
        starts = np.ones(n, bool)
        if n > 1:
            starts[1:] = self.parents[1:] != np.arange(n - 1)
        return np.maximum.accumulate(np.where(starts, np.arange(n), 0))

    def branch(self, leaf: int) -> np.ndarray:
        """Node indexes from the root to `leaf` (walks whole contiguous chains at a time)."""
        run_start = self._run_starts()
        pieces = []
        node = int(leaf)
        while node >= 0:
            start = int(run_start[node])
            pieces.append(np.arange(start, node + 1, dtype=np.int64))
            node = int(self.parents[start])
        return np.concatenate(pieces[::-1]) if pieces else np.zeros(0, np.int64)

    def branches(self) -> list[np.ndarray]:
        run_start = self._run_starts()
        out = []
        for leaf in self.leaves.tolist():
            pieces, node = [], int(leaf)
            while node >= 0:
                start = int(run_start[node])
                pieces.append(np.arange(start, node + 1, dtype=np.int64))
                node = int(self.parents[start])
            out.append(np.concatenate(pieces[::-1]))
        return out

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
