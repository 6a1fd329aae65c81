"""Scripted reference policies: test doubles that play each task's reference solution through any harness."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from clawgym_env.interfaces import Policy
from clawgym_env.specs import TaskSpec
from evaluation.run import PolicySource
from harness_adapters.tool_calls import write_file_call_for_tools
from task_suites import reference_files

_TOOL_NAME = re.compile(r'"name":\s*"([A-Za-z_][\w.-]*)"')
FINAL_MESSAGE = "Done."
WRONG_CONTENT = "this is not the answer\n"


class ScriptedReferencePolicies:
    """A test double standing in for a model: per task, a ScriptedTestEngine that plays a fixed solution.

    `mode="reference"` writes the task's reference files (`metadata["reference"]["files"]`) through the
    harness's own write tool, one call per file, then ends with a final message: reward 1.0 on bundled
    suites. `mode="wrong"` writes the same files with wrong content; `mode="idle"` only answers. The harness
    is recognised from the tool names in the prompt (Write -> Claude Code, exec_command -> Codex, write ->
    pi / OpenClaw / white-box loop), so one factory serves every env. Use: `evaluate(ScriptedReferencePolicies(), ...)`
    or `clawgym evaluate ... --model scripted:reference`.
    """

    MODES = ("reference", "wrong", "idle")

    def __init__(self, mode: str = "reference") -> None:
        if mode not in self.MODES:
            raise ValueError(f"ScriptedReferencePolicies mode must be one of {self.MODES}, got {mode!r}")
        from clawgym_env.chat import ChatMLRenderer
        from clawgym_env.engines import load_qwen_tokenizer

        self.mode = mode
        self.name = f"scripted:{mode}"
        self.tokenizer = load_qwen_tokenizer()
        self.renderer = ChatMLRenderer(self.tokenizer)

    def files_for(self, task: TaskSpec) -> dict[str, str]:
        if self.mode == "idle":
            return {}
        files = reference_files(task)
        return files if self.mode == "reference" else {path: WRONG_CONTENT for path in files}

    def __call__(self, task: TaskSpec) -> Policy:
        from clawgym_env.engines import ScriptedTestEngine

        files = list(self.files_for(task).items())
        mount = task.mount_path.rstrip("/")
        state = {"next": 0}

        def script(prompt_text: str) -> str:
            i = state["next"]
            state["next"] += 1
            if i >= len(files):
                return FINAL_MESSAGE
            path, content = files[i]
            return write_file_call_for_tools(set(_TOOL_NAME.findall(prompt_text)), f"{mount}/{path}", content, mount)

        engine = ScriptedTestEngine(self.tokenizer, script)
        return Policy(engine=engine, renderer=self.renderer, name=self.name)


def make_eval_policy(model: str, *, engine: str = "transformers", **engine_options: Any) -> PolicySource:
    """A policy from a model name: a zoo name or path, or `scripted:reference|wrong|idle` (test doubles)."""
    if model.startswith("scripted:"):
        return ScriptedReferencePolicies(model.split(":", 1)[1])
    from clawgym_env.policies import make_policy

    return make_policy(model, engine=engine, name=Path(model).name if "/" in model else model, **engine_options)
