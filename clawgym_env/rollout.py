"""One rollout, start to finish: sandbox → proxy route → harness → verifier → reconstruction.

Each stage's failure ends the rollout as a counted failure with its stage and reason; the sandbox is
destroyed and the route closed whatever happened, and the calls recorded so far are kept (they are in
the proxy's durable log) and still rebuilt into the forest for inspection.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from clawgym_env.interfaces import (
    HarnessAdapter,
    HarnessContext,
    HarnessResult,
    Policy,
    RolloutLimits,
    RolloutProxy,
    SandboxBackend,
    SandboxLimits,
    VerifierResult,
    VerifyContext,
)
from clawgym_env.records import ModelCall
from clawgym_env.sandbox.host_files import remove_tree
from clawgym_env.specs import ApiStyle, EnvOptions, TaskSpec
from clawgym_env.trajectory import TrajectoryForest


class RolloutFailure(BaseModel):
    stage: str  # "sandbox" | "route" | "harness" | "verifier" | "reconstruct" | "timeout" | "cancelled"
    reason: str


class RolloutResult(BaseModel):
    """Everything a rollout produced; `forest` is what `env.step` returns."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    rollout_id: str
    task_id: str
    harness: str
    status: str = "ok"  # "ok" | "failed" | "empty"
    failure: RolloutFailure | None = None
    reward: float = 0.0
    verifier: VerifierResult | None = None
    harness_result: HarnessResult | None = None
    forest: TrajectoryForest
    calls: list[ModelCall] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)
    truncated_by: str | None = None  # "call_cap" | "token_cap": cut at the rollout budget, scored (score_capped)

    def info(self) -> dict[str, Any]:
        """The `info` dict of `env.step`."""
        return {
            "rollout_id": self.rollout_id,
            "task_id": self.task_id,
            "harness": self.harness,
            "status": self.status,
            "failure": self.failure.model_dump() if self.failure else None,
            "subscores": dict(self.verifier.subscores) if self.verifier else {},
            "verifier_explanation": self.verifier.explanation if self.verifier else "",
            "verifier_error": self.verifier.error if self.verifier else None,
            "harness_result": self.harness_result.model_dump(exclude={"events"}) if self.harness_result else None,
            "num_calls": len(self.calls),
            "truncated_by": self.truncated_by,
            "forest_stats": self.forest.stats.model_dump(),
            "timings": dict(self.timings),
        }


def new_rollout_id() -> str:
    return uuid.uuid4().hex[:16]


class StageFailed(Exception):
    """Ends a rollout at one stage; carries the RolloutFailure to report."""

    def __init__(self, stage: str, exc: BaseException | str, harness_result: HarnessResult | None = None) -> None:
        reason = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        super().__init__(f"{stage}: {reason}")
        self.failure = RolloutFailure(stage=stage, reason=reason)
        self.harness_result = harness_result  # a harness that ran but failed still reports what it did


async def run_rollout(
    *,
    task: TaskSpec,
    adapter: HarnessAdapter,
    policy: Policy,
    backend: SandboxBackend,
    proxy: RolloutProxy | None,
    options: EnvOptions,
    rollout_id: str | None = None,
    artifacts_dir: Path | None = None,
) -> RolloutResult:
    """Run one rollout; never raises for a failure of the sandbox, harness, verifier or reconstruction.

    Stages: open the sandbox, open the proxy route, run the harness, verify (after every agent process
    is gone), then always close the route and destroy the sandbox, and rebuild the forest from the calls.
    """
    rollout_id = rollout_id or new_rollout_id()
    timeout_s = options.rollout_timeout_s or task.timeout_s
    timings: dict[str, float] = {}
    failure: RolloutFailure | None = None
    harness_result: HarnessResult | None = None
    verdict: VerifierResult | None = None
    truncated_by: str | None = None
    sandbox: Any = None
    route_open = False
    calls: list[ModelCall] = []
    t0 = time.perf_counter()
    try:
        sandbox = await _timed(timings, "sandbox_s", open_sandbox_stage(task, backend, proxy, timeout_s, rollout_id))
        ctx = open_route_stage(task, adapter, policy, proxy, sandbox, backend, options, rollout_id, timeout_s)
        route_open = True
        harness_result, truncated_by = await _timed(
            timings, "harness_s", harness_stage(adapter, ctx, proxy, options, timeout_s)
        )
        verdict = await _timed(
            timings, "verify_s", verify_stage(task, sandbox, harness_result, rollout_id, artifacts_dir, options)
        )
        if verdict.error:
            raise StageFailed("verifier", verdict.error)
    except StageFailed as stop:
        failure = stop.failure
        harness_result = harness_result or stop.harness_result
    finally:
        if route_open and proxy is not None:
            calls = proxy.close_rollout(rollout_id)
        destroy_failure = await close_sandbox_stage(sandbox)
        failure = failure or destroy_failure
    return result_stage(
        task, adapter, rollout_id, calls, failure, verdict, harness_result, truncated_by, options, timings, t0
    )


