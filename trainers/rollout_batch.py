"""One training step's rollouts, whatever produced them (vector envs, several harnesses, a user's loop)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clawgym_env.trajectory import TrajectoryForest


@dataclass
class RolloutBatch:
    """Parallel lists, one entry per rollout. The GRPO group of rollout i is (task_ids[i], harnesses[i])."""

    forests: list[TrajectoryForest]
    rewards: np.ndarray
    statuses: list[str]
    task_ids: list[str]
    harnesses: list[str]
    infos: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.forests)
        self.rewards = np.asarray(self.rewards, dtype=np.float64)
        if not (self.rewards.shape[0] == len(self.statuses) == len(self.task_ids) == len(self.harnesses) == n):
            raise ValueError(
                f"RolloutBatch: {n} forests, {self.rewards.shape[0]} rewards, {len(self.statuses)} statuses, "
                f"{len(self.task_ids)} task ids, {len(self.harnesses)} harnesses; they must have one entry per rollout"
            )

    def __len__(self) -> int:
        return len(self.forests)

    @classmethod
    def from_forests(
        cls,
        forests: Sequence[TrajectoryForest],
        rewards: Sequence[float] | np.ndarray | None = None,
        *,
        task_ids: Sequence[str] | None = None,
        harnesses: Sequence[str] | None = None,
    ) -> RolloutBatch:
        """From forests: reward, status, task and harness are read from each forest unless given."""
        forests = list(forests)
        r = [f.reward if f.reward is not None else np.nan for f in forests] if rewards is None else list(rewards)
        return cls(
            forests=forests,
            rewards=np.asarray(r, dtype=np.float64),
            statuses=[f.status for f in forests],
            task_ids=[f.task_id for f in forests] if task_ids is None else list(task_ids),
            harnesses=[f.harness for f in forests] if harnesses is None else list(harnesses),
        )

    def __add__(self, other: RolloutBatch) -> RolloutBatch:
        return RolloutBatch(
            forests=self.forests + other.forests,
            rewards=np.concatenate([self.rewards, other.rewards]),
            statuses=self.statuses + other.statuses,
            task_ids=self.task_ids + other.task_ids,
            harnesses=self.harnesses + other.harnesses,
            infos=(self.infos or [{}] * len(self)) + (other.infos or [{}] * len(other)),
        )

    def select(self, indices: Sequence[int]) -> RolloutBatch:
        """The rollouts at `indices`, in that order (infos included)."""
        idx = list(indices)
        return RolloutBatch(
            forests=[self.forests[i] for i in idx],
            rewards=self.rewards[idx] if idx else np.zeros(0),
            statuses=[self.statuses[i] for i in idx],
            task_ids=[self.task_ids[i] for i in idx],
            harnesses=[self.harnesses[i] for i in idx],
            infos=[self.infos[i] for i in idx] if self.infos else [],
        )

    def reward_by_harness(self) -> dict[str, float]:
        """Mean reward of the successful rollouts of each harness (failed ones count as 0 elsewhere)."""
        out: dict[str, list[float]] = {}
        for r, s, h in zip(self.rewards.tolist(), self.statuses, self.harnesses):
            out.setdefault(h, []).append(r if (s == "ok" and np.isfinite(r)) else 0.0)
        return {h: float(np.mean(v)) for h, v in out.items()}

    def reward_metrics(self) -> dict[str, float]:
        """Mean reward per harness and overall (failed rollouts and NaN rewards count 0)."""
        out = {f"reward/{h}": v for h, v in self.reward_by_harness().items()}
        ok = np.array([s == "ok" for s in self.statuses])
        finite = np.where(ok & np.isfinite(self.rewards), self.rewards, 0.0)
        out["reward_mean"] = float(finite.mean()) if len(self) else 0.0
        return out
