"""What a verifier is: something with `async verify(ctx) -> VerifierResult`, or a plain check function.

Its own module, below both `specs` (a TaskSpec coerces its verifier when it is made) and `interfaces` (which
re-exports these names beside `VerifyContext`), so neither has to import the other back.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from clawgym_env.interfaces import VerifyContext

__all__ = ["FunctionVerifier", "Verifier", "VerifierResult", "as_verifier", "coerce_verifier_output"]


class VerifierResult(BaseModel):
    """A reward in [0, 1] with named sub-scores; a crashed verifier says so instead of scoring 0."""

    reward: float = Field(ge=0.0, le=1.0)
    subscores: dict[str, float] = Field(default_factory=dict)
    explanation: str = ""
    error: str | None = None

    @classmethod
    def failure(cls, error: str) -> VerifierResult:
        return cls(reward=0.0, error=error, explanation=f"verifier error: {error}")


@runtime_checkable
class Verifier(Protocol):
    async def verify(self, ctx: VerifyContext) -> VerifierResult: ...


class FunctionVerifier:
    """Wraps a plain function `(workspace_dir: Path[, final_message: str]) -> float | dict | VerifierResult`.

    A dict is read as named sub-scores in [0, 1], averaged into the reward.
    """

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "check")
        self._takes_message = len(inspect.signature(fn).parameters) >= 2

    async def verify(self, ctx: VerifyContext) -> VerifierResult:
        if ctx.workspace_dir is None:
            return VerifierResult.failure("FunctionVerifier needs the downloaded workspace (workspace_dir)")
        args: list[Any] = [ctx.workspace_dir]
        if self._takes_message:
            args.append(ctx.harness_result.final_message if ctx.harness_result else "")
        value = self.fn(*args)
        if inspect.isawaitable(value):
            value = await value
        return coerce_verifier_output(value, source=self.name)

    def __repr__(self) -> str:
        return f"FunctionVerifier({self.name})"


def coerce_verifier_output(value: Any, source: str = "verifier") -> VerifierResult:
    if isinstance(value, VerifierResult):
        return value
    if isinstance(value, bool):
        value = float(value)
    if isinstance(value, (int, float)):
        if not (0.0 <= float(value) <= 1.0) or math.isnan(float(value)):
            return VerifierResult.failure(f"{source} returned {value!r}, outside [0, 1]")
        return VerifierResult(reward=float(value))
    if isinstance(value, Mapping) and value:
        scores = {str(k): float(v) for k, v in value.items()}
        bad = {k: v for k, v in scores.items() if not (0.0 <= v <= 1.0)}
        if bad:
            return VerifierResult.failure(f"{source} sub-scores outside [0, 1]: {bad}")
        return VerifierResult(reward=sum(scores.values()) / len(scores), subscores=scores)
    return VerifierResult.failure(f"{source} returned {type(value).__name__}; expected a float, dict or VerifierResult")


def as_verifier(value: Any) -> Verifier:
    """Accept a Verifier, or a plain check function (wrapped in FunctionVerifier)."""
    if isinstance(value, Verifier):
        return value
    if callable(value):
        return FunctionVerifier(value)
    raise TypeError(
        f"verifier must have an async `verify(ctx)` method or be a function (workspace_dir) -> float | dict; "
        f"got {type(value).__name__}"
    )
