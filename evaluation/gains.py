"""Did training move the held-out reward? A paired, hierarchical bootstrap over seeds, tasks and rollouts.

A cell of an experiment (an arm evaluated through one harness) is, per seed, the untrained policy's
rollouts ("before") and the trained policy's ("after") on the same held-out tasks. Its gain is the mean
over seeds of (mean over tasks of the after rewards - the same for before). The 95 % interval comes from
resampling what varies between repetitions of the experiment, at every level, keeping the pairing:

1. seeds with replacement (a seed is one training run and its evaluations);
2. within a drawn seed, tasks with replacement, the same task draw for before and after (paired);
3. within a drawn task, its before rollouts and its after rollouts, each with replacement.

Several arms in one harness share the before draws, so the difference of two arms' gains (mixed vs
single) gets an interval from the same resamples. A claim is "shown" when its 95 % interval excludes
zero; with m claims read off one table, `holds_after` also tells whether the Bonferroni interval (level
1 - 0.05/m) excludes zero. A task's mean weighs its rollouts equally; tasks weigh equally within a seed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
from pydantic import BaseModel

from evaluation.evidence import UNTRAINED, EvidenceRow

N_RESAMPLES = 4000
LEVEL = 0.95


class Estimate(BaseModel):
    """A gain (or a difference of gains) with its bootstrap interval and what it rests on."""

    value: float
    low: float
    high: float
    level: float = LEVEL
    seeds: int
    tasks: int  # held-out tasks per seed (the smallest count over seeds)
    rollouts_before: int
    rollouts_after: int
    adjusted_low: float | None = None  # the Bonferroni interval, when the number of comparisons is given
    adjusted_high: float | None = None
    comparisons: int = 1

    @property
    def shown(self) -> bool:
        """The 95 % interval excludes zero."""
        return self.low > 0 or self.high < 0

    @property
    def holds_after(self) -> bool:
        """The Bonferroni interval for `comparisons` claims excludes zero."""
        low = self.adjusted_low if self.adjusted_low is not None else self.low
        high = self.adjusted_high if self.adjusted_high is not None else self.high
        return low > 0 or high < 0


class _Seed:
    """One seed's paired data: task -> before rewards and, per arm, task -> after rewards."""

    def __init__(self, before: dict[str, list[float]], after: dict[str, dict[str, list[float]]]) -> None:
        self.tasks = sorted(set(before).intersection(*(set(a) for a in after.values())))
        if not self.tasks:
            raise ValueError("a seed has no held-out task measured both before and after training")
        self.before = _padded([before[t] for t in self.tasks])
        self.after = {arm: _padded([a[t] for t in self.tasks]) for arm, a in after.items()}


