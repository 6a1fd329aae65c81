"""Black-box token-in, token-out: map echoed assistant turns back to the raw ids the engine generated.

Harnesses echo the model's earlier turns in every later request, but re-serialised: tool-call ids
rewritten, arguments re-serialised compactly, `cache_control` markers moved, context messages moved.
Re-tokenizing those turns would train on tokens the model never sampled. So for each rollout we remember
every generation (raw ids including the stop token, and its parsed structure) and, when a request echoes
an assistant turn, find the generation by *structure*: stripped text plus each tool call's name and
canonical arguments (sorted keys, compact JSON). Ids and formatting never take part in the match.

The same call can be made twice with different raw text (bare JSON once, `<tool_call>` tags the next
time): both generations then share a structure, and each echo must get the ids of the call it came from,
or the next prompt no longer extends the previous one. `GenerationMemory.find` picks, in this order, the
generation whose prompt is exactly the prompt this turn sits after (the append-only case), then the one
at the same position among the conversation's assistant turns, then the one sharing the longest prefix
with it (an edited history), then the one whose reasoning matches, then the latest.

Some harnesses rewrite an echoed call on purpose (`HARNESS_REWRITES`: Claude Code drops a leading
`cd <workspace> && ` from a Bash command). A generation is also remembered under the structure its
rewritten echo will have, so the echo is still spliced (a structural match, not drift) and counted as
rewritten.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from clawgym_env.chat.conversation import Message, ToolCall, canonical_arguments
from clawgym_env.chat.renderers.base import EchoContext, ParsedOutput, SplicedTurn
from clawgym_env.chat.tapes import TapeIndex
from clawgym_env.prefix import common_prefix_length

StructureKey = tuple[str, tuple[tuple[str, str], ...]]


def structure_key(text: str, tool_calls: list[ToolCall]) -> StructureKey:
    return (text.strip(), tuple((c.name, canonical_arguments(c.arguments)) for c in tool_calls))


# ------------------------------------------------------------------------------- harness rewrites
_LEADING_CD = re.compile(r"""^\s*cd\s+(?:"[^"]*"|'[^']*'|[^\s;&|'"]+)\s*&&\s*""")


def strip_leading_cd(call: ToolCall) -> ToolCall | None:
    """Claude Code's Bash echo: `cd <dir> && <rest>` comes back as `<rest>` (None: the rule does not apply)."""
    if call.name != "Bash" or not isinstance(call.arguments, dict):
        return None
    command = call.arguments.get("command")
    if not isinstance(command, str):
        return None
    match = _LEADING_CD.match(command)
    if match is None or not command[match.end() :].strip():
        return None
    return ToolCall(call.name, {**call.arguments, "command": command[match.end() :]}, call.id)


# name -> how a harness re-writes one generated tool call when it echoes it (None: left as generated)
HARNESS_REWRITES: dict[str, Callable[[ToolCall], ToolCall | None]] = {
    "claude_code_bash_cd_prefix": strip_leading_cd,
}


def rewritten_keys(text: str, tool_calls: list[ToolCall]) -> list[tuple[str, StructureKey]]:
    """(rule name, structure key of the echo) for each known rewrite that changes this generation."""
    keys = []
    for name, rule in HARNESS_REWRITES.items():
        changed = [rule(c) for c in tool_calls]
        if any(c is not None for c in changed):
            calls = [new or old for new, old in zip(changed, tool_calls, strict=True)]
            keys.append((name, structure_key(text, calls)))
    return keys


# ------------------------------------------------------------------------------------------ memory
@dataclass(slots=True)
class RecordedGeneration:
    call_index: int
    tape: list[int]  # begins with the generation's prompt: that prompt, or a later prompt of its agent (rebase)
    prompt_length: int
    token_ids: list[int]  # raw generated ids, including the stop token when the engine emitted one
    ended_with_stop: bool
    reasoning: str | None
    position: int | None = None  # assistant turns before this one in its call's conversation

    def prompt_ids(self) -> list[int]:
        return self.tape if len(self.tape) == self.prompt_length else self.tape[: self.prompt_length]


