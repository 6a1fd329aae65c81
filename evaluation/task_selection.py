"""Which task instances an env runs: its split, at a level, the first `count` (evaluation and training)."""

from __future__ import annotations

import inspect
from typing import Any

from clawgym_env.specs import TaskSpec, resolve_callable


def select_tasks(env: Any, *, level: int | None = None, count: int | None = None, seed: int = 0) -> list[TaskSpec]:
    """The env's task instances of its split, at `level`, the first `count` of them.

    Bundled loaders take `level`, `count` and `seed` themselves; for a suite whose loader does not (or a
    suite given as a list of tasks) the level is filtered from `metadata["level"]` and `count` cut here.
    """
    suite = env.suite
    accepted: set[str] | None = set()
    if suite.loader is not None:
        params = inspect.signature(resolve_callable(suite.loader)).parameters
        has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        accepted = None if has_var_kw else set(params)
    wanted = {"level": level, "count": count, "seed": seed}
    kwargs = dict(env.options.suite_kwargs)
    for name, value in wanted.items():
        if value is not None and (accepted is None or name in accepted):
            kwargs[name] = value
    tasks = list(suite.load(env.options.split, **kwargs))
    if level is not None and "level" not in kwargs:
        tasks = [t for t in tasks if t.metadata.get("level") == level]
    if count is not None and "count" not in kwargs:
        tasks = tasks[:count]
    if not tasks:
        raise ValueError(
            f"{env.env_spec.id}: no tasks in split {env.options.split!r}"
            + (f" at level {level}" if level is not None else "")
            + f"; suite {suite.name} has splits {list(suite.splits)}"
        )
    return tasks
