"""Staleness: how many policy versions the trainer is ahead of the calls it trains on, and what to do past a bound.

Every generated token carries the policy version the engine served it with (`forest.policy_versions`, -1
for context). When the trainer, at version V (= updates done), trains on a rollout whose oldest call was
served with version v, the rollout is V - v versions stale. A synchronous loop trains at staleness 0; with
`trainer.max_staleness = k` rollouts run ahead of the trainer (trainers.rollout_producer) and a GRPO group
(task x harness) whose oldest call is more than k versions behind is dropped as a whole (its members'
rewards are only comparable together) and counted, or, with `stale_groups="keep"`, kept: the rollout
correction (trainers.correction) then weighs each token by the ratio of the trainer's probability to the
probability the token was actually sampled with, which is what makes a stale token usable.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

import numpy as np

from clawgym_env.trajectory import TrajectoryForest
from trainers.rollout_batch import RolloutBatch


def oldest_version(forest: TrajectoryForest) -> int | None:
    """The lowest policy version among a forest's generated tokens (None when it generated nothing)."""
    versions = np.asarray(forest.policy_versions)
    served = versions[versions >= 0]
    return int(served.min()) if served.size else None


def apply_staleness(
    batch: RolloutBatch, version: int, max_staleness: int, stale_groups: Literal["drop", "keep"] = "drop"
) -> tuple[RolloutBatch, dict[str, float]]:
    """The batch the trainer at `version` may train on, and the step's staleness metrics.

    Metrics: `staleness_mean` and `staleness_max` over rollouts that generated tokens, `staleness/<harness>`
    (mean per harness), `groups_stale` (groups past the bound), `rollouts_stale_dropped` and
    `rollouts_stale_kept`."""
    lag: list[int | None] = []
    for forest in batch.forests:
        oldest = oldest_version(forest)
        lag.append(None if oldest is None else version - oldest)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, key in enumerate(zip(batch.task_ids, batch.harnesses)):
        groups[key].append(i)
    stale = {key for key, members in groups.items() if max((lag[i] or 0) for i in members) > max_staleness}
    stale_rollouts = sum(len(groups[key]) for key in stale)
    measured = [x for x in lag if x is not None]
    metrics = {
        "staleness_mean": float(np.mean(measured)) if measured else 0.0,
        "staleness_max": float(max(measured)) if measured else 0.0,
        "groups_stale": float(len(stale)),
        "rollouts_stale_dropped": float(stale_rollouts if stale_groups == "drop" else 0),
        "rollouts_stale_kept": float(stale_rollouts if stale_groups == "keep" else 0),
    }
    by_harness: dict[str, list[int]] = defaultdict(list)
    for harness, x in zip(batch.harnesses, lag):
        if x is not None:
            by_harness[harness].append(x)
    metrics.update({f"staleness/{h}": float(np.mean(v)) for h, v in by_harness.items()})
    if stale_groups == "keep" or not stale:
        return batch, metrics
    keep = []
    for i, key in enumerate(zip(batch.task_ids, batch.harnesses)):
        if key in stale:
            if batch.infos:
                batch.infos[i]["stale_dropped"] = True  # the evidence rows say which rollouts were not trained on
        else:
            keep.append(i)
    return batch.select(keep), metrics
