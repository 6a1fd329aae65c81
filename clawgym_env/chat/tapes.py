"""`TapeIndex`: which records read their ids from which list, so all of them can move to a longer one.

An open rollout's remembered generations read their prompt ids as the start of a "tape": their own prompt at
first, and, once a later prompt of their agent begins with it, that later prompt (`GenerationMemory.rebase`,
called by `RolloutState.completed`). One list per agent then holds what every call of it was prompted with.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar


class OnTape(Protocol):
    tape: list[int]


T = TypeVar("T", bound=OnTape)


class TapeIndex(Generic[T]):
    """Records by the list they read (by identity: the index holds each list, so its `id` stays its own)."""

    def __init__(self) -> None:
        self._by_tape: dict[int, tuple[list[int], list[T]]] = {}

    def add(self, record: T) -> None:
        self._by_tape.setdefault(id(record.tape), (record.tape, []))[1].append(record)

    def move(self, old: list[int], new: list[int]) -> None:
        """Every record on `old` reads from `new` (which begins with all of `old`) instead; `old` can be freed."""
        moved = self._by_tape.pop(id(old), None)
        if moved is None:
            return
        for record in moved[1]:
            record.tape = new
        self._by_tape.setdefault(id(new), (new, []))[1].extend(moved[1])
