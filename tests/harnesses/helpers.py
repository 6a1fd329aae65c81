"""Shared pieces of the harness tests: a task with a file to write, scripted completions, one rollout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clawgym_env.chat import ChatMLRenderer
from clawgym_env.engines import ScriptedTestEngine, load_qwen_tokenizer
from clawgym_env.interfaces import Policy
from clawgym_env.proxy.rollout_state import RolloutStats
from clawgym_env.rollout import RolloutResult, run_rollout
from clawgym_env.serving_stack import serving_stack
from clawgym_env.specs import DEFAULT_MOUNT_PATH, EnvOptions, TaskSpec
from harness_adapters.tool_calls import tool_call, write_file_call
from tests.log_check import assert_log_holds

__all__ = [
    "ANSWER",
    "ANSWER_FILE",
    "one_rollout",
    "renderer",
    "scripted_policy",
    "tokenizer",
    "tool_call",
    "write_call",
    "write_task",
]

ANSWER_FILE = "answer.txt"
ANSWER = "42"

_TOKENIZER: Any = None
_RENDERER: Any = None


def tokenizer() -> Any:
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = load_qwen_tokenizer()
    return _TOKENIZER


def renderer() -> ChatMLRenderer:
    global _RENDERER
    if _RENDERER is None:
        _RENDERER = ChatMLRenderer(tokenizer())
    return _RENDERER


def answer_check(workspace: Path) -> float:
    """1.0 when answer.txt holds exactly the answer."""
    path = workspace / ANSWER_FILE
    return 1.0 if path.is_file() and path.read_text().strip() == ANSWER else 0.0


def write_task(task_id: str = "write-answer") -> TaskSpec:
    return TaskSpec(
        id=task_id,
        instruction=f"Read notes.md and write the answer (just the number) into {ANSWER_FILE}.",
        workspace={"notes.md": f"The answer is {ANSWER}.\n"},
        verifier=answer_check,
        timeout_s=300,  # an upper bound: OpenClaw alone starts for 10-25 s, more on a loaded machine
    )


def write_call(harness: str, content: str, workspace: str = DEFAULT_MOUNT_PATH) -> str:
    """The harness's own write tool call putting `content` into answer.txt (harness_adapters.tool_calls)."""
    return write_file_call(harness, f"{workspace}/{ANSWER_FILE}", content, workspace)


def scripted_policy(completions: list[str]) -> Policy:
    return Policy(engine=ScriptedTestEngine(tokenizer(), completions), renderer=renderer(), name="policy")


async def one_rollout(
    adapter: Any,
    policy: Policy,
    task: TaskSpec | None = None,
    *,
    proxy_stats: list[RolloutStats] | None = None,
    **options: Any,
) -> RolloutResult:
    """One rollout through the real proxy and the local sandbox, composed by clawgym_env.rollout; the proxy's
    stats of the rollout are appended to `proxy_stats` when given."""
    async with serving_stack() as stack:
        result = await run_rollout(
            task=task or write_task(),
            adapter=adapter,
            policy=policy,
            backend=stack.backend,
            proxy=stack.proxy,
            options=EnvOptions(**options),
        )
        if proxy_stats is not None:
            proxy_stats.append(stack.proxy.stats(result.rollout_id))
        assert_log_holds(stack.proxy.log_path, result.calls)  # the log gives back every call the rollout made
        return result
