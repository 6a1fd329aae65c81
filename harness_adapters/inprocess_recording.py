"""Recording the white-box loop's in-process calls into the proxy's rollout, so `close_rollout` returns them.

The white-box loop calls the engine directly (no HTTP), but its calls must land in the same durable CallLog
and the same open rollout as a CLI harness's calls, so that `run_rollout` rebuilds them with the same
`build_forest`. Preference order:
  1. `ctx.record` when the caller supplied one;
  2. the proxy's own method for it, if it has one (`record_inprocess_call(rollout_id, call)`);
  3. otherwise the proxy's per-rollout state (ServingProxy keeps it in `_rollouts` and records with
     `_record(state, call)`, both private today): the call gets the rollout's next call index, is appended to
     the rollout's calls and to the durable log (through the proxy's own `_record`), and counts in its stats.
     This reaches into the proxy's internals; a public `record_inprocess_call` on the proxy would replace it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clawgym_env.interfaces import HarnessContext, RolloutLimits
from clawgym_env.records import ModelCall

PROXY_METHODS = ("record_inprocess_call", "record_call")


def _proxy(ctx: HarnessContext) -> Any:
    return (ctx.extra or {}).get("proxy")


def _rollout_state(proxy: Any, rollout_id: str) -> Any:
    for attr in ("rollouts", "_rollouts"):
        table = getattr(proxy, attr, None)
        if isinstance(table, dict) and rollout_id in table:
            return table[rollout_id]
    getter = getattr(proxy, "rollout", None) or getattr(proxy, "get_rollout", None)
    if callable(getter):
        try:
            return getter(rollout_id)
        except Exception:  # noqa: BLE001 - an unknown rollout: fall through
            return None
    return None


def rollout_limits(ctx: HarnessContext) -> RolloutLimits | None:
    """The limits the proxy holds for this rollout (max calls, new tokens, temperature), when it says."""
    proxy = _proxy(ctx)
    state = _rollout_state(proxy, ctx.rollout_id) if proxy is not None else None
    limits = getattr(state, "limits", None)
    return limits if isinstance(limits, RolloutLimits) else None


def recorder_for(ctx: HarnessContext) -> Callable[[ModelCall], None] | None:
    """A function that records one in-process ModelCall for `ctx`'s rollout, or None when nothing can."""
    if ctx.record is not None:
        return ctx.record
    proxy = _proxy(ctx)
    if proxy is None:
        return None
    for name in PROXY_METHODS:
        method = getattr(proxy, name, None)
        if callable(method):
            return lambda call, _m=method: _m(ctx.rollout_id, call)
    state = _rollout_state(proxy, ctx.rollout_id)
    if state is None:
        raise RuntimeError(
            f"the proxy has no open rollout {ctx.rollout_id!r} to record the white-box calls into; "
            "open it with proxy.open_rollout(...) first"
        )
    proxy_record = getattr(proxy, "_record", None)

    def record(call: ModelCall) -> None:
        index = state.take_index()
        call = call.model_copy(update={"call_index": index, "rollout_id": ctx.rollout_id})
        stats = state.stats
        stats.completed_calls += 1
        stats.prompt_tokens += len(call.prompt_ids)
        stats.generated_tokens += len(call.generated_ids)
        if callable(proxy_record):
            proxy_record(state, call)  # durable log + the rollout's calls, exactly as for an HTTP call
        else:
            state.calls.append(call)

    return record
