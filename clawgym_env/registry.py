"""The registry: task suites × harnesses = environments, with `register` and `make`.

Registering a suite pairs it with every registered harness (and a harness with every suite), so a
user's new suite is immediately available as `<Suite>-ClaudeCode`, `<Suite>-WhiteBox`, and so on.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from clawgym_env.specs import ApiStyle, EnvOptions, EnvSpec, HarnessSpec, TaskSpec, TaskSuite

if TYPE_CHECKING:
    from clawgym_env.env import ClawGymEnv


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


def register(
    item: TaskSuite | HarnessSpec | EnvSpec | str | None = None,
    /,
    *,
    name: str | None = None,
    tasks: list[TaskSpec] | None = None,
    loader: Callable[..., list[TaskSpec]] | str | None = None,
    adapter: Callable[..., Any] | str | None = None,
    api_style: ApiStyle | str | None = None,
    suite: str | None = None,
    harness: str | None = None,
    **options: Any,
) -> TaskSuite | HarnessSpec | EnvSpec:
    """Register a task suite, a harness, or a (suite, harness) pair.

    - `register(TaskSuite(...))` or `register(name="MySuite", tasks=[...])` / `loader=fn`: a suite,
      paired with every harness.
    - `register(HarnessSpec(...))` or `register(name="MyHarness", adapter=..., api_style=...)`: a harness.
    - `register("MySuite-ClaudeCode", suite="MySuite", harness="ClaudeCode", **env_options)` or
      `register(EnvSpec(...))`: one pair with its own default options.
    A bad spec raises pydantic's ValidationError naming the field.
    """
    if isinstance(item, TaskSuite):
        return registry.register_suite(item)
    if isinstance(item, HarnessSpec):
        return registry.register_harness(item)
    if isinstance(item, EnvSpec):
        return registry.register_env(item)
    if isinstance(item, str):
        if suite is None or harness is None:
            suite, _, harness = item.partition("-")
        return registry.register_env(EnvSpec(id=item, suite=suite, harness=harness, options=EnvOptions(**options)))
    if item is not None:
        raise TypeError(f"register() takes a TaskSuite, HarnessSpec, EnvSpec or env id, not {type(item).__name__}")
    if adapter is not None or api_style is not None:
        return registry.register_harness(HarnessSpec(name=name, adapter=adapter, api_style=api_style, **options))
    if tasks is not None or loader is not None:
        return registry.register_suite(TaskSuite(name=name, tasks=tasks, loader=loader, **options))
    raise TypeError(
        "register() needs a suite (name + tasks or loader), a harness (name + adapter + api_style) "
        "or a pair (id + suite + harness)"
    )


def make(env_id: str, **overrides: Any) -> ClawGymEnv:
    """Build the environment `<Suite>-<Harness>`; keyword overrides update its EnvOptions."""
    from clawgym_env.env import ClawGymEnv

    spec = registry.spec(env_id)
    # Re-validated so that a bad override raises pydantic's ValidationError naming the option.
    options = EnvOptions.model_validate({**spec.options.model_dump(), **overrides})
    return ClawGymEnv(
        spec=spec,
        suite=registry.suites[spec.suite],
        harness=registry.harnesses[spec.harness],
        options=options,
    )
