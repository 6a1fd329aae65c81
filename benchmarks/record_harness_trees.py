"""Record real rollouts with the real harness CLIs and print their tree statistics (docs/trajectory.md).

    .venv/bin/python benchmarks/record_harness_trees.py [--out runs/harness-trees] [--skip-model] [--skip-scripted]

Every rollout runs the pinned CLI inside the local sandbox, through the real proxy, and its calls.jsonl is
what the proxy recorded; the rows are `recording_stats` of those files (the same reconstruction as training).
Two kinds of policy:

- the small real model (`tiny-qwen3`, a randomly initialised Qwen3 shape with the real tokenizer) on
  ClawGymBench seed 0 via `clawgym_env.make` (as `clawgym run ClawGymBench-<Harness>` does), and on the
  write-a-file task for OpenClaw in chat mode (a harness variant the registry does not name);
- `ScriptedTestEngine` (the named test double: scripted tool calls in Qwen's native format, tokenized by the
  real tokenizer) for multi-turn conversations with each harness's own tools (read, write, read back, answer).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clawgym_env.records import CallLog, ModelCall  # noqa: E402
from clawgym_env.specs import DEFAULT_MOUNT_PATH  # noqa: E402
from clawgym_env.trajectory.inspect import markdown_table, recording_stats  # noqa: E402
from harness_adapters.claude_code import ClaudeCodeAdapter  # noqa: E402
from harness_adapters.codex import CodexAdapter  # noqa: E402
from harness_adapters.mcp_servers import workspace_search_server  # noqa: E402
from harness_adapters.openclaw import OpenClawAdapter  # noqa: E402
from harness_adapters.pi import PiAdapter  # noqa: E402
from tests.harnesses.helpers import ANSWER_FILE, one_rollout, scripted_policy, tool_call, write_call  # noqa: E402

MODEL = "tiny-qwen3"
WS = DEFAULT_MOUNT_PATH
NOTES = f"{WS}/notes.md"
ANSWER = f"{WS}/{ANSWER_FILE}"


def read_call(harness: str, path: str) -> str:
    """Each harness's own read tool (docs/harnesses.md)."""
    if harness == "ClaudeCode":
        return tool_call("Read", {"file_path": path})
    if harness == "Codex":
        return tool_call("exec_command", {"cmd": f"cat {path}", "workdir": WS})
    return tool_call("read", {"path": path})  # Pi, OpenClaw


def four_calls(harness: str) -> list[str]:
    """read notes -> write answer -> read it back -> final answer: four model calls."""
    return [read_call(harness, NOTES), write_call(harness, "42"), read_call(harness, ANSWER), "The answer is 42."]


# (label, adapter factory, harness name for the tool calls, API style shown in the table)
SCRIPTED: list[tuple[str, Any, str, str]] = [
    ("ClaudeCode", ClaudeCodeAdapter, "ClaudeCode", "anthropic-messages"),
    ("Codex", CodexAdapter, "Codex", "openai-responses"),
    ("Pi", PiAdapter, "Pi", "openai-chat"),
    ("OpenClaw", OpenClawAdapter, "OpenClaw", "openai-responses"),
    ("OpenClaw", lambda: OpenClawAdapter(api_style="openai-chat"), "OpenClaw", "openai-chat"),
]
MODEL_ENVS: list[tuple[str, str]] = [
    ("Pi", "openai-chat"),
    ("ClaudeCode", "anthropic-messages"),
    ("Codex", "openai-responses"),
    ("OpenClaw", "openai-responses"),
]


def save(calls: list[ModelCall], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with CallLog(path) as log:
        for call in calls:
            log.append(call)
    return path


async def scripted_recordings(out: Path) -> list[tuple[str, Path]]:
    recorded = []
    for label, make, harness, style in SCRIPTED:
        t0 = time.perf_counter()
        result = await one_rollout(make(), scripted_policy(four_calls(harness)))
        name = f"{label} | {style} | scripted | read, write, read, answer"
        print(
            f"{name}: {result.status} reward {result.reward} {len(result.calls)} calls {time.perf_counter() - t0:.1f}s",
            flush=True,
        )
        recorded.append((name, save(result.calls, out / f"scripted-{label}-{style}" / "calls.jsonl")))
    mcp = [
        tool_call("mcp__workspace_search__search_workspace", {"query": "answer"}),
        write_call("Codex", "42"),
        "Done.",
    ]
    result = await one_rollout(CodexAdapter(mcp_servers=[workspace_search_server()]), scripted_policy(mcp))
    name = "Codex + MCP | openai-responses | scripted | MCP search, write, answer"
    print(f"{name}: {result.status} reward {result.reward} {len(result.calls)} calls", flush=True)
    recorded.append((name, save(result.calls, out / "scripted-Codex-mcp" / "calls.jsonl")))
    return recorded


def model_recordings(out: Path) -> list[tuple[str, Path]]:
    import clawgym_env
    from clawgym_env.policies import make_policy
    from clawgym_env.specs import ApiStyle
    from tests.harnesses.helpers import write_task

    policy = make_policy(MODEL)
    recorded = []
    for harness, style in MODEL_ENVS:
        run_dir = out / f"model-{harness}"
        env = clawgym_env.make(f"ClawGymBench-{harness}", run_dir=run_dir)
        env.reset(seed=0)
        t0 = time.perf_counter()
        _, reward, _, _, info = env.step(policy)
        env.close()
        name = f"{harness} | {style} | {MODEL} | ClawGymBench seed 0"
        print(
            f"{name}: {info['status']} reward {reward} {info['num_calls']} calls {time.perf_counter() - t0:.1f}s",
            flush=True,
        )
        recorded.append((name, run_dir / "calls.jsonl"))
    result = asyncio.run(one_rollout(OpenClawAdapter(api_style=ApiStyle.OPENAI_CHAT), policy, write_task()))
    name = f"OpenClaw | openai-chat | {MODEL} | write-answer task"
    print(f"{name}: {result.status} reward {result.reward} {len(result.calls)} calls", flush=True)
    recorded.append((name, save(result.calls, out / "model-OpenClaw-chat" / "calls.jsonl")))
    return recorded


def table(recorded: list[tuple[str, Path]]) -> str:
    rows = []
    for name, path in recorded:
        for row in recording_stats(path):
            harness, style, policy, script = name.split(" | ")
            row.pop("rollout")
            rows.append({"harness": harness, "API style": style, "policy": policy, "what it did": script, **row})
    return markdown_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/harness-trees"))
    parser.add_argument("--skip-model", action="store_true", help="only the scripted rollouts (about a minute)")
    parser.add_argument("--skip-scripted", action="store_true", help="only the small-model rollouts")
    args = parser.parse_args()
    recorded: list[tuple[str, Path]] = []
    if not args.skip_scripted:
        recorded += asyncio.run(scripted_recordings(args.out))
    if not args.skip_model:
        recorded += model_recordings(args.out)
    print(table(recorded))


if __name__ == "__main__":
    main()
