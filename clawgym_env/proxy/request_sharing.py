"""A rollout's requests share the parts they repeat, so an open rollout holds its conversation once.

A harness resends the whole conversation with every call (and the same tools, system prompt and options),
and the proxy keeps each call's parsed request until the rollout closes (`ModelCall.request`: the log line
and what `close_rollout` returns). Kept as parsed, a rollout of n calls holds ~n²/2 message objects: with
32 calls per rollout that was ~2 MB per open rollout here, and every one of those objects is walked by the
garbage collector. `RequestMemory.share` makes each part of a new request that is the same JSON as in the
rollout's previous request *be* that earlier object (a whole top-level value, or a list element at the same
position: the messages so far, the tools), so memory grows with what is new in each call.

"The same" is the same JSON text (orjson's bytes of the part, ~1 µs per kB; the memory keeps their 64-bit
hashes, and a shared part must also be `==`), not Python's `==` alone, which takes 1 for 1.0 and for true:
a shared part is exactly what was sent, so the record and the rendered prompt are unchanged. Nothing
mutates a recorded request.

What is shared was checked when it first came (the JSON depth guard), so `fresh` lists what a request
adds, for the proxy to check only that: a long conversation is not walked again at every call.
"""

from __future__ import annotations

from typing import Any

import orjson

Texts = dict[str, int | list[int]]  # hashes of the parts' JSON texts


class RequestMemory:
    """One rollout's latest request and the hash of each of its parts' JSON text."""

    __slots__ = ("body", "texts", "fresh")

    def __init__(self) -> None:
        self.body: dict[str, Any] | None = None
        self.texts: Texts = {}
        self.fresh: list[tuple[Any, int]] = []  # the latest body's parts not shared, with their nesting level

    def share(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body`, with each part that is the same JSON as in the previous request replaced by that part's
        object (in place); it becomes the previous request for the next call. Sets `fresh`: the parts that
        are not shared, each with its level (the body is level 1, its values 2, their list elements 3)."""
        try:
            texts: Texts = {key: _texts_of(value) for key, value in body.items()}
        except orjson.JSONEncodeError:  # nested past orjson's writer's limit: kept as it is (the record omits it)
            self.forget()
            self.fresh = [(body, 1)]
            return body
        old_body, old_texts = self.body, self.texts
        fresh: list[tuple[Any, int]] = []
        for key, text in texts.items():
            old, old_text = (old_body.get(key), old_texts.get(key)) if old_body is not None else (None, None)
            if old_text is not None and text == old_text and body[key] == old:
                body[key] = old  # the whole value repeats: its list, dict or string is the earlier one
            elif isinstance(text, list) and isinstance(old_text, list):
                same = 0
                for new_part, old_part, new_value, old_value in zip(text, old_text, body[key], old):
                    if new_part != old_part or new_value != old_value:
                        break  # past the first change the rest are new (an append-only conversation's tail)
                    same += 1
                body[key][:same] = old[:same]
                fresh += [(part, 3) for part in body[key][same:]]
            else:
                fresh.append((body[key], 2))
        self.body, self.texts, self.fresh = body, texts, fresh
        return body

    def forget(self) -> None:
        """Share nothing with the latest body (it was refused): the next request is checked whole."""
        self.body, self.texts = None, {}


def _texts_of(value: Any) -> int | list[int]:
    """A list: its elements' JSON text hashes (shared one by one); anything else: its JSON text's hash."""
    if isinstance(value, list):
        return [hash(orjson.dumps(part)) for part in value]
    return hash(orjson.dumps(value))