class GenerationMemory:
    """The generations of one rollout, looked up by the structure of an echoed assistant turn."""

    def __init__(self) -> None:
        self._by_key: dict[StructureKey, list[RecordedGeneration]] = {}
        self._by_rewrite: dict[StructureKey, list[tuple[RecordedGeneration, str]]] = {}
        self._on_tape: TapeIndex[RecordedGeneration] = TapeIndex()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_key.values())

    def remember(
        self,
        call_index: int,
        prompt_ids: list[int],
        token_ids: list[int],
        parsed: ParsedOutput,
        end_token_id: int,
        position: int | None = None,
    ) -> None:
        """Keep a generation; `position` is the number of assistant turns its prompt held."""
        if not token_ids:
            return  # an empty generation cannot be echoed meaningfully; it is rendered if it ever is
        record = RecordedGeneration(
            call_index=call_index,
            tape=prompt_ids,
            prompt_length=len(prompt_ids),
            token_ids=list(token_ids),
            ended_with_stop=token_ids[-1] == end_token_id,
            reasoning=parsed.reasoning,
            position=position,
        )
        key = structure_key(parsed.text, parsed.tool_calls)
        aliases = rewritten_keys(parsed.text, parsed.tool_calls)
        with self._lock:
            self._by_key.setdefault(key, []).append(record)
            for name, alias in aliases:
                self._by_rewrite.setdefault(alias, []).append((record, name))
            self._on_tape.add(record)

    def rebase(self, old: list[int], new: list[int]) -> None:
        """The generations prompted with a prefix of `old` read their prompts from `new` instead, which begins
        with all of `old` (the next prompt of their agent, which extends it): `old` can be freed. So a rollout
        keeps one list of ids per agent, not one per call (RolloutState.completed)."""
        with self._lock:
            self._on_tape.move(old, new)

    def tapes(self) -> set[int]:
        """The ids (`id()`) of the lists the remembered generations read their prompts from."""
        with self._lock:
            return {id(r.tape) for records in self._by_key.values() for r in records}

    def find(self, message: Message, context: EchoContext) -> SplicedTurn | None:
        """The generation an echoed assistant message came from, or None (a drift event)."""
        key = structure_key(message.content, message.tool_calls)
        rules: dict[int, str] = {}  # id(record) -> the rewrite its echo needed
        with self._lock:
            candidates = list(self._by_key.get(key, ()))
            if not candidates:
                for record, name in self._by_rewrite.get(key, ()):
                    candidates.append(record)
                    rules[id(record)] = name
        if not candidates:
            return None
        if len(candidates) == 1:
            chosen, exact = candidates[0], _prompted_here(candidates[0], context)
        else:
            chosen, exact = _closest(candidates, message, context)
        return SplicedTurn(
            token_ids=chosen.token_ids,
            source_call=chosen.call_index,
            ended_with_stop=chosen.ended_with_stop,
            rewrite=rules.get(id(chosen)),
            exact=exact,
        )


def _prompted_here(record: RecordedGeneration, context: EchoContext) -> bool:
    """The generation's prompt is exactly the prompt the echoed turn sits after."""
    return record.prompt_length == context.prompt_length and record.prompt_ids() == context.prompt_ids()


def _closest(
    candidates: list[RecordedGeneration], message: Message, context: EchoContext
) -> tuple[RecordedGeneration, bool]:
    """Among generations of one structure, the one this echo came from (see the module docstring), and
    whether its prompt is exactly the prompt the echo sits after."""
    length = context.prompt_length
    exact = [c for c in candidates if c.prompt_length == length and _prompted_here(c, context)]
    if exact:
        return exact[-1], True
    prompt = context.prompt_ids()
    reasoning = message.reasoning.strip() if message.reasoning else None

    def score(c: RecordedGeneration) -> tuple[bool, int, bool, int]:
        return (
            c.position == context.position,
            min(common_prefix_length(c.tape, prompt), c.prompt_length),
            reasoning is not None and c.reasoning == reasoning,
            c.call_index,
        )

    return max(candidates, key=score), False
