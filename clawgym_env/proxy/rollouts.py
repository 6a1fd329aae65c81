"""Per-rollout state kept by the proxy: route, policy, limits, generation memory, calls and stats."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from clawgym_env.interfaces import Policy, RolloutLimits, RolloutRoute
from clawgym_env.proxy.splice import GenerationMemory
from clawgym_env.records import ModelCall

ROLLOUT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RolloutStats(BaseModel):
    """What the env reads about a rollout's traffic; `errors` counts every call answered with an error."""

    rollout_id: str
    calls: int = 0  # generation requests received (including refused and failed ones)
    completed_calls: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = Field(default_factory=dict)
    disconnects: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    new_tokens: int = 0  # prompt tokens beyond the previous call's full ids + generated tokens (the token cap)
    drift_events: int = 0  # echoed assistant turns that matched no recorded generation
    spliced_turns: int = 0
    control_token_texts: int = 0  # control tokens written as text in user/tool/system text (kept as text)
    closed: bool = False

    def count_error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


@dataclass
class RolloutState:
    route: RolloutRoute
    policy: Policy
    limits: RolloutLimits
    stats: RolloutStats
    memory: GenerationMemory = field(default_factory=GenerationMemory)
    calls: list[ModelCall] = field(default_factory=list)
    next_index: int = 0
    last_full_ids: list[int] = field(default_factory=list)
    closed: bool = False

    def take_index(self) -> int:
        index = self.next_index
        self.next_index += 1
        self.stats.calls += 1
        return index


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two id lists (slice comparisons run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] holds, a[:hi] == b[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
