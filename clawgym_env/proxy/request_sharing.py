"""A rollout's requests share the parts they repeat, so an open rollout holds its conversation once.

A harness resends the whole conversation with every call (and the same tools, system prompt and options),
and the proxy keeps each call's parsed request until the rollout closes (`ModelCall.request`: the log line
and what `close_rollout` returns). Kept as parsed, a rollout of n calls holds ~n²/2 message objects: with
32 calls per rollout that was ~2 MB per open rollout here, and every one of those objects is walked by the
garbage collector. `share_repeats` makes each part of a new request that equals the rollout's previous
request *be* that earlier object (a whole value, or a list element at the same position: the messages so
far, the tools), so memory grows with what is new in each call. Equal values are interchangeable: nothing
mutates a recorded request, and its JSON is unchanged.
"""

from __future__ import annotations

from typing import Any


def share_repeats(body: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """`body` with every top-level value, or list element at the same index, that equals `previous`'s
    replaced by `previous`'s object (in place; returns `body`)."""
    if not previous:
        return body
    for key, value in body.items():
        old = previous.get(key)
        if old is None or type(old) is not type(value):
            continue
        if isinstance(value, list):
            for i in range(min(len(value), len(old))):
                if value[i] == old[i]:
                    value[i] = old[i]
                else:
                    break  # past the first change the rest are new (an append-only conversation's tail)
            else:
                if len(value) == len(old):
                    body[key] = old
        elif value == old:
            body[key] = old
    return body
