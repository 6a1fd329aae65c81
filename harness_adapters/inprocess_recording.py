"""Recording the white-box loop's in-process calls into the proxy's rollout, so `close_rollout` returns them.

The white-box loop calls the engine directly (no HTTP), but its calls go through the proxy's call pipeline
(`clawgym_env.proxy.pipeline`) like a CLI harness's: admitted under the same token budget
(`ServingProxy.admit_in_process`), recorded in the same durable CallLog and open rollout with the same counters
(`ServingProxy.record_inprocess_call`), and rebuilt by `run_rollout` with the same `build_forest`. `ctx.record`
wins when the caller supplied one (then nothing is admitted); otherwise the running proxy (`ctx.extra["proxy"]`)
does both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clawgym_env.interfaces import HarnessContext, InProcessAdmission, RolloutLimits
from clawgym_env.records import ModelCall


def _proxy(ctx: HarnessContext) -> Any:
    return (ctx.extra or {}).get("proxy")


def rollout_limits(ctx: HarnessContext) -> RolloutLimits | None:
    """The limits the proxy holds for this rollout (max calls, new tokens, temperature), when it has one."""
    proxy = _proxy(ctx)
    return proxy.limits(ctx.rollout_id) if proxy is not None else None


def recorder_for(ctx: HarnessContext) -> Callable[[ModelCall], None] | None:
    """A function that records one in-process ModelCall for `ctx`'s rollout, or None when nothing can."""
    if ctx.record is not None:
        return ctx.record
    proxy = _proxy(ctx)
    if proxy is None:
        return None
    proxy.limits(ctx.rollout_id)  # fails now, with a clear message, if the rollout is not open
    return lambda call: proxy.record_inprocess_call(ctx.rollout_id, call)


def admitter_for(ctx: HarnessContext) -> Callable[[list[int]], InProcessAdmission] | None:
    """A function that asks the proxy for the token budget of the next call from a prompt, or None (no proxy,
    or the caller records the calls itself)."""
    proxy = _proxy(ctx)
    if ctx.record is not None or proxy is None:
        return None
    return lambda prompt_ids: proxy.admit_in_process(ctx.rollout_id, prompt_ids)
