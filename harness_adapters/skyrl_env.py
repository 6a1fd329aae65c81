"""The white-box agent loop as a skyrl-gym `BaseTextEnv`: one model turn per `step`.

SkyRL-style trainers own generation (and the token ids): they call `init(prompt)` for the first messages,
then `step(text)` with each model turn. This env parses the turn's tool call (Qwen `<tool_call>` tags, bare
or fenced JSON), runs it in the task's sandbox with the white-box tools, and returns the tool result as the
next observation. The episode ends when the model answers without a tool call or at `max_turns`; the
reward is then the task's verifier score on the final workspace (0 at every earlier step).

    env = WhiteBoxTextEnv(extras={"task": task})
    prompt, info = env.init([])                       # [system (with the tools), user (instruction)]
    out = env.step('<tool_call>{"name": "write", "arguments": {...}}</tool_call>')
    out = env.step("Done.")                            # out["done"], out["reward"]
    env.close()
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from clawgym_env.interfaces import HarnessResult, VerifyContext
from clawgym_env.specs import TaskSpec
from harness_adapters.base import coerce_mcp_servers
from harness_adapters.whitebox import SYSTEM_PROMPT, SandboxToolbox, WhiteBoxEpisode

TOOLS_INTRO = (
    "\n\n# Tools\n\nYou may call one of these functions. Reply with "
    '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call> to call one.\n'
)


class WhiteBoxTextEnv(BaseTextEnv):
    """skyrl-gym text env over a ClawGym task. extras: `task` (TaskSpec, required), `backend` (a sandbox
    backend; default the local bubblewrap one), `max_turns` (default 16), `mcp_servers`."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = dict(extras or {})
        task = extras.get("task")
        if not isinstance(task, TaskSpec):
            raise ValueError("WhiteBoxTextEnv needs extras={'task': TaskSpec(...)}: the task to run")
        self.task = task
        self.max_turns = int(extras.get("max_turns", getattr(env_config, "max_turns", 16) if env_config else 16))
        self.mcp_servers = coerce_mcp_servers(extras.get("mcp_servers"))
        self._backend = extras.get("backend")
        self._own_backend = self._backend is None
        self._loop = asyncio.new_event_loop()
        self._sandbox: Any = None
        self.episode: WhiteBoxEpisode | None = None
        self.reward: float | None = None
        self.verifier_result: Any = None

    # ------------------------------------------------------------------ async plumbing
    def _run(self, coro: Any) -> Any:
        """Run a coroutine on this env's own loop (skyrl-gym's API is synchronous)."""
        return self._loop.run_until_complete(coro)

    async def _start(self) -> None:
        if self._backend is None:
            from clawgym_env.sandbox import make_backend

            self._backend = make_backend("local")
        self._sandbox = await self._backend.create(self.task)
        toolbox = SandboxToolbox(self._sandbox, self.mcp_servers)
        await toolbox.start()
        self.episode = WhiteBoxEpisode(
            renderer=None, toolbox=toolbox, instruction=self.task.instruction, rollout_id=self.task.id
        )

    # ------------------------------------------------------------------ skyrl-gym API
    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Start the sandbox; the first messages are the system prompt (with the tool list) and the task."""
        self._run(self._start())
        assert self.episode is not None
        tools = [t.as_template_tool() for t in self.episode.toolbox.specs]
        system = (
            SYSTEM_PROMPT.format(workspace=self._sandbox.workspace_path)
            + TOOLS_INTRO
            + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        )
        messages = [{"role": "system", "content": system}, {"role": "user", "content": self.task.instruction}]
        extra = [m for m in (prompt or []) if m.get("role") != "system"]  # keep the trainer's own extra turns
        return messages + [m for m in extra if m not in messages], {"tools": tools, "task_id": self.task.id}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.episode is None:
            raise RuntimeError("call env.init(prompt) before env.step(action)")
        if self.episode.done:
            raise RuntimeError("the episode is over (the model answered without a tool call); make a new env")
        self.turns += 1
        message, parsed = self.episode.add_text_action(action)
        if self.episode.done or self.turns >= self.max_turns:
            reward = self._run(self._verify())
            return BaseTextEnvStepOutput(
                observations=[],
                reward=reward,
                done=True,
                metadata={"turns": self.turns, "final": parsed.text, "verifier": self._verifier_info()},
                postprocessed_action=action,
            )
        results = self._run(self.episode.run_tools(message))
        observations = [{"role": "tool", "content": r.content} for r in results]
        return BaseTextEnvStepOutput(
            observations=observations,
            reward=0.0,
            done=False,
            metadata={"turns": self.turns, "tool_calls": [c.name for c in parsed.tool_calls]},
            postprocessed_action=action,
        )

    async def _verify(self) -> float:
        assert self.episode is not None
        tmp = Path(tempfile.mkdtemp(prefix="clawgym-skyrl-verify-"))
        try:
            workspace = await self._sandbox.download_workspace(tmp / "workspace")
            result = HarnessResult(
                harness="WhiteBox", success=True, final_message=self.episode.final_message, turns=self.turns
            )
            ctx = VerifyContext(sandbox=self._sandbox, task=self.task, harness_result=result, workspace_dir=workspace)
            self.verifier_result = await self.task.verifier.verify(ctx)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.reward = float(self.verifier_result.reward) if self.verifier_result.error is None else 0.0
        return self.reward

    def _verifier_info(self) -> dict[str, Any]:
        v = self.verifier_result
        return {} if v is None else {"reward": v.reward, "subscores": dict(v.subscores), "error": v.error}

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns, "reward": self.reward or 0.0}

    def close(self) -> None:
        async def teardown() -> None:
            if self._sandbox is not None:
                await self._sandbox.destroy()
            if self._own_backend and self._backend is not None:
                await self._backend.aclose()

        if not self._loop.is_closed():
            try:
                self._run(teardown())
            finally:
                self._sandbox = None
                self._loop.close()