async def _timed(timings: dict[str, float], name: str, stage: Any) -> Any:
    started = time.perf_counter()
    try:
        return await stage
    finally:
        timings[name] = time.perf_counter() - started


async def open_sandbox_stage(
    task: TaskSpec, backend: SandboxBackend, proxy: RolloutProxy | None, timeout_s: float, rollout_id: str
) -> Any:
    """A sandbox with the backend's limits, its wall time covering this task's timeout, bound to the proxy
    (the shard of a `ShardedProxy`) that will serve the rollout."""
    base = getattr(backend, "limits", None) or SandboxLimits()
    limits = base.model_copy(update={"wall_time_s": max(base.wall_time_s, timeout_s + 60)})
    try:
        return await backend.create(
            task, proxy=None if proxy is None else proxy.endpoint_for(rollout_id), limits=limits
        )
    except Exception as exc:  # noqa: BLE001 - reported as the rollout's failure
        raise StageFailed("sandbox", exc) from exc


def open_route_stage(
    task: TaskSpec,
    adapter: HarnessAdapter,
    policy: Policy,
    proxy: RolloutProxy | None,
    sandbox: Any,
    backend: SandboxBackend,
    options: EnvOptions,
    rollout_id: str,
    timeout_s: float,
) -> HarnessContext:
    """Open the rollout's route on the proxy and build what the harness adapter is given."""
    if proxy is None:
        raise StageFailed("route", "RuntimeError: no serving proxy: every harness reaches the policy through the proxy")
    try:
        limits = RolloutLimits(
            max_calls=options.max_calls,
            max_tokens=options.max_rollout_tokens,
            max_new_tokens=options.max_new_tokens,
            temperature=options.temperature,
        )
        route = proxy.open_rollout(rollout_id, policy, limits)
    except Exception as exc:  # noqa: BLE001
        raise StageFailed("route", exc) from exc
    origin = sandbox.proxy_base_url or ""
    if not origin and adapter.api_style != ApiStyle.IN_PROCESS:
        proxy.close_rollout(rollout_id)
        raise StageFailed("route", f"RuntimeError: sandbox backend {backend.name!r} gave no route to the proxy")
    return HarnessContext(
        sandbox=sandbox,
        task=task,
        base_url=route.base_url(origin) if origin else "",
        api_key=route.api_key,
        model_name=policy.name,
        timeout_s=timeout_s,
        policy=policy,
        rollout_id=rollout_id,
        extra={"options": options.harness_options, "proxy": proxy},
    )


async def harness_stage(
    adapter: HarnessAdapter, ctx: HarnessContext, proxy: RolloutProxy | None, options: EnvOptions, timeout_s: float
) -> tuple[HarnessResult, str | None]:
    """Run the harness; (its result, the budget cap that cut it short if scored anyway)."""
    try:
        # The adapter enforces the wall-time limit itself; this outer guard catches a hung adapter.
        result = await asyncio.wait_for(adapter.run(ctx), timeout=timeout_s + 30)
    except TimeoutError:
        raise StageFailed("timeout", f"harness adapter did not return within {timeout_s + 30:.0f} s") from None
    except Exception as exc:  # noqa: BLE001
        raise StageFailed("harness", f"{exc!r}\n{traceback.format_exc(limit=3)}") from exc
    truncated_by = (budget_cap_hit(proxy, ctx.rollout_id) or result.stopped_at_budget) if options.score_capped else None
    if result.timed_out:
        raise StageFailed("timeout", f"harness ran past its {timeout_s:.0f} s limit", result)
    if not result.success and truncated_by is None:
        raise StageFailed("harness", result.error or f"exit code {result.exit_code}", result)
    return result, truncated_by