def _padded(values: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged per-task rewards as a (tasks, most rollouts) array and the count per task."""
    counts = np.array([len(v) for v in values])
    table = np.zeros((len(values), counts.max()))
    for i, v in enumerate(values):
        table[i, : len(v)] = v
    return table, counts


def _task_means(data: tuple[np.ndarray, np.ndarray], tasks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per resample and drawn task, the mean of that task's rollouts drawn with replacement; (..., tasks)."""
    table, counts = data
    n = counts[tasks]  # (..., T)
    draws = (rng.random((*tasks.shape, table.shape[1])) * n[..., None]).astype(int)  # (..., T, R)
    values = table[tasks[..., None], draws]
    return values.mean(axis=-1)


def _point(seed: _Seed, arm: str) -> float:
    def mean(data: tuple[np.ndarray, np.ndarray]) -> float:
        table, counts = data
        return float(np.mean(table.sum(axis=1) / counts))

    return mean(seed.after[arm]) - mean(seed.before)


def _seeds(rows: Iterable[EvidenceRow], harness: str, arms: Sequence[str], suite: str | None) -> dict[int, _Seed]:
    before: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    after: dict[int, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in rows:
        if r.eval_harness != harness or (suite is not None and r.suite != suite):
            continue
        if r.phase == "before" and r.arm == UNTRAINED:
            before[r.seed][r.task_id].append(r.reward)
        elif r.phase == "after" and r.arm in arms:
            after[r.seed][r.arm][r.task_id].append(r.reward)
    seeds = sorted(s for s in before if all(arm in after.get(s, {}) for arm in arms))
    return {s: _Seed(before[s], {arm: after[s][arm] for arm in arms}) for s in seeds}


def gain_draws(
    rows: Iterable[EvidenceRow],
    harness: str,
    arms: Sequence[str],
    *,
    suite: str | None = None,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> tuple[dict[str, float], dict[str, np.ndarray], dict[int, _Seed]]:
    """Point gains and `n_resamples` bootstrap gains per arm (shared before draws), over the seeds where
    the untrained policy and every arm were evaluated in `harness`."""
    seeds = _seeds(rows, harness, arms, suite)
    if not seeds:
        raise ValueError(f"no seed has both the untrained policy and {list(arms)} evaluated in {harness}")
    rng = np.random.default_rng(seed)
    data = list(seeds.values())
    s = len(data)
    picked = rng.integers(0, s, size=(n_resamples, s))  # step 1: seeds
    draws = {arm: np.zeros((n_resamples, s)) for arm in arms}
    for k, one in enumerate(data):
        slots = picked == k  # where this seed was drawn
        count = int(slots.sum())
        if not count:
            continue
        tasks = rng.integers(0, len(one.tasks), size=(count, len(one.tasks)))  # step 2: the same tasks, paired
        before = _task_means(one.before, tasks, rng).mean(axis=1)  # step 3: rollouts
        for arm in arms:
            draws[arm][slots] = _task_means(one.after[arm], tasks, rng).mean(axis=1) - before
    points = {arm: float(np.mean([_point(one, arm) for one in data])) for arm in arms}
    return points, {arm: d.mean(axis=1) for arm, d in draws.items()}, seeds


def _estimate(
    value: float, draws: np.ndarray, seeds: dict[int, _Seed], arms: Sequence[str], comparisons: int
) -> Estimate:
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    adjusted = np.quantile(draws, [tail / comparisons, 1 - tail / comparisons]) if comparisons > 1 else (None, None)
    data = list(seeds.values())
    return Estimate(
        value=value,
        low=float(low),
        high=float(high),
        seeds=len(data),
        tasks=min(len(d.tasks) for d in data),
        rollouts_before=int(sum(d.before[1].sum() for d in data)),
        rollouts_after=int(sum(d.after[arm][1].sum() for d in data for arm in arms)),
        adjusted_low=None if adjusted[0] is None else float(adjusted[0]),
        adjusted_high=None if adjusted[1] is None else float(adjusted[1]),
        comparisons=comparisons,
    )


def gain(
    rows: Iterable[EvidenceRow],
    arm: str,
    harness: str,
    *,
    comparisons: int = 1,
    suite: str | None = None,
    seed: int = 0,
    n_resamples: int = N_RESAMPLES,
) -> Estimate:
    """The gain of `arm` evaluated in `harness`, with its 95 % (and Bonferroni) interval."""
    points, draws, seeds = gain_draws(rows, harness, [arm], suite=suite, seed=seed, n_resamples=n_resamples)
    return _estimate(points[arm], draws[arm], seeds, [arm], comparisons)


def difference(
    rows: Iterable[EvidenceRow],
    arm: str,
    other: str,
    harness: str,
    *,
    comparisons: int = 1,
    suite: str | None = None,
    seed: int = 0,
) -> Estimate:
    """gain(arm) - gain(other) in `harness`, over the seeds both have, from shared resamples."""
    points, draws, seeds = gain_draws(rows, harness, [arm, other], suite=suite, seed=seed)
    return _estimate(points[arm] - points[other], draws[arm] - draws[other], seeds, [arm, other], comparisons)
