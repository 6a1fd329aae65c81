"""The white-box agent loop: our own small, explicit agent whose every token the trainer sees directly.

One episode is a plain loop (no hidden control flow):

    conversation = [system, user(instruction)]
    repeat up to max_turns:
        prompt_ids = renderer.render(conversation, splice=<our own earlier generations>)
        generation = await engine.generate(prompt_ids, sampling)       # in-process, no HTTP
        record ModelCall(prompt_ids, generation ids, logprobs)          # same log, same forest builder
        parsed = renderer.parse(generation ids)
        conversation += assistant(parsed)       # rendered later as the *raw generated ids*, never re-tokenized
        if no tool call: done (the text is the final answer)
        conversation += tool results            # read / write / edit / bash run in the sandbox, + MCP tools

Tools run inside the rollout's sandbox through `sandbox.exec`; MCP tools through a one-shot MCP client run
inside the sandbox (harness_adapters/mcp_client.py). `WhiteBoxEpisode` holds the state and is shared by
`WhiteBoxAdapter` (one whole rollout per `env.step`) and the skyrl-gym `WhiteBoxTextEnv` (one model turn
per `step`, harness_adapters/skyrl_env.py).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from clawgym_env.chat.conversation import Conversation, Message, ToolCall, ToolSpec
from clawgym_env.chat.renderers.base import EchoContext, ParsedOutput, SplicedTurn
from clawgym_env.chat.renderers.toolcall_parsing import parse_generation_text
from clawgym_env.interfaces import HarnessContext, HarnessResult, SamplingParams, Sandbox
from clawgym_env.records import CallTimings, ModelCall
from clawgym_env.specs import ApiStyle
from harness_adapters.base import McpServer, coerce_mcp_servers

MCP_CLIENT = Path(__file__).resolve().with_name("mcp_client.py")
OUTPUT_LIMIT = 8000  # characters of a tool result shown to the model

SYSTEM_PROMPT = (
    "You are an agent working in the folder {workspace}. Use the tools to inspect and change files and to run "
    "commands. Call one tool at a time. When the task is done, reply with your final answer and no tool call."
)

BUILTIN_TOOLS = [
    ToolSpec(
        "read",
        "Read a text file.",
        {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "file path"}},
            "required": ["path"],
        },
    ),
    ToolSpec(
        "write",
        "Create or overwrite a file with the given content.",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    ),
    ToolSpec(
        "edit",
        "Replace the exact text `old` by `new` in a file (old must occur once).",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
            "required": ["path", "old", "new"],
        },
    ),
    ToolSpec(
        "bash",
        "Run a shell command in the workspace and return its output.",
        {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    ),
]


class ToolError(Exception):
    """A tool call the agent got wrong; its message is shown to the model as the tool result."""


class BudgetRefused(Exception):
    """The proxy refused the next call (the rollout's token budget, or the policy's context): the episode ends."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.kind = why.split(":", 1)[0]


