"""CompositeVerifier: weighted sub-verifiers, each one's reward a named sub-score.

Sub-scores of the parts are kept as `part/sub`. If any part errs, the composite errs too (naming the
part): a reward computed without one of its parts would be a different reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clawgym_env.interfaces import Verifier, VerifierResult, VerifyContext, as_verifier
from verifiers.base import BaseVerifier, VerifierConfigError


class CompositeVerifier(BaseVerifier):
    """`CompositeVerifier({"tests": (script, 2.0), "format": checks})`: a bare verifier has weight 1."""

    def __init__(self, parts: Mapping[str, Any], *, name: str = "composite", timeout_s: float | None = None) -> None:
        if not parts:
            raise VerifierConfigError("CompositeVerifier needs at least one part")
        self.parts: dict[str, tuple[Verifier, float]] = {}
        for key, value in parts.items():
            verifier, weight = value if isinstance(value, tuple) else (value, 1.0)
            if weight < 0:
                raise VerifierConfigError(f"part {key!r} has a negative weight")
            self.parts[str(key)] = (as_verifier(verifier), float(weight))
        if sum(w for _, w in self.parts.values()) <= 0:
            raise VerifierConfigError("the part weights sum to 0")
        self.name = name
        self.timeout_s = timeout_s  # each part has its own timeout

    async def _verify(self, ctx: VerifyContext) -> VerifierResult:
        subscores: dict[str, float] = {}
        lines: list[str] = []
        total = weighted = 0.0
        for key, (verifier, weight) in self.parts.items():
            result = await verifier.verify(ctx)
            subscores[key] = result.reward
            subscores.update({f"{key}/{k}": v for k, v in result.subscores.items()})
            lines.append(f"[{key}] reward {result.reward:.3f} (w={weight:g}): {result.explanation}")
            if result.error:
                return VerifierResult(
                    reward=0.0, subscores=subscores, error=f"part {key!r}: {result.error}", explanation="\n".join(lines)
                )
            total += weight
            weighted += weight * result.reward
        return VerifierResult(reward=min(1.0, weighted / total), subscores=subscores, explanation="\n".join(lines))
