"""Python check functions over the host copy of the final workspace, returning named sub-scores.

    @python_check(weights={"answer": 3})
    def check(workspace: Path) -> dict[str, float | bool]:
        return {"exists": (workspace / "answer.txt").exists(), "answer": ...}

A function may also take the harness's final message as a second argument, or return a single float.
It runs in a child process (`verifiers.isolated`: pickled with cloudpickle, so lambdas and closures work) with a
memory limit (`memory_mb`) and a time limit (`timeout_s`); an exception, a limit reached or a score outside
[0, 1] is a verifier error. An `async def` check runs on the event loop, as before.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from clawgym_env.interfaces import VerifierResult, VerifyContext
from verifiers.base import BaseVerifier, VerifierConfigError, check_weights, host_workspace, weighted_mean
from verifiers.isolated import DEFAULT_MEMORY_MB, CheckLimitError, run_isolated


def _as_score(name: str, value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and not math.isnan(float(value)) and 0.0 <= float(value) <= 1.0:
        return float(value)
    raise VerifierConfigError(f"sub-score {name!r} is {value!r}; each must be a bool or a float in [0, 1]")


class CheckFunctionVerifier(BaseVerifier):
    """Runs `fn(workspace_dir[, final_message])` and turns its output into reward + sub-scores."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        weights: Mapping[str, float] | None = None,
        name: str | None = None,
        timeout_s: float = 60.0,
        memory_mb: int = DEFAULT_MEMORY_MB,
    ) -> None:
        if not callable(fn):
            raise VerifierConfigError(f"CheckFunctionVerifier needs a function, got {type(fn).__name__}")
        self.fn = fn
        self.weights = dict(weights or {})
        self.name = name or getattr(fn, "__name__", "check")
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        params = [p for p in inspect.signature(fn).parameters.values() if p.default is inspect.Parameter.empty]
        self._takes_message = len(params) >= 2

    def __call__(self, *args: Any) -> Any:  # keeps a decorated function callable as before
        return self.fn(*args)

    async def _verify(self, ctx: VerifyContext) -> VerifierResult:
        message = ctx.harness_result.final_message if ctx.harness_result else ""
        async with host_workspace(ctx) as workspace:
            args: list[Any] = [Path(workspace)] + ([message] if self._takes_message else [])
            if inspect.iscoroutinefunction(self.fn):
                value = await self.fn(*args)
            else:
                try:
                    value = await run_isolated(self.fn, *args, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
                except CheckLimitError as exc:
                    return VerifierResult.failure(f"{self.name} {exc}")
        return self._to_result(value)

    def _to_result(self, value: Any) -> VerifierResult:
        if isinstance(value, VerifierResult):
            return value
        if isinstance(value, Mapping):
            if not value:
                raise VerifierConfigError("the check returned an empty dict; return at least one named sub-score")
            scores = {str(k): _as_score(str(k), v) for k, v in value.items()}
            check_weights(scores, self.weights)
            reward = weighted_mean(scores, self.weights)
            failed = [k for k, v in scores.items() if v < 1.0]
            explanation = "all checks passed" if not failed else f"not full marks: {', '.join(failed)}"
            return VerifierResult(reward=reward, subscores=scores, explanation=explanation)
        score = _as_score(self.name, value)
        return VerifierResult(reward=score, subscores={self.name: score}, explanation=f"{self.name} = {score:g}")


def python_check(
    fn: Callable[..., Any] | None = None,
    *,
    weights: Mapping[str, float] | None = None,
    name: str | None = None,
    timeout_s: float = 60.0,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> Any:
    """Decorator (with or without arguments) that makes a check function a `CheckFunctionVerifier`."""

    def wrap(f: Callable[..., Any]) -> CheckFunctionVerifier:
        return CheckFunctionVerifier(f, weights=weights, name=name, timeout_s=timeout_s, memory_mb=memory_mb)

    return wrap(fn) if fn is not None else wrap