class SandboxToolbox:
    """The white-box loop's tools, executed inside the rollout's sandbox."""

    def __init__(self, sandbox: Sandbox, mcp_servers: Sequence[McpServer] = (), command_timeout_s: float = 120.0):
        self.sandbox = sandbox
        self.workspace = sandbox.workspace_path
        self.mcp_servers = list(mcp_servers)
        self.command_timeout_s = command_timeout_s
        self.mcp_tools: dict[str, tuple[McpServer, str]] = {}  # exposed name -> (server, tool name)
        self.specs: list[ToolSpec] = list(BUILTIN_TOOLS)

    async def start(self) -> None:
        """List the MCP servers' tools (each server is started once inside the sandbox to ask)."""
        for server in self.mcp_servers:
            listing = await self._mcp("list", server)
            for tool in listing.get("tools", []):
                exposed = (
                    tool["name"]
                    if tool["name"] not in {s.name for s in self.specs}
                    else f"{server.name}_{tool['name']}"
                )
                self.mcp_tools[exposed] = (server, tool["name"])
                self.specs.append(
                    ToolSpec(
                        exposed,
                        tool.get("description", ""),
                        tool.get("parameters") or {"type": "object", "properties": {}},
                    )
                )

    @property
    def names(self) -> set[str]:
        return {t.name for t in self.specs}

    def _path(self, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise ToolError("`path` must be a non-empty string")
        return value if value.startswith("/") else f"{self.workspace.rstrip('/')}/{value}"

    async def _sh(self, script: str, *args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
        result = await self.sandbox.exec(
            ["/bin/sh", "-c", script, "sh", *args], cwd=self.workspace, timeout_s=self.command_timeout_s, stdin=stdin
        )
        if result.timed_out:
            raise ToolError(f"the command ran past {self.command_timeout_s:.0f} s and was stopped")
        return result.exit_code, result.stdout, result.stderr

    async def execute(self, call: ToolCall) -> str:
        """Run one tool call; a wrong call yields an error text for the model, never an exception."""
        args = call.arguments if isinstance(call.arguments, dict) else {}
        try:
            if isinstance(call.arguments, str):
                raise ToolError(f"arguments of {call.name} are not a JSON object: {call.arguments[:200]}")
            if call.name == "read":
                code, out, err = await self._sh('cat -- "$1"', self._path(args.get("path")))
                if code != 0:
                    raise ToolError(err.strip() or f"cannot read {args.get('path')}")
                return out
            if call.name == "write":
                content = args.get("content")
                if not isinstance(content, str):
                    raise ToolError("`content` must be a string")
                path = self._path(args.get("path"))
                code, _, err = await self._sh(
                    'mkdir -p "$(dirname -- "$1")" && cat > "$1"', path, stdin=content.encode()
                )
                if code != 0:
                    raise ToolError(err.strip() or f"cannot write {path}")
                return f"wrote {len(content.encode())} bytes to {args.get('path')}"
            if call.name == "edit":
                return await self._edit(args)
            if call.name == "bash":
                command = args.get("command")
                if not isinstance(command, str) or not command.strip():
                    raise ToolError("`command` must be a non-empty string")
                code, out, err = await self._sh(command)
                text = out + (("\n[stderr]\n" + err) if err.strip() else "")
                return f"{text}\n[exit code {code}]".strip()
            if call.name in self.mcp_tools:
                server, tool = self.mcp_tools[call.name]
                reply = await self._mcp("call", server, tool, args)
                return ("error: " if reply.get("is_error") else "") + reply.get("text", "")
            raise ToolError(f"unknown tool {call.name!r}; the tools are {sorted(self.names)}")
        except ToolError as exc:
            return f"error: {exc}"

    async def _edit(self, args: dict[str, Any]) -> str:
        path = self._path(args.get("path"))
        old, new = args.get("old"), args.get("new")
        if not isinstance(old, str) or not isinstance(new, str) or not old:
            raise ToolError("`old` (non-empty) and `new` must be strings")
        code, text, err = await self._sh('cat -- "$1"', path)
        if code != 0:
            raise ToolError(err.strip() or f"cannot read {path}")
        count = text.count(old)
        if count != 1:
            raise ToolError(f"`old` occurs {count} times in {args.get('path')}; it must occur exactly once")
        code, _, err = await self._sh('cat > "$1"', path, stdin=text.replace(old, new).encode())
        if code != 0:
            raise ToolError(err.strip() or f"cannot write {path}")
        return f"edited {args.get('path')}"

    async def _mcp(
        self, action: str, server: McpServer, tool: str | None = None, args: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        spec = json.dumps({"command": server.command, "args": list(server.args), "env": dict(server.env)})
        from harness_adapters.mcp_servers import sandbox_python_argv

        argv = [*sandbox_python_argv(), str(MCP_CLIENT), action, spec]
        if action == "call":
            argv += [tool or "", json.dumps(args or {})]
        result = await self.sandbox.exec(argv, cwd=self.workspace, timeout_s=self.command_timeout_s)
        if result.exit_code != 0:
            raise ToolError(f"MCP server {server.name} failed: {result.stderr.strip()[-300:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])


class WhiteBoxEpisode:
    """The state of one white-box episode: the conversation, our generations (for splicing), the calls."""

    def __init__(
        self,
        *,
        renderer: Any,
        toolbox: SandboxToolbox,
        instruction: str,
        rollout_id: str,
        record: Callable[[ModelCall], None] | None = None,
        admit: Callable[[list[int]], Any] | None = None,
        system_prompt: str = SYSTEM_PROMPT,
    ) -> None:
        self.renderer = renderer
        self.toolbox = toolbox
        self.rollout_id = rollout_id
        self.record = record
        self.admit = admit  # the proxy's token budget for a prompt (InProcessAdmission), when it records
        self.messages: list[Message] = [
            Message("system", system_prompt.format(workspace=toolbox.workspace)),
            Message("user", instruction),
        ]
        self._generated: dict[int, SplicedTurn] = {}  # id(assistant Message) -> its raw generated ids
        self.calls: list[ModelCall] = []
        self.done = False
        self.final_message = ""

    @property
    def conversation(self) -> Conversation:
        return Conversation(messages=self.messages, tools=self.toolbox.specs)

    def _splice(self, message: Message, _context: EchoContext) -> SplicedTurn | None:
        return self._generated.get(id(message))

    def prompt(self) -> Any:
        """The next call's prompt (RenderedPrompt): our earlier turns are the raw ids we generated."""
        return self.renderer.render(self.conversation, splice=self._splice)

    def add_generation(
        self, generated_ids: list[int], *, call_index: int | None = None
    ) -> tuple[Message, ParsedOutput]:
        """Append the model's turn (kept as raw ids for every later prompt) and say what it asked for."""
        parsed: ParsedOutput = self.renderer.parse(generated_ids, self.toolbox.names)
        message = Message("assistant", parsed.text, tool_calls=list(parsed.tool_calls), reasoning=parsed.reasoning)
        stop_ids = set(getattr(self.renderer, "stop_token_ids", ()))
        self._generated[id(message)] = SplicedTurn(
            token_ids=list(generated_ids),
            source_call=len(self.calls) - 1 if call_index is None else call_index,
            ended_with_stop=bool(generated_ids) and generated_ids[-1] in stop_ids,
        )
        self.messages.append(message)
        if not parsed.tool_calls:
            self.done, self.final_message = True, parsed.text
        return message, parsed

    def add_text_action(self, text: str) -> tuple[Message, ParsedOutput]:
        """A turn given as text (skyrl-gym passes text actions): parsed, and re-tokenized when rendered."""
        parsed = parse_generation_text(text, self.toolbox.names)
        message = Message("assistant", parsed.text, tool_calls=list(parsed.tool_calls), reasoning=parsed.reasoning)
        self.messages.append(message)
        if not parsed.tool_calls:
            self.done, self.final_message = True, parsed.text
        return message, parsed

    async def run_tools(self, message: Message) -> list[Message]:
        """Execute the turn's tool calls in the sandbox; the results join the conversation."""
        results = []
        for index, call in enumerate(message.tool_calls):
            output = await self.toolbox.execute(call)
            if len(output) > OUTPUT_LIMIT:
                output = output[:OUTPUT_LIMIT] + f"\n[... {len(output) - OUTPUT_LIMIT} more characters cut]"
            results.append(Message("tool", output, tool_call_id=call.id or f"call_{len(self.calls)}_{index}"))
        self.messages.extend(results)
        return results

    async def model_turn(self, engine: Any, sampling: SamplingParams) -> tuple[Message, ParsedOutput, ModelCall]:
        """One model call: render, ask the proxy's budget, generate in-process, record the ModelCall, append the
        turn. Raises BudgetRefused when the proxy refuses the prompt (recorded there as a failed call)."""
        received = time.time()
        t0 = time.perf_counter()
        rendered = self.prompt()
        if self.admit is not None:
            admission = self.admit(list(rendered.prompt_ids))
            if admission.refused is not None:
                raise BudgetRefused(admission.refused)
            sampling = sampling.model_copy(update={"max_tokens": min(sampling.max_tokens, admission.max_new_tokens)})
        t1 = time.perf_counter()
        generation = await engine.generate(rendered.prompt_ids, sampling)
        t2 = time.perf_counter()
        call = ModelCall(
            rollout_id=self.rollout_id,
            call_index=len(self.calls),
            api_style=ApiStyle.IN_PROCESS,
            request={
                "messages": [_message_json(m) for m in self.messages],
                "tools": [t.name for t in self.toolbox.specs],
            },
            prompt_ids=list(rendered.prompt_ids),
            generated_ids=list(generation.token_ids),
            logprobs=list(generation.logprobs),
            finish_reason=generation.finish_reason,
            policy_version=generation.policy_version,
            segments=list(rendered.segments),
            drift_events=rendered.drift_events,
            timings=CallTimings(received_at=received, render_s=t1 - t0, generate_s=t2 - t1, total_s=t2 - t0),
        )
        self.calls.append(call)
        if self.record is not None:
            self.record(call)
        message, parsed = self.add_generation(list(generation.token_ids), call_index=call.call_index)
        return message, parsed, call


def _message_json(message: Message) -> dict[str, Any]:
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls]
    return data


class WhiteBoxAdapter:
    """Runs the white-box loop as a harness (api_style IN_PROCESS): the policy is called in-process."""

    name = "WhiteBox"
    api_style = ApiStyle.IN_PROCESS

    def __init__(
        self,
        *,
        max_turns: int = 16,
        max_new_tokens: int = 1024,
        temperature: float | None = None,
        mcp_servers: Sequence[Any] | None = None,
        command_timeout_s: float = 120.0,
        system_prompt: str = SYSTEM_PROMPT,
    ) -> None:
        self.max_turns = max_turns
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.mcp_servers = coerce_mcp_servers(mcp_servers)
        self.command_timeout_s = command_timeout_s
        self.system_prompt = system_prompt

    def check_installed(self) -> None:
        """Nothing to install: the loop is Python and the tools are sh and cat."""

    def sampling(self, ctx: HarnessContext) -> SamplingParams:
        from harness_adapters.inprocess_recording import rollout_limits

        limits = rollout_limits(ctx)
        temperature = self.temperature if self.temperature is not None else (limits.temperature if limits else 1.0)
        max_new = min(self.max_new_tokens, limits.max_new_tokens) if limits else self.max_new_tokens
        stop = tuple(getattr(ctx.policy.renderer, "stop_token_ids", ())) if ctx.policy else ()
        return SamplingParams(max_tokens=max_new, temperature=temperature, stop_token_ids=stop)

    async def run(self, ctx: HarnessContext) -> HarnessResult:
        import asyncio

        from harness_adapters.inprocess_recording import admitter_for, recorder_for, rollout_limits

        if ctx.policy is None:
            raise ValueError(
                "WhiteBoxAdapter needs ctx.policy (an engine and its renderer): it calls the policy in-process"
            )
        t0 = time.perf_counter()
        toolbox = SandboxToolbox(ctx.sandbox, self.mcp_servers, self.command_timeout_s)
        episode = WhiteBoxEpisode(
            renderer=ctx.policy.renderer,
            toolbox=toolbox,
            instruction=ctx.task.instruction,
            rollout_id=ctx.rollout_id,
            record=recorder_for(ctx),
            admit=admitter_for(ctx),
            system_prompt=self.system_prompt,
        )
        limits = rollout_limits(ctx)
        max_turns = min(self.max_turns, limits.max_calls) if limits else self.max_turns
        sampling = self.sampling(ctx)
        events: list[dict[str, Any]] = []
        error: str | None = None
        timed_out = False

        async def loop() -> None:
            await toolbox.start()
            for _ in range(max_turns):
                message, parsed, call = await episode.model_turn(ctx.policy.engine, sampling)
                events.append(
                    {
                        "type": "assistant",
                        "call_index": call.call_index,
                        "text": parsed.text,
                        "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in parsed.tool_calls],
                    }
                )
                if episode.done:
                    return
                results = await episode.run_tools(message)
                events.extend({"type": "tool_result", "content": r.content[:2000]} for r in results)

        stopped_at_budget = None
        try:
            await asyncio.wait_for(loop(), timeout=ctx.timeout_s)
        except TimeoutError:
            timed_out, error = True, f"WhiteBox ran past its {ctx.timeout_s:.0f} s limit"
        except BudgetRefused as refused:
            error = f"WhiteBox stopped: the proxy refused its next call ({refused})"
            stopped_at_budget = "token_cap" if refused.kind == "token_cap" else None
        if not episode.done and error is None:
            error = f"WhiteBox reached its turn cap ({max_turns}) without a final answer"
            if limits and max_turns == limits.max_calls:
                stopped_at_budget = "call_cap"  # the rollout's call budget, as a CLI harness meets it at the proxy
        return HarnessResult(
            harness=self.name,
            exit_code=0 if episode.done else 1,
            success=episode.done and error is None,
            final_message=episode.final_message,
            events=events,
            turns=len(episode.calls),
            error=error,
            timed_out=timed_out,
            stopped_at_budget=stopped_at_budget,
            wall_s=time.perf_counter() - t0,
            startup_s=0.0,
        )

    def command_line(self, ctx: HarnessContext, home: str) -> str:
        return shlex.join(["<in-process>", self.name])
