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
mutates a recorded request. A list usually goes on where the previous request's ended (the conversation
so far, then the new turns): its text then begins with the previous list's text up to its closing
bracket, so one hash of that much of the new text shares the whole previous list at once, and only a
list changed before its end is compared element by element.

What is shared was checked when it first came (the JSON depth guard), so `fresh` lists what a request
adds, for the proxy to check only that: a long conversation is not walked again at every call.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson


class _Text(NamedTuple):
    """What the memory keeps of a part's JSON text."""

    whole: int  # hash of the text
    open: int | None  # a list: hash of its text without the closing bracket
    length: int  # bytes


class RequestMemory:
    """One rollout's latest request and what each of its parts' JSON text was."""

    __slots__ = ("body", "texts", "fresh")

    def __init__(self) -> None:
        self.body: dict[str, Any] | None = None
        self.texts: dict[str, _Text] = {}
        self.fresh: list[tuple[Any, int]] = []  # the latest body's parts not shared, with their nesting level

    def share(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body`, with each part that is the same JSON as in the previous request replaced by that part's
        object (in place); it becomes the previous request for the next call. Sets `fresh`: the parts that
        are not shared, each with its level (the body is level 1, its values 2, their list elements 3)."""
        try:
            raw = {key: orjson.dumps(value) for key, value in body.items()}
        except orjson.JSONEncodeError:  # nested past orjson's writer's limit: kept as it is (the record omits it)
            self.forget()
            self.fresh = [(body, 1)]
            return body
        old_body = self.body if self.body is not None else {}
        texts: dict[str, _Text] = {}
        fresh: list[tuple[Any, int]] = []
        for key, text in raw.items():
            value, old = body[key], old_body.get(key)
            is_list = isinstance(value, list)
            texts[key] = known = _Text(hash(text), hash(text[:-1]) if is_list else None, len(text))
            old_text = self.texts.get(key)
            if old_text is not None and known.whole == old_text.whole and value == old:
                body[key] = old  # the whole value repeats: its list, dict or string is the earlier one
            elif is_list and isinstance(old, list):
                same = _shared_prefix(value, text, old, old_text)
                value[:same] = old[:same]
                fresh += [(part, 3) for part in value[same:]]
            else:
                fresh.append((value, 2))
        self.body, self.texts, self.fresh = body, texts, fresh
        return body

    def forget(self) -> None:
        """Share nothing with the latest body (it was refused): the next request is checked whole."""
        self.body, self.texts = None, {}


def _shared_prefix(value: list[Any], text: bytes, old: list[Any], old_text: _Text | None) -> int:
    """How many of `value`'s first elements are the same JSON as `old`'s, position by position."""
    end = old_text.length - 1 if old_text is not None else 0  # the old list's text without its "]"
    if (
        old_text is not None
        and old
        and text[end : end + 1] == b","
        and hash(text[:end]) == old_text.open
        and value[: len(old)] == old
    ):
        return len(old)  # the list goes on after the old one (an append-only conversation): one comparison
    same = 0
    for new_part, old_part in zip(value, old):
        if new_part != old_part or orjson.dumps(new_part) != orjson.dumps(old_part):
            break  # past the first change the rest are new (an edited history's tail)
        same += 1
    return same