async def close_sandbox_stage(sandbox: Any) -> RolloutFailure | None:
    """Destroy the sandbox whatever happened; a failure to do so is reported (the reaper removes the rest)."""
    if sandbox is None:
        return None
    try:
        await asyncio.shield(sandbox.destroy())
    except Exception as exc:  # noqa: BLE001
        return RolloutFailure(stage="sandbox", reason=f"destroy failed: {exc}")
    return None


def result_stage(
    task: TaskSpec,
    adapter: HarnessAdapter,
    rollout_id: str,
    calls: list[ModelCall],
    failure: RolloutFailure | None,
    verdict: VerifierResult | None,
    harness_result: HarnessResult | None,
    truncated_by: str | None,
    options: EnvOptions,
    timings: dict[str, float],
    t0: float,
) -> RolloutResult:
    """Rebuild the forest from the recorded calls (also for a failed rollout, for inspection)."""
    from clawgym_env.trajectory.reconstruct import build_forest

    t3 = time.perf_counter()
    reward = verdict.reward if verdict is not None and failure is None else 0.0
    try:
        forest = build_forest(
            calls,
            rollout_id=rollout_id,
            task_id=task.id,
            harness=adapter.name,
            reward=reward if failure is None else None,
            options=options.forest,
        )
    except Exception as exc:  # noqa: BLE001
        forest = TrajectoryForest.failed(rollout_id, f"reconstruction failed: {exc}", task_id=task.id)
        failure = failure or StageFailed("reconstruct", exc).failure
    timings["reconstruct_s"] = time.perf_counter() - t3
    timings["total_s"] = time.perf_counter() - t0
    if failure is not None:
        forest.status, forest.failure, forest.reward = "failed", f"{failure.stage}: {failure.reason}", None
        status = "failed"
    else:
        status = forest.status  # "empty" (no call) or "failed" (e.g. over-forking) come from reconstruction
        if status != "ok":
            failure = RolloutFailure(stage="reconstruct", reason=forest.failure or status)
    return RolloutResult(
        rollout_id=rollout_id,
        task_id=task.id,
        harness=adapter.name,
        status=status,
        failure=failure,
        reward=reward if status == "ok" else 0.0,
        verifier=verdict,
        harness_result=harness_result,
        forest=forest,
        calls=calls,
        timings=timings,
        truncated_by=truncated_by,
    )


def budget_cap_hit(proxy: RolloutProxy | None, rollout_id: str) -> str | None:
    """ "call_cap" or "token_cap" when the proxy refused a call of this rollout for its budget, else None.

    A harness reports that refusal as an API error and stops. By default that is a failure (a flooding
    harness is a fault); with `EnvOptions.score_capped` the rollout is truncated instead: the workspace is
    verified and the forest trained on, as RL treats an episode cut at its step limit.
    """
    if proxy is None:
        return None
    try:
        kinds = proxy.stats(rollout_id).error_kinds
    except KeyError:
        return None
    return next((k for k in ("call_cap", "token_cap") if kinds.get(k)), None)


async def verify_stage(
    task: TaskSpec,
    sandbox: Any,
    harness_result: HarnessResult | None,
    rollout_id: str,
    artifacts_dir: Path | None,
    options: EnvOptions,
) -> VerifierResult:
    """End every agent process (where the backend can), then download the final workspace (kept under
    artifacts_dir when asked) and run the task's verifier. Nothing the agent left running can change the
    workspace after this point, nor the verifier's files, nor answer the verifier's commands."""
    keep = artifacts_dir is not None and options.keep_workspace
    base = Path(artifacts_dir) / rollout_id if keep else Path(tempfile.mkdtemp(prefix="clawgym-verify-"))
    try:
        end_agent = getattr(sandbox, "end_agent_processes", None)
        if end_agent is not None:
            await end_agent()
        workspace_dir = await sandbox.download_workspace(base / "workspace")
        ctx = VerifyContext(sandbox=sandbox, task=task, harness_result=harness_result, workspace_dir=workspace_dir)
        return await task.verifier.verify(ctx)
    except Exception as exc:  # noqa: BLE001 - a crashed verifier is an error, not a zero
        return VerifierResult.failure(f"{type(exc).__name__}: {exc}")
    finally:
        if not keep:  # rm -rf in a thread: whatever the agent left (4,096 nested folders, 100,000 files)
            await asyncio.to_thread(remove_tree, base)


_verify = verify_stage  # the name older callers use
