"""Rubrics: binary, weighted criteria, each checked by code or by an optional judge model.

A code criterion is a `FileCheck` or a function `(workspace_dir) -> bool | float` (passes at 1.0).
A judge criterion is a yes/no `question`; the `ModelJudge` renders it with the judge's own tokenizer
(chat template), generates greedily through the same `InferenceEngine` interface as the policy, and
reads "yes" or "no". Without a judge, judge criteria are an explicit verifier error, never a pass.
The evidence (files and a final message the policy wrote) and the question are encoded as plain text:
only the template's own markers are control tokens, so a report that spells `<|im_end|><|im_start|>...`
cannot add turns to the judge's prompt (`ModelJudge.control_token_texts` counts such texts).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawgym_env.interfaces import InferenceEngine, SamplingParams, VerifierResult, VerifyContext
from verifiers.base import BaseVerifier, VerifierConfigError, host_workspace
from verifiers.files import FileCheck
from verifiers.isolated import DEFAULT_MEMORY_MB, CheckLimitError, run_isolated

JUDGE_SYSTEM_PROMPT = (
    "You are a strict grader. You are shown the output of an assistant that worked on a task, and one "
    "yes/no criterion. Answer with exactly one word: yes if the criterion is clearly met, no otherwise."
)


@dataclass
class Criterion:
    """One binary criterion: exactly one of `check` (code) or `question` (judge)."""

    name: str
    weight: float = 1.0
    check: FileCheck | Callable[[Path], Any] | None = None
    question: str | None = None
    evidence: Sequence[str] | None = None  # workspace files shown to the judge (None: small text files)

    def __post_init__(self) -> None:
        if (self.check is None) == (self.question is None):
            raise VerifierConfigError(f"criterion {self.name!r} needs exactly one of `check` or `question`")
        if self.weight < 0:
            raise VerifierConfigError(f"criterion {self.name!r} has a negative weight")

    @property
    def needs_judge(self) -> bool:
        return self.question is not None


class JudgeAnswerError(RuntimeError):
    """The judge model answered neither yes nor no."""


class ModelJudge:
    """A yes/no judge over any `InferenceEngine` plus the (fast) tokenizer, with chat template, of its model.

    `control_token_texts`: how many added-token texts (`<|im_end|>`, `<think>`) the rendered evidence and
    questions spelled out; each was encoded as text.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        *,
        max_tokens: int = 8,
        max_evidence_chars: int = 8000,
        system_prompt: str = JUDGE_SYSTEM_PROMPT,
    ) -> None:
        if not hasattr(tokenizer, "apply_chat_template"):
            raise VerifierConfigError("the judge tokenizer needs apply_chat_template (a transformers tokenizer)")
        # imported here: `verifiers` stays light (the proxy package is not needed to check a workspace)
        from clawgym_env.chat.renderers.untrusted_text import UntrustedTextEncoder

        try:
            self._text = UntrustedTextEncoder.of(tokenizer)
        except TypeError as exc:
            raise VerifierConfigError(f"the judge tokenizer must be a fast tokenizer: {exc}") from exc
        self.control_token_texts = 0
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.max_evidence_chars = max_evidence_chars
        self.system_prompt = system_prompt

    def render(self, question: str, evidence: str) -> list[int]:
        """The prompt ids: the chat template's own turns, the messages' text (system prompt, evidence and
        question) encoded as plain text, whatever added-token text (`<|im_end|>`, `<think>`) it spells."""
        if len(evidence) > self.max_evidence_chars:
            evidence = evidence[: self.max_evidence_chars] + "\n[... truncated]"
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": f"## Evidence\n{evidence}\n\n## Criterion\n{question}\n\nAnswer yes or no."},
        ]
        try:
            ids, kept_as_text = self._text.encode_chat(self.tokenizer, messages, add_generation_prompt=True)
        except ValueError as exc:  # a template that changes message text (trims it, branches on it)
            raise VerifierConfigError(f"the judge's chat template cannot show evidence as text: {exc}") from exc
        self.control_token_texts += kept_as_text
        return ids

    async def ask(self, question: str, evidence: str) -> tuple[bool, str]:
        """(passed, raw answer text); raises JudgeAnswerError when the answer is not yes/no."""
        stop = getattr(self.tokenizer, "eos_token_id", None)
        sampling = SamplingParams(
            max_tokens=self.max_tokens, temperature=0.0, stop_token_ids=(stop,) if isinstance(stop, int) else ()
        )
        generation = await self.engine.generate(self.render(question, evidence), sampling)
        text = self.tokenizer.decode(generation.token_ids, skip_special_tokens=True).strip()
        return parse_yes_no(text), text


def parse_yes_no(text: str) -> bool:
    words = re.findall(r"[a-z]+", text.lower())
    if words and words[0] in ("yes", "true", "pass"):
        return True
    if words and words[0] in ("no", "false", "fail"):
        return False
    raise JudgeAnswerError(f"judge answered {text[:80]!r}, neither yes nor no")


