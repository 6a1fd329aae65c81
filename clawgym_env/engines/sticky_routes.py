"""Which server holds the context a prompt continues, for any number of rollouts in flight.

`VLLMServerPool` sends a rollout's next turn to the server that served its previous one, whose prefix cache
holds the context: the server of the longest recorded sequence (an earlier call's prompt + completion) that
the new prompt extends. It kept the latest 256 sequences per server and compared each with the prompt: at
1,000 rollouts on 2 servers every rollout's sequence was pushed out before its next turn came, and no next
turn found its server (`benchmarks/pool_routing.py`), while a bigger list costs every call more.

Here a sequence is recorded as the hash chain of its full blocks of `block` ids (each link hashes the
previous link and the block) and the ids after them (its tail). A prompt's chain, computed once per call,
names at each of its block boundaries the sequences whose full blocks it shares; the longest of those whose
tail it also holds wins. A call costs `len(prompt) / block` hashes whatever the number recorded, and a
recorded sequence holds a hash and fewer than `block` ids, so the table can keep every rollout in flight.
A turn's sequence replaces the one it extends (one entry per rollout); the least recently used go first.
A hash collision can only send a turn to another server, which costs a prefill, not a wrong answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

S = TypeVar("S")  # what a sequence was served by (the pool's server slot)


@dataclass(eq=False)
class Recorded(Generic[S]):
    server: S
    head: int  # the hash chain of the sequence's full blocks
    tail: tuple[int, ...]  # the ids after them
    length: int


@dataclass
class Match(Generic[S]):
    """A prompt's lookup: the recorded sequence it extends (or None) and the prompt's chain (kept to record
    the call's own sequence, prompt + completion, without hashing the prompt again)."""

    found: Recorded[S] | None
    chain: list[int] = field(default_factory=list)


class StickyRoutes(Generic[S]):
    def __init__(self, capacity: int = 8192, block: int = 64) -> None:
        if capacity < 1 or block < 1:
            raise ValueError(f"capacity and block must be >= 1, got {capacity} and {block}")
        self.capacity, self.block = capacity, block
        self._lru: OrderedDict[int, Recorded[S]] = OrderedDict()  # by id(), oldest first
        self._by_head: dict[int, dict[int, Recorded[S]]] = {}

    def __len__(self) -> int:
        return len(self._lru)

    def _extend_chain(self, chain: list[int], ids: Sequence[int]) -> list[int]:
        """`chain` (hashes after 0, 1, ... full blocks of `ids`) extended to every full block of `ids`."""
        b, h = self.block, chain[-1]
        for q in range(len(chain) - 1, len(ids) // b):
            h = hash((h, tuple(ids[q * b : (q + 1) * b])))
            chain.append(h)
        return chain

    def find(self, prompt: Sequence[int]) -> Match[S]:
        """The longest recorded sequence `prompt` extends (equal to it, or longer)."""
        chain = self._extend_chain([0], prompt)
        n = len(prompt)
        for q in range(len(chain) - 1, -1, -1):
            bucket = self._by_head.get(chain[q])
            if not bucket:
                continue
            start, best = q * self.block, None
            for seq in bucket.values():
                r = len(seq.tail)
                if (
                    start + r <= n
                    and (best is None or r > len(best.tail))
                    and tuple(prompt[start : start + r]) == seq.tail
                ):
                    best = seq
            if best is not None:
                self._lru.move_to_end(id(best))
                return Match(best, chain)
        return Match(None, chain)

    def record(self, sequence: Sequence[int], server: S, match: Match[S] | None = None) -> None:
        """Remember that `server` holds `sequence` (a call's prompt + completion). `match`: the call's lookup,
        whose chain covers the prompt's blocks and whose found sequence this one replaces."""
        chain = self._extend_chain(list(match.chain) if match and match.chain else [0], sequence)
        if match is not None and match.found is not None:
            self._forget(match.found)
        blocks = len(sequence) // self.block
        seq = Recorded(server, chain[blocks], tuple(sequence[blocks * self.block :]), len(sequence))
        self._lru[id(seq)] = seq
        self._by_head.setdefault(seq.head, {})[id(seq)] = seq
        while len(self._lru) > self.capacity:
            self._forget(next(iter(self._lru.values())))

    def forget_server(self, server: S) -> None:
        """Drop what `server` held (it was lost, or its prefix cache was reset)."""
        for seq in [s for s in self._lru.values() if s.server is server]:
            self._forget(seq)

    def _forget(self, seq: Recorded[S]) -> None:
        if self._lru.pop(id(seq), None) is None:
            return  # already gone (two calls extended it, or it was evicted)
        bucket = self._by_head[seq.head]
        del bucket[id(seq)]
        if not bucket:
            del self._by_head[seq.head]
