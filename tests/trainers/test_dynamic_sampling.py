"""Dynamic sampling (`env.extra_groups`): more groups for a step while its groups score all alike.

The real path: a tiny random model through the real white-box loop never succeeds, so every group is
degenerate and the whole budget is drawn. The branch that stops early is checked with a named test double
(`ScriptedRewardEnv`: rollouts whose rewards a table fixes per task), through the same `collect`."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import numpy as np

from evaluation.evidence import read_rows
from trainers.loop import TaskSampler, collect, dynamic_sampling_metrics
from trainers.main import compose


class ScriptedRewardEnv:
    """Test double of a ClawGymEnv for `collect`: rollout k of task t scores rewards[t][k % len]."""

    def __init__(self, rewards: dict[str, list[float]]) -> None:
        self.rewards = rewards
        self.harness = SimpleNamespace(name="Double")
        self.options = SimpleNamespace(rollout_timeout_s=60)
        self.runtime = SimpleNamespace(run=asyncio.run)
        self.counts: dict[str, int] = {}

    async def arollout(self, policy: Any, task: Any, rollout_id: str) -> Any:
        k = self.counts.get(task.id, 0)
        self.counts[task.id] = k + 1
        reward = self.rewards[task.id][k % len(self.rewards[task.id])]
        forest = SimpleNamespace(stats=SimpleNamespace(calls=1, generated_tokens=3))
        return SimpleNamespace(
            reward=reward, status="ok", task_id=task.id, rollout_id=rollout_id, failure=None, forest=forest, timings={}
        )


def _collect(rewards: dict[str, list[float]], order: list[str], extra_groups: int) -> tuple[Any, ScriptedRewardEnv]:
    env = ScriptedRewardEnv(rewards)
    tasks = [SimpleNamespace(id=t, timeout_s=60) for t in order]
    sampler = TaskSampler(len(tasks), 0)
    sampler.order, sampler.pos = list(range(len(tasks))), 0  # draw the tasks in the given order
    cfg = compose(["env.group_size=2", "env.tasks_per_step=1", f"env.extra_groups={extra_groups}", "run_dir=/tmp/x"])
    return collect([env], [sampler], [tasks], policy=None, cfg=cfg), env


def test_extra_groups_stop_at_the_first_group_with_signal() -> None:
    rewards = {"flat0": [0.0], "flat1": [1.0], "mixed": [0.0, 1.0], "unused": [0.0, 0.5]}
    batch, env = _collect(rewards, ["flat0", "flat1", "mixed", "unused"], extra_groups=3)
    assert batch.task_ids == ["flat0", "flat0", "flat1", "flat1", "mixed", "mixed"]  # "unused" never drawn
    assert dynamic_sampling_metrics(batch) == {"groups_extra": 2.0, "groups_extra_useful": 1.0}
    assert [i.get("extra_group") for i in batch.infos] == [None, None, 0, 0, 1, 1]
    assert np.array_equal(batch.rewards, [0.0, 0.0, 1.0, 1.0, 0.0, 1.0])


def test_the_budget_bounds_the_extra_groups_and_off_means_none() -> None:
    flat = {"a": [0.0], "b": [0.0], "c": [0.0]}
    batch, _ = _collect(flat, ["a", "b", "c"], extra_groups=1)
    assert dynamic_sampling_metrics(batch) == {"groups_extra": 1.0, "groups_extra_useful": 0.0} and len(batch) == 4
    batch, _ = _collect({"m": [0.0, 1.0], "a": [0.0]}, ["m", "a"], extra_groups=5)
    assert dynamic_sampling_metrics(batch)["groups_extra"] == 0.0  # the step had signal: nothing more drawn
    batch, _ = _collect(flat, ["a", "b", "c"], extra_groups=0)
    assert len(batch) == 2


def test_a_real_run_draws_its_budget_when_nothing_succeeds_and_logs_it(tmp_path) -> None:
    from trainers.loop import train

    cfg = compose(
        [
            "model=tiny-qwen3",
            "env=clawgym_whitebox",
            f"run_dir={tmp_path}",
            "steps=1",
            "optim.total_steps=1",
            "env.group_size=2",
            "env.tasks_per_step=1",
            "env.extra_groups=2",
            "env.eval_tasks=1",
            "eval.repeats=1",
            "eval.at_start=false",
            "env.options.max_new_tokens=8",
            "env.options.max_calls=1",
            "logging.progress=false",
            "logging.tensorboard=false",
        ]
    )
    train(cfg)
    (step,) = [
        r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"
    ]
    assert step["groups_extra"] == 2 and step["groups_extra_useful"] == 0  # the random model scores 0 everywhere
    assert step["groups"] == 3 and step["groups_degenerate"] == 3
    rows = read_rows(tmp_path / "rollouts.jsonl")
    assert len(rows) == 6 and sum(r.extra_group for r in rows) == 4 and {r.step for r in rows} == {1}