def collect_evidence(workspace: Path, final_message: str, files: Sequence[str] | None, limit: int = 4000) -> str:
    """Final message plus the text of the named files (default: small text files of the workspace)."""
    parts = [f"### Final message of the assistant\n{final_message or '(none)'}"]
    if files is None:
        paths = [p for p in sorted(Path(workspace).rglob("*")) if p.is_file() and p.stat().st_size <= limit]
    else:
        paths = [Path(workspace) / f for f in files]
    for path in paths[:20]:
        rel = path.relative_to(workspace).as_posix() if path.is_relative_to(workspace) else str(path)
        if not path.is_file():
            parts.append(f"### {rel}\n(missing)")
            continue
        try:
            parts.append(f"### {rel}\n{path.read_text(encoding='utf-8')[:limit]}")
        except UnicodeDecodeError:
            parts.append(f"### {rel}\n(binary file, {path.stat().st_size} bytes)")
    return "\n\n".join(parts)


class RubricVerifier(BaseVerifier):
    """Weighted binary criteria; reward = passed weight / total weight."""

    def __init__(
        self,
        criteria: Sequence[Criterion],
        *,
        judge: ModelJudge | None = None,
        name: str = "rubric",
        timeout_s: float = 300.0,
        memory_mb: int = DEFAULT_MEMORY_MB,
    ) -> None:
        if not criteria:
            raise VerifierConfigError("RubricVerifier needs at least one criterion")
        names = [c.name for c in criteria]
        if len(set(names)) != len(names):
            raise VerifierConfigError(f"criterion names must be unique: {names}")
        if sum(c.weight for c in criteria) <= 0:
            raise VerifierConfigError("the criteria weights sum to 0")
        self.criteria = list(criteria)
        self.judge = judge
        self.name = name
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb  # of each child process running code criteria and collecting evidence

    @staticmethod
    def _run_code(criterion: Criterion, workspace: Path) -> tuple[bool, str]:
        check = criterion.check
        if isinstance(check, FileCheck):
            outcome = check.run(workspace)
            return outcome.passed, outcome.detail
        value = check(workspace)  # type: ignore[misc]
        if isinstance(value, tuple):
            value, detail = value
        else:
            detail = ""
        if isinstance(value, bool) or isinstance(value, (int, float)) and 0 <= value <= 1:
            return float(value) >= 1.0 - 1e-9, detail or str(value)
        raise VerifierConfigError(f"criterion {criterion.name!r} check returned {value!r}; expected bool or [0, 1]")

    async def _verify(self, ctx: VerifyContext) -> VerifierResult:
        results: dict[str, float] = {}
        lines: list[str] = []
        needs_judge = [c.name for c in self.criteria if c.needs_judge]
        message = ctx.harness_result.final_message if ctx.harness_result else ""
        async with host_workspace(ctx) as workspace:
            for c in self.criteria:
                if c.needs_judge:
                    if self.judge is None:
                        continue
                    try:  # in a child process with a memory and a time limit (verifiers/isolated.py)
                        evidence = await run_isolated(
                            collect_evidence,
                            workspace,
                            message,
                            c.evidence,
                            timeout_s=self.timeout_s,
                            memory_mb=self.memory_mb,
                        )
                    except CheckLimitError as exc:
                        return VerifierResult.failure(f"{self.name}: evidence for {c.name!r} {exc}")
                    try:
                        passed, raw = await self.judge.ask(c.question or "", evidence)
                    except JudgeAnswerError as exc:
                        return VerifierResult(
                            reward=0.0,
                            subscores=results,
                            error=f"criterion {c.name!r}: {exc}",
                            explanation="\n".join(lines + [f"ERROR {c.name}: {exc}"]),
                        )
                    detail = f"judge said {raw!r}"
                else:
                    try:
                        passed, detail = await run_isolated(
                            self._run_code,
                            c,
                            workspace,
                            timeout_s=self.timeout_s,
                            memory_mb=self.memory_mb,
                        )
                    except CheckLimitError as exc:
                        return VerifierResult.failure(f"{self.name}: criterion {c.name!r} {exc}")
                results[c.name] = 1.0 if passed else 0.0
                lines.append(f"{'PASS' if passed else 'FAIL'} {c.name} (w={c.weight:g}): {detail}")
        if needs_judge and self.judge is None:
            error = (
                f"criteria {needs_judge} need a judge model, and none is configured: pass "
                "judge=ModelJudge(engine, tokenizer) to RubricVerifier (or drop those criteria)"
            )
            return VerifierResult(reward=0.0, subscores=results, error=error, explanation="\n".join(lines + [error]))
        total = sum(c.weight for c in self.criteria)
        reward = sum(c.weight * results[c.name] for c in self.criteria) / total
        return VerifierResult(reward=min(1.0, reward), subscores=results, explanation="\n".join(lines))
