"""Per-rollout state kept by the proxy: route, policy, limits, generation memory, calls and stats."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from clawgym_env.interfaces import Policy, RolloutLimits, RolloutRoute
from clawgym_env.prefix import RootKey, check_prefix, common_prefix_length, root_key
from clawgym_env.proxy.splice import GenerationMemory
from clawgym_env.records import ModelCall, PrefixCheck, PromptSegment

__all__ = ["ROLLOUT_ID_RE", "RolloutState", "RolloutStats", "common_prefix_length"]

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
    rewritten_turns: int = 0  # spliced after undoing a known harness rewrite (not drift)
    prefix_extended: int = 0  # calls whose prompt began with the previous call's full ids (same agent)
    prefix_breaks: dict[str, int] = Field(default_factory=dict)  # calls that did not, by reason (clawgym_env.prefix)
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
    last_by_root: dict[RootKey, ModelCall] = field(default_factory=dict)  # latest completed call per agent
    closed: bool = False

    def check_prefix(self, prompt_ids: list[int], segments: list[PromptSegment]) -> PrefixCheck:
        """Compare a prompt with the latest completed call of its agent, and count the outcome."""
        previous = self.last_by_root.get(root_key(prompt_ids, segments))
        check = check_prefix(previous, prompt_ids, segments, first_of_rollout=not self.last_by_root)
        if check.extended:
            self.stats.prefix_extended += 1
        elif check.reason is not None:
            self.stats.prefix_breaks[check.reason] = self.stats.prefix_breaks.get(check.reason, 0) + 1
        return check

    def completed(self, call: ModelCall) -> None:
        """A call that generated: later prompts of its agent are compared with its full ids."""
        self.last_by_root[root_key(call.prompt_ids, call.segments)] = call

    def take_index(self) -> int:
        index = self.next_index
        self.next_index += 1
        self.stats.calls += 1
        return index
