"""Per-rollout state kept by the proxy: route, policy, limits, generation memory, calls and stats."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from clawgym_env.chat.renderers.base import RenderedPrompt
from clawgym_env.chat.splice import GenerationMemory
from clawgym_env.interfaces import Policy, RolloutLimits, RolloutRoute
from clawgym_env.prefix import check_prefix, common_prefix_length, extends, same_root
from clawgym_env.proxy.apis.base import ValidatedItems
from clawgym_env.proxy.request_sharing import RequestMemory
from clawgym_env.records import LineSpan, ModelCall, PrefixCheck

__all__ = ["ROLLOUT_ID_RE", "RolloutState", "RolloutStats", "common_prefix_length"]

ROLLOUT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
RESUMES_KEPT = 4  # agents of one rollout (main agent, subagents, side calls) whose renders resume where they left off


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
    new_roots: int = 0  # first calls of another system prompt / tool set (a subagent or side call): not breaks
    control_token_texts: int = 0  # control tokens written as text in user/tool/system text (kept as text)
    stream_mismatches: int = 0  # live streams whose early pieces the final parse did not confirm (see streaming.py)
    stream_keepalives: int = 0  # keep-alive events sent while a live stream had nothing else to send
    resumed_renders: int = 0  # calls rendered from where an earlier call of the same agent left off (not re-walked)
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
    lines: list[LineSpan] = field(default_factory=list)  # where each recorded call is in the log, in order
    receipts: dict[int, bool | None] = field(default_factory=dict)  # call index -> delivered (None: awaited)
    requests: RequestMemory = field(default_factory=RequestMemory)  # the next request shares what it repeats
    validated: ValidatedItems = field(default_factory=ValidatedItems)  # ...and validates only what it adds
    next_index: int = 0
    last_full_ids: list[int] = field(default_factory=list)
    render_resumes: list[Any] = field(default_factory=list)  # where recent renders left off, latest first
    agents: dict[int, ModelCall] = field(default_factory=dict)  # latest completed call of each root (agent)
    last_agent: int | None = None  # the agent of the latest completed call
    _agent_of: dict[int, int] = field(default_factory=dict)  # call index -> its agent, decided when checked
    _agents_seen: int = 0  # agents numbered in order of their first checked call
    closed: bool = False

    def check_prefix(self, call: ModelCall) -> PrefixCheck:
        """Compare a call's prompt with the latest completed call of its agent, and count the outcome.

        Cheap in the common case: one comparison with the latest call's ids. Only a prompt that does not
        extend it is matched against the other agents' roots and explained.
        """
        prompt, segments = call.prompt_ids, call.segments
        agent = self.last_agent
        previous = self.agents.get(agent) if agent is not None else None
        if previous is None or not extends(prompt, previous):
            agent = next((a for a, c in reversed(self.agents.items()) if same_root(prompt, segments, c)), None)
            previous = self.agents.get(agent) if agent is not None else None
            if agent is None:
                agent, self._agents_seen = self._agents_seen, self._agents_seen + 1
        self._agent_of[call.call_index] = agent
        check = check_prefix(previous, prompt, segments, first_of_rollout=not self.agents)
        if check.extended:
            self.stats.prefix_extended += 1
        elif check.reason == "new_root":
            self.stats.new_roots += 1
        elif check.reason is not None:
            self.stats.prefix_breaks[check.reason] = self.stats.prefix_breaks.get(check.reason, 0) + 1
        return check

    def completed(self, call: ModelCall) -> None:
        """A call that generated: later prompts of its agent are compared with its full ids. When its prompt
        extends the agent's previous call, the generations remembered on that call's prompt read it from this
        one (`GenerationMemory.rebase`): an open rollout keeps one list of ids per agent, not one per call (its
        calls are in the log, read back whole by `read_lines`)."""
        agent = self._agent_of.pop(call.call_index, None)
        if agent is None or agent not in self.agents:  # a new root, unless a concurrent call just opened it
            known = next((a for a, c in self.agents.items() if same_root(call.prompt_ids, call.segments, c)), None)
            if known is not None:
                agent = known
            elif agent is None:
                agent, self._agents_seen = self._agents_seen, self._agents_seen + 1
        previous = self.agents.get(agent)
        self.agents[agent] = call
        self.last_agent = agent
        check = call.prefix
        if previous is not None and check is not None and check.extended and check.previous_call == previous.call_index:
            self.memory.rebase(previous.prompt_ids, call.prompt_ids)

    def keep_resume(self, rendered: RenderedPrompt) -> None:
        """Keep where this render left off for the rollout's next calls (one per agent, the latest few agents):
        the render it started from is superseded by it."""
        if rendered.resume is None:
            return
        kept = [r for r in self.render_resumes if r is not rendered.resumed]
        self.render_resumes = [rendered.resume, *kept[: RESUMES_KEPT - 1]]

    def take_index(self) -> int:
        index = self.next_index
        self.next_index += 1
        self.stats.calls += 1
        return index
