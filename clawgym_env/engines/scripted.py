"""ScriptedTestEngine: a named test double of `InferenceEngine` that replays scripted completions.

Proxy and harness tests need a model that emits *exactly* a given tool call in the model's native
format. This engine tokenizes each scripted completion text with the real tokenizer, appends the stop
token (`<|im_end|>` for Qwen), and returns it with logprob 0.0 per token, so everything downstream of
the engine (renderers, splicing, recording) runs for real. `stream()` hands the same ids out one token
at a time (after `token_delay_s` each), as a decoding engine would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from clawgym_env.interfaces import Generation, SamplingParams, TokenChunk

Script = Sequence[str] | Callable[[str], str]


class ScriptExhausted(RuntimeError):
    """More generate() calls than scripted completions."""


class ScriptedTestEngine:
    """Replays `completions` (a list of texts, or a function prompt-text -> completion text) in order.

    `prompts` records the prompt ids of every call (`prompt_texts` the decoded text), so tests can
    assert what the engine saw.
    """

    def __init__(
        self, tokenizer: Any, completions: Script, *, stop_token: str | None = None, token_delay_s: float = 0.0
    ) -> None:
        self.tokenizer = tokenizer
        self.token_delay_s = token_delay_s
        self._script = completions if callable(completions) else list(completions)
        self._next = 0
        stop = stop_token or tokenizer.eos_token
        if stop is None:
            raise ValueError("ScriptedTestEngine needs a stop token: the tokenizer has no eos_token, pass stop_token=")
        self.stop_token_id: int = tokenizer.convert_tokens_to_ids(stop)
        self.policy_version = 0
        self.prompts: list[list[int]] = []
        self.prompt_texts: list[str] = []
        self._lock = asyncio.Lock()

    @property
    def calls(self) -> int:
        return len(self.prompts)

    def _completion_for(self, prompt_text: str) -> str:
        if callable(self._script):
            return self._script(prompt_text)
        if self._next >= len(self._script):
            raise ScriptExhausted(
                f"ScriptedTestEngine was called {self._next + 1} times but has only {len(self._script)} "
                "scripted completions; add more completions to the script"
            )
        text = self._script[self._next]
        self._next += 1
        return text

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        async with self._lock:  # keeps the script order equal to the call order
            prompt_text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
            self.prompts.append(list(prompt_ids))
            self.prompt_texts.append(prompt_text)
            completion = self._completion_for(prompt_text)
        ids = list(self.tokenizer.encode(completion, add_special_tokens=False)) + [self.stop_token_id]
        finish = "stop"
        if len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        else:
            for i, tid in enumerate(ids):  # honour caller stop ids like a real engine would
                if tid in sampling.stop_token_ids:
                    ids = ids[: i + 1]
                    break
        return Generation(
            token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish, policy_version=self.policy_version
        )

    async def stream(
        self, prompt_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> AsyncIterator[TokenChunk]:
        generation = await self.generate(prompt_ids, sampling)
        ids, last = generation.token_ids, len(generation.token_ids) - 1
        for i, token in enumerate(ids):
            await asyncio.sleep(self.token_delay_s)
            finish = generation.finish_reason if i == last else None
            yield TokenChunk([token], [generation.logprobs[i]], finish, generation.policy_version)
        if not ids:
            yield TokenChunk([], [], generation.finish_reason, generation.policy_version)

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        self.policy_version = version
