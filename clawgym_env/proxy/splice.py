"""Black-box token-in, token-out: map echoed assistant turns back to the raw ids the engine generated.

Harnesses echo the model's earlier turns in every later request, but re-serialised: tool-call ids
rewritten, arguments re-serialised compactly, `cache_control` markers moved, context messages moved.
Re-tokenizing those turns would train on tokens the model never sampled. So for each rollout we remember
every generation (raw ids including the stop token, and its parsed structure) and, when a request echoes
an assistant turn, find the generation by *structure*: stripped text plus each tool call's name and
canonical arguments (sorted keys, compact JSON). Ids and formatting never take part in the match.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from clawgym_env.proxy.conversation import Message, ToolCall, canonical_arguments
from clawgym_env.proxy.renderers.base import ParsedOutput, SplicedTurn

StructureKey = tuple[str, tuple[tuple[str, str], ...]]


def structure_key(text: str, tool_calls: list[ToolCall]) -> StructureKey:
    return (text.strip(), tuple((c.name, canonical_arguments(c.arguments)) for c in tool_calls))


@dataclass(slots=True)
class RecordedGeneration:
    call_index: int
    prompt_ids: list[int]
    token_ids: list[int]  # raw generated ids, including the stop token when the engine emitted one
    ended_with_stop: bool
    reasoning: str | None


class GenerationMemory:
    """The generations of one rollout, looked up by the structure of an echoed assistant turn."""

    def __init__(self) -> None:
        self._by_key: dict[StructureKey, list[RecordedGeneration]] = {}
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
    ) -> None:
        if not token_ids:
            return  # an empty generation cannot be echoed meaningfully; it is rendered if it ever is
        record = RecordedGeneration(
            call_index=call_index,
            prompt_ids=prompt_ids,
            token_ids=list(token_ids),
            ended_with_stop=token_ids[-1] == end_token_id,
            reasoning=parsed.reasoning,
        )
        key = structure_key(parsed.text, parsed.tool_calls)
        with self._lock:
            self._by_key.setdefault(key, []).append(record)

    def find(self, message: Message, prompt_so_far: list[int]) -> SplicedTurn | None:
        """The generation an echoed assistant message came from, or None (a drift event).

        When several generations share a structure (a retried call, a repeated `ls`), prefer the one
        whose prompt is exactly the prompt rendered so far (the append-only case), then one whose
        reasoning matches the echo, then the latest.
        """
        key = structure_key(message.content, message.tool_calls)
        with self._lock:
            candidates = list(self._by_key.get(key, ()))
        if not candidates:
            return None
        chosen = candidates[-1]
        if len(candidates) > 1:
            exact = [c for c in candidates if len(c.prompt_ids) == len(prompt_so_far) and c.prompt_ids == prompt_so_far]
            same_reasoning = [c for c in candidates if message.reasoning and c.reasoning == message.reasoning.strip()]
            chosen = (exact or same_reasoning or candidates)[-1]
        return SplicedTurn(token_ids=chosen.token_ids, source_call=chosen.call_index, ended_with_stop=chosen.ended_with_stop)
