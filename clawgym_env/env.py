"""The episodic environment: one `step` is one whole rollout of a harness on a task.

    env = clawgym_env.make("OfficeQA-ClaudeCode")
    obs, info = env.reset(seed=0)                 # obs: {"task_id", "instruction"}
    forest, reward, terminated, truncated, info = env.step(policy)

The action is the policy itself (an engine plus its renderer): the harness owns the control flow, so
the agent's many model calls all happen inside one step. A failed rollout returns `truncated=True`,
reward 0.0 and `info["status"] == "failed"` with the stage and reason; it is never a zero-reward success.
With `score_capped=True`, a rollout the proxy cut off at its call or token cap is `truncated=True` too, but
verified and scored (`info["status"] == "ok"`, `info["truncated_by"]` names the cap).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from clawgym_env.interfaces import HarnessAdapter, Policy
from clawgym_env.rollout import RolloutResult, new_rollout_id, run_rollout
from clawgym_env.runtime import Runtime
from clawgym_env.specs import EnvOptions, EnvSpec, HarnessSpec, TaskSpec, TaskSuite
from clawgym_env.trajectory import TrajectoryForest


class UnicodeText(spaces.Space[str]):
    """Any str up to `max_length` characters (gymnasium's Text space only admits a fixed charset)."""

    def __init__(self, max_length: int, seed: int | None = None) -> None:
        self.max_length = max_length
        super().__init__(dtype=str, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(1, min(self.max_length, 64) + 1))
        return "".join(self.np_random.choice(list(string.ascii_letters + " "), size=n))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"UnicodeText({self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnicodeText) and other.max_length == self.max_length


class PolicySpace(spaces.Space[Policy]):
    """The action space: a Policy (inference engine + renderer). It cannot be sampled."""

    def __init__(self) -> None:
        super().__init__(dtype=object)

    def sample(self, mask: Any = None, probability: Any = None) -> Policy:
        raise NotImplementedError(
            "a policy cannot be sampled from the action space; pass your own clawgym_env.Policy "
            "(for example clawgym_env.policies.make_policy('tiny-qwen3')) to env.step"
        )

    def contains(self, x: Any) -> bool:
        return isinstance(x, Policy)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "PolicySpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PolicySpace)


class EpisodeObservation(spaces.Space[Any]):
    """What the env observes: the task instance at `reset`, the rollout's TrajectoryForest at `step`."""

    def __init__(self) -> None:
        self.task = spaces.Dict({"task_id": UnicodeText(256), "instruction": UnicodeText(1_000_000)})
        super().__init__(dtype=object)

    def sample(self, mask: Any = None, probability: Any = None) -> dict[str, str]:
        return self.task.sample()

    def seed(self, seed: int | None = None) -> Any:
        return self.task.seed(seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, TrajectoryForest) or (isinstance(x, dict) and x in self.task)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"EpisodeObservation(reset={self.task}, step=TrajectoryForest)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EpisodeObservation)


def observation_space() -> EpisodeObservation:
    return EpisodeObservation()


class ClawGymEnv(gym.Env[dict[str, str], Policy]):
    metadata = {"render_modes": []}

    def __init__(
        self,
        spec: EnvSpec,
        suite: TaskSuite,
        harness: HarnessSpec,
        options: EnvOptions,
        runtime: Runtime | None = None,
    ) -> None:
        self.env_spec = spec
        self.suite = suite
        self.harness = harness
        self.options = options
        self.observation_space = observation_space()
        self.action_space = PolicySpace()
        self._runtime = runtime
        self._adapter: HarnessAdapter | None = None
        self._task: TaskSpec | None = None
        self._done = True
        self.last_result: RolloutResult | None = None

    # ------------------------------------------------------------------ parts, made on first use
    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            options = self.options
            if options.proxy_shards > 1 and not options.run_dir:
                raise ValueError("proxy_shards > 1 needs a run_dir: the shared default runtime has one proxy process")
            self._runtime = (
                Runtime(options.run_dir, proxy_shards=options.proxy_shards) if options.run_dir else Runtime.default()
            )
        return self._runtime

    @property
    def adapter(self) -> HarnessAdapter:
        if self._adapter is None:
            self._adapter = self.harness.make_adapter(**self.options.harness_options)
        return self._adapter

    def tasks(self, split: str | None = None) -> list[TaskSpec]:
        return self.suite.load(split or self.options.split, **self.options.suite_kwargs)

    @property
    def task(self) -> TaskSpec | None:
        """The task instance chosen by the last reset."""
        return self._task

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict]:
        """Pick a task instance: `options={"task_id": ...}`, else deterministically from the seed."""
        super().reset(seed=seed)
        options = options or {}
        tasks = self.tasks(options.get("split"))
        if not tasks:
            raise ValueError(
                f"suite {self.suite.name} has no tasks in split {options.get('split', self.options.split)!r}"
            )
        if "task_id" in options:
            by_id = {t.id: t for t in tasks}
            if options["task_id"] not in by_id:
                import difflib

                close = difflib.get_close_matches(str(options["task_id"]), list(by_id), n=3)
                raise KeyError(f"no task {options['task_id']!r} in {self.suite.name}; close matches: {close}")
            self._task = by_id[options["task_id"]]
        else:
            self._task = tasks[int(self.np_random.integers(len(tasks)))]
        self._done = False
        return self._observation(self._task), {"task_id": self._task.id, "metadata": dict(self._task.metadata)}

    def step(self, action: Policy) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self._task is None or self._done:
            raise RuntimeError("call env.reset() before env.step(policy): each step is one whole rollout")
        if not self.action_space.contains(action):
            raise TypeError(f"env.step expects a clawgym_env.Policy (engine + renderer), got {type(action).__name__}")
        result = self.runtime.run(self.arollout(action, self._task))
        self._done = True
        self.last_result = result
        truncated = result.status != "ok" or result.truncated_by is not None
        return result.forest, float(result.reward), True, truncated, result.info()

    async def arollout(self, policy: Policy, task: TaskSpec, rollout_id: str | None = None) -> RolloutResult:
        """One rollout as a coroutine on the runtime loop (the vector env gathers many of these)."""
        proxy = await self.runtime.proxy()
        backend = await self.runtime.backend(self.options.backend, self.options.backend_options)
        result = await run_rollout(
            task=task,
            adapter=self.adapter,
            policy=policy,
            backend=backend,
            proxy=proxy,
            options=self.options,
            rollout_id=rollout_id or new_rollout_id(),
            artifacts_dir=self.runtime.run_dir / "rollouts",
        )
        if result.failure is not None:
            self.runtime.failures.add(result.failure.stage, result.failure.reason)
        return result

    def close(self) -> None:
        # The shared default runtime outlives one env; a private one (own run_dir) is closed with it.
        if self._runtime is not None and not Runtime.is_default(self._runtime):
            self._runtime.close()
        self._runtime = None
        super().close()

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _observation(task: TaskSpec) -> dict[str, str]:
        return {"task_id": task.id, "instruction": task.instruction}

    @property
    def run_dir(self) -> Path:
        return self.runtime.run_dir

    def __repr__(self) -> str:
        return (
            f"ClawGymEnv<{self.env_spec.id}>(suite={self.suite.name}, harness={self.harness.name}, "
            f"api={self.harness.api_style.value}, backend={self.options.backend}, split={self.options.split})"
        )

    def __str__(self) -> str:
        return repr(self)
