"""Shared machinery of every verifier: timeouts, crash reporting, and the host copy of the workspace.

A verifier that crashes or runs out of time must say so (`VerifierResult.failure`), never hand back a
silent 0: a 0 would teach the policy that a good answer was wrong.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

from clawgym_env.interfaces import VerifierResult, VerifyContext
from clawgym_env.sandbox.host_files import remove_tree


class VerifierConfigError(ValueError):
    """The verifier itself is set up wrongly (not the agent's fault); reported as a verifier error."""


class BaseVerifier:
    """Wraps `_verify` with a timeout and turns any exception into an explicit verifier error."""

    name: str = "verifier"
    timeout_s: float | None = 120.0

    async def verify(self, ctx: VerifyContext) -> VerifierResult:
        try:
            if self.timeout_s is None:
                return await self._verify(ctx)
            return await asyncio.wait_for(self._verify(ctx), timeout=self.timeout_s)
        except TimeoutError:
            return VerifierResult.failure(f"{self.name} timed out after {self.timeout_s:g} s")
        except VerifierConfigError as exc:
            return VerifierResult.failure(f"{self.name} is misconfigured: {exc}")
        except Exception as exc:  # noqa: BLE001 - any crash is reported, not swallowed into a 0
            return VerifierResult.failure(f"{self.name} crashed: {type(exc).__name__}: {exc}")

    async def _verify(self, ctx: VerifyContext) -> VerifierResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


@asynccontextmanager
async def host_workspace(ctx: VerifyContext) -> AsyncIterator[Path]:
    """The host copy of the final workspace: `ctx.workspace_dir`, or one downloaded from the sandbox."""
    if ctx.workspace_dir is not None:
        yield Path(ctx.workspace_dir)
        return
    end_agent = getattr(ctx.sandbox, "end_agent_processes", None)
    if end_agent is not None:  # nothing the agent left running may change the workspace while it is copied
        await end_agent()
    tmp = Path(tempfile.mkdtemp(prefix="clawgym-verify-"))
    try:
        yield Path(await ctx.sandbox.download_workspace(tmp / "workspace"))
    finally:  # rm -rf off the event loop: any depth, any number of files
        await asyncio.to_thread(remove_tree, tmp)


def weighted_mean(scores: dict[str, float], weights: dict[str, float] | None = None) -> float:
    """Mean of sub-scores, weighted by name (missing weights count 1); clipped to [0, 1]."""
    if not scores:
        return 0.0
    weights = weights or {}
    total_w = sum(max(0.0, float(weights.get(k, 1.0))) for k in scores)
    if total_w <= 0:
        raise VerifierConfigError(f"all weights are zero for sub-scores {sorted(scores)}")
    value = sum(max(0.0, float(weights.get(k, 1.0))) * v for k, v in scores.items()) / total_w
    return min(1.0, max(0.0, value))


def check_weights(names: Iterable[str], weights: dict[str, float] | None) -> None:
    """Reject weights for unknown names and negative weights: a typo would silently drop a criterion."""
    if not weights:
        return
    names = set(names)
    unknown = sorted(set(weights) - names)
    if unknown:
        raise VerifierConfigError(f"weights name unknown sub-scores {unknown}; known: {sorted(names)}")
    negative = {k: v for k, v in weights.items() if v < 0}
    if negative:
        raise VerifierConfigError(f"weights must be >= 0, got {negative}")
