"""The registry: task suites × harnesses = environments, with `register` and `make`.

Registering a suite pairs it with every registered harness (and a harness with every suite), so a
user's new suite is immediately available as `<Suite>-ClaudeCode`, `<Suite>-WhiteBox`, and so on.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from clawgym_env.specs import EnvOptions, EnvSpec, HarnessSpec, TaskSuite

if TYPE_CHECKING:
    from clawgym_env.env import ClawGymEnv
    from clawgym_env.runtime import Runtime


class UnknownEnvironmentError(KeyError):
    """An id that is not registered; the message lists the close matches."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it readable
        return str(self.args[0]) if self.args else ""


class Registry:
    def __init__(self) -> None:
        self.suites: dict[str, TaskSuite] = {}
        self.harnesses: dict[str, HarnessSpec] = {}
        self.envs: dict[str, EnvSpec] = {}

    # ------------------------------------------------------------------ registration
    def register_suite(self, suite: TaskSuite, *, pair: bool = True) -> TaskSuite:
        self.suites[suite.name] = suite
        if pair:
            for harness in self.harnesses:
                self._pair(suite.name, harness)
        return suite

    def register_harness(self, harness: HarnessSpec, *, pair: bool = True) -> HarnessSpec:
        self.harnesses[harness.name] = harness
        if pair:
            for suite in self.suites:
                self._pair(suite, harness.name)
        return harness

    def register_env(self, spec: EnvSpec) -> EnvSpec:
        for kind, name, table in (("suite", spec.suite, self.suites), ("harness", spec.harness, self.harnesses)):
            if name not in table:
                raise UnknownEnvironmentError(
                    f"cannot register {spec.id}: {kind} {name!r} is not registered; register it first "
                    f"(known {kind}s: {sorted(table)})"
                )
        self.envs[spec.id] = spec
        return spec

    def _pair(self, suite: str, harness: str) -> None:
        env_id = f"{suite}-{harness}"
        if env_id not in self.envs:
            self.envs[env_id] = EnvSpec(id=env_id, suite=suite, harness=harness)

    # ------------------------------------------------------------------ lookup
    def spec(self, env_id: str) -> EnvSpec:
        if env_id in self.envs:
            return self.envs[env_id]
        close = difflib.get_close_matches(env_id, list(self.envs), n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise UnknownEnvironmentError(
            f"No environment with id {env_id!r}.{hint} Ids are '<Suite>-<Harness>'; "
            f"`clawgym list` or clawgym_env.registry.list() shows all {len(self.envs)}."
        )

    def list(self) -> list[str]:
        return sorted(self.envs)

    def __iter__(self) -> Iterator[str]:
        return iter(self.list())

    def __contains__(self, env_id: object) -> bool:
        return env_id in self.envs

    def __len__(self) -> int:
        return len(self.envs)

    def __repr__(self) -> str:
        return f"Registry({len(self.suites)} suites × {len(self.harnesses)} harnesses = {len(self.envs)} envs)"


registry = Registry()


def register(spec: TaskSuite | HarnessSpec | EnvSpec, /) -> TaskSuite | HarnessSpec | EnvSpec:
    """Register a task suite (paired with every harness), a harness (paired with every suite), or one
    (suite, harness) pair with its own default options: `register(TaskSuite(name=..., tasks=[...]))`,
    `register(HarnessSpec(name=..., adapter=..., api_style=...))`, `register(EnvSpec(id=..., suite=...,
    harness=..., options=...))`. A bad spec raises pydantic's ValidationError naming the field when it is made.
    """
    if isinstance(spec, TaskSuite):
        return registry.register_suite(spec)
    if isinstance(spec, HarnessSpec):
        return registry.register_harness(spec)
    if isinstance(spec, EnvSpec):
        return registry.register_env(spec)
    raise TypeError(
        f"register() takes a TaskSuite, a HarnessSpec or an EnvSpec, not {type(spec).__name__}: e.g. "
        "register(TaskSuite(name='MySuite', tasks=[...]))"
    )


def make(env_id: str, *, runtime: Runtime | None = None, **overrides: Any) -> ClawGymEnv:
    """Build the environment `<Suite>-<Harness>`; keyword overrides update its EnvOptions.

    runtime: the proxy, sandbox backend and event loop to run on, shared with other environments (a trainer's
    or an evaluation's own `Runtime`); by default the process-wide one, started on first use.
    """
    from clawgym_env.env import ClawGymEnv

    spec = registry.spec(env_id)
    # Re-validated so that a bad override raises pydantic's ValidationError naming the option.
    options = EnvOptions.model_validate({**spec.options.model_dump(), **overrides})
    return ClawGymEnv(
        spec=spec,
        suite=registry.suites[spec.suite],
        harness=registry.harnesses[spec.harness],
        options=options,
        runtime=runtime,
    )
