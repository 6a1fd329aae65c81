"""N rollouts at once: the groups GRPO needs, with bounded concurrency and per-rollout timeouts.

    venv = clawgym_env.make_vec("OfficeQA-ClaudeCode", num_envs=8, max_concurrency=4)
    obs, info = venv.reset(seed=0)                     # by default all 8 get the same task (one group)
    forests, rewards, terminated, truncated, info = venv.step(policy)

A failed rollout comes back as a failure (truncated, reward 0.0, `info["status"][i] == "failed"` and
`info["failure"][i]` with its stage and reason), never as an exception in the caller's loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from clawgym_env.env import ClawGymEnv, PolicySpace, observation_space
from clawgym_env.interfaces import Policy
from clawgym_env.rollout import RolloutFailure, RolloutResult, new_rollout_id
from clawgym_env.specs import TaskSpec
from clawgym_env.trajectory import TrajectoryForest


class ClawGymVectorEnv(VectorEnv):
    def __init__(self, env: ClawGymEnv, num_envs: int, max_concurrency: int | None = None) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.env = env
        self.num_envs = num_envs
        self.max_concurrency = max(1, max_concurrency or num_envs)
        self.single_observation_space = observation_space()
        self.single_action_space = PolicySpace()
        self.observation_space = self.single_observation_space  # observations are a tuple of dicts
        self.action_space = self.single_action_space  # one policy acts for all sub-envs
        self.metadata = {"autoreset_mode": None}
        self._tasks: list[TaskSpec] = []
        self.last_results: list[RolloutResult] = []

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[dict[str, str], ...], dict[str, Any]]:
        """`options={"same_task": False}` draws a task per sub-env; `{"task_id": ...}` pins one."""
        options = dict(options or {})
        same_task = options.pop("same_task", True)
        seeds = seed if isinstance(seed, list) else [None if seed is None else seed + i for i in range(self.num_envs)]
        if len(seeds) != self.num_envs:
            raise ValueError(f"got {len(seeds)} seeds for {self.num_envs} sub-environments")
        if same_task:
            obs, _ = self.env.reset(seed=seeds[0], options=options)
            self._tasks = [self.env.task] * self.num_envs
        else:
            self._tasks = []
            for s in seeds:
                self.env.reset(seed=s, options=options)
                self._tasks.append(self.env.task)
        observations = tuple({"task_id": t.id, "instruction": t.instruction} for t in self._tasks)
        return observations, {"task_id": [t.id for t in self._tasks]}

    def step(self, actions: Policy) -> tuple[list[TrajectoryForest], np.ndarray, np.ndarray, np.ndarray, dict]:
        if not self._tasks:
            raise RuntimeError("call venv.reset() before venv.step(policy)")
        if not isinstance(actions, Policy):
            raise TypeError(f"venv.step expects one clawgym_env.Policy for all rollouts, got {type(actions).__name__}")
        results = self.env.runtime.run(self.arollouts(actions, self._tasks))
        self._tasks = []
        self.last_results = results
        forests = [r.forest for r in results]
        rewards = np.array([r.reward for r in results], dtype=np.float64)
        terminated = np.ones(self.num_envs, dtype=bool)
        truncated = np.array([r.status != "ok" or r.truncated_by is not None for r in results], dtype=bool)
        info = {
            "status": np.array([r.status for r in results], dtype=object),
            "failure": [r.failure.model_dump() if r.failure else None for r in results],
            "rollouts": [r.info() for r in results],
        }
        return forests, rewards, terminated, truncated, info

    async def arollouts(self, policy: Policy, tasks: list[TaskSpec]) -> list[RolloutResult]:
        """Run the rollouts with at most `max_concurrency` at a time; failures become results."""
        gate = asyncio.Semaphore(self.max_concurrency)
        timeout = self.env.options.rollout_timeout_s

        async def one(task: TaskSpec) -> RolloutResult:
            rollout_id = new_rollout_id()
            async with gate:
                limit = (timeout or task.timeout_s) + 120  # run_rollout has its own limits; this is the last guard
                try:
                    return await asyncio.wait_for(self.env.arollout(policy, task, rollout_id), timeout=limit)
                except Exception as exc:  # noqa: BLE001 - returned as a failure, never raised
                    reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
                    self.env.runtime.failures.add("rollout", reason)
                    return RolloutResult(
                        rollout_id=rollout_id,
                        task_id=task.id,
                        harness=self.env.harness.name,
                        status="failed",
                        failure=RolloutFailure(stage="rollout", reason=reason),
                        forest=TrajectoryForest.failed(rollout_id, reason, task_id=task.id),
                    )

        return list(await asyncio.gather(*(one(t) for t in tasks)))

    def close(self, **kwargs: Any) -> None:
        self.env.close()

    def __repr__(self) -> str:
        return f"ClawGymVectorEnv({self.env.env_spec.id}, num_envs={self.num_envs}, max_concurrency={self.max_concurrency})"


def make_vec(env_id: str, num_envs: int, max_concurrency: int | None = None, **overrides: Any) -> ClawGymVectorEnv:
    from clawgym_env.registry import make

    return ClawGymVectorEnv(make(env_id, **overrides), num_envs=num_envs, max_concurrency=max_concurrency)
