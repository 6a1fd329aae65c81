"""Recording the white-box loop's in-process calls into the proxy's rollout, so `close_rollout` returns them.

The white-box loop calls the engine directly (no HTTP), but its calls must land in the same durable CallLog
and the same open rollout as a CLI harness's calls, so that `run_rollout` rebuilds them with the same
`build_forest`. `ctx.record` wins when the caller supplied one; otherwise the running proxy
(`ctx.extra["proxy"]`) records them with `ServingProxy.record_inprocess_call`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clawgym_env.interfaces import HarnessContext, RolloutLimits
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
