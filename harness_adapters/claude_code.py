"""Claude Code (`@anthropic-ai/claude-code` 2.1.197) headless over Anthropic Messages.

    claude -p --output-format stream-json --verbose --dangerously-skip-permissions --no-session-persistence

Traps handled here (docs/harnesses.md): as root, skipping permissions needs IS_SANDBOX=1; stream-json needs
--verbose; without CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC a title side call reaches the policy; the
default tool set is ~64k characters of schemas (too long for a small model), so `--tools` narrows it;
retries are set on purpose (default 10 retries cost ~180 s on a persistent 5xx). A call whose first byte
takes 300 s is dropped three ways: Bun's fetch idle timeout (lifted by `API_FORCE_IDLE_TIMEOUT=0`), the
stream idle watchdog (`CLAUDE_STREAM_IDLE_TIMEOUT_MS`, 300 s at least) and the request timeout
(`API_TIMEOUT_MS`, 600 s). A CPU policy's first token can take that long when several ~4k-token Claude Code
prompts queue for prefill on a loaded machine, so the watchdogs follow the rollout's own time limit (the
rollout timeout stays the one guard against a hung call). Auto memory is off
(`CLAUDE_CODE_DISABLE_AUTO_MEMORY`): a rollout's home is thrown away, so there is nothing to remember, and
its system-prompt section (~500 tokens telling the model to "write to it directly with the Write tool" and
index it in MEMORY.md) made the 0.5B policy write MEMORY.md instead of the task's file.
"""

from __future__ import annotations

import json
from typing import Any

from clawgym_env.interfaces import HarnessContext
from clawgym_env.specs import ApiStyle
from harness_adapters.base import CliHarnessAdapter, LaunchPlan, ParsedRun, parse_jsonl

DEFAULT_TOOLS = "Bash,Read,Edit,Write,Glob,Grep"
CLIENT_TIMEOUT_FLOOR_MS = 300_000  # Claude Code's own stream idle timeout, which it never goes below


def client_timeout_ms(rollout_timeout_s: float) -> int:
    """Claude Code's per-call client timeouts: the rollout's limit, so a slow first token (a queued prefill on
    a loaded CPU) is waited for instead of dropped; the rollout timeout still ends a hung harness."""
    return max(CLIENT_TIMEOUT_FLOOR_MS, int(rollout_timeout_s * 1000))


class ClaudeCodeAdapter(CliHarnessAdapter):
    name = "ClaudeCode"
    api_style = ApiStyle.ANTHROPIC_MESSAGES
    binary = "claude"
    package = "@anthropic-ai/claude-code"
    pinned_version = "2.1.197"
    needs_node24 = False  # a native binary

    def __init__(
        self, *, tools: str | None = DEFAULT_TOOLS, max_retries: int = 1, max_turns: int | None = None, **kw: Any
    ):
        super().__init__(**kw)
        self.tools = tools
        self.max_retries = max_retries
        self.max_turns = max_turns

    def plan(self, ctx: HarnessContext, home: str) -> LaunchPlan:
        argv = [
            "claude",
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
            "--no-session-persistence",
        ]
        if self.tools is not None:
            argv.append(f"--tools={self.tools}")  # `=` form: --tools is variadic and would eat the prompt
        if self.max_turns:
            argv += ["--max-turns", str(self.max_turns)]
        files: dict[str, str] = {}
        if self.mcp_servers:
            config_path = f"{home}/mcp.json"
            files[config_path] = json.dumps(
                {
                    "mcpServers": {
                        s.name: {"type": "stdio", "command": s.command, "args": list(s.args), "env": dict(s.env)}
                        for s in self.mcp_servers
                    }
                }
            )
            argv += [f"--mcp-config={config_path}", "--strict-mcp-config"]
            if self.tools is not None:
                # --tools lists the built-in tools; MCP tools are added by name pattern
                argv.append("--allowedTools=" + ",".join(f"mcp__{s.name}" for s in self.mcp_servers))
        argv.append(ctx.task.instruction)
        env = {
            "ANTHROPIC_BASE_URL": ctx.base_url,
            "ANTHROPIC_API_KEY": ctx.api_key,
            "ANTHROPIC_MODEL": ctx.model_name,
            "ANTHROPIC_SMALL_FAST_MODEL": ctx.model_name,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": ctx.model_name,
            "IS_SANDBOX": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
            "CLAUDE_CODE_MAX_RETRIES": str(self.max_retries),
            "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
            "API_FORCE_IDLE_TIMEOUT": "0",
            "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(client_timeout_ms(ctx.timeout_s)),
            "API_TIMEOUT_MS": str(client_timeout_ms(ctx.timeout_s)),
        }
        if self.mcp_servers:
            # -p starts MCP servers in the background and may make its first call before they connect;
            # make it wait for them (up to MCP_TIMEOUT ms) so the tools are offered from the first call
            env.update({"MCP_CONNECTION_NONBLOCKING": "false", "MCP_TIMEOUT": "60000"})
        return LaunchPlan(argv=argv, env=env, cwd=ctx.sandbox.workspace_path, files=files)

    def parse(self, stdout: str, stderr: str, exit_code: int | None) -> ParsedRun:
        events = parse_jsonl(stdout)
        result = next((e for e in reversed(events) if e.get("type") == "result"), None)
        if result is None:
            tail = (stderr.strip() or stdout.strip())[-400:]
            return ParsedRun(success=False, events=events, error=f"Claude Code gave no result event: {tail}")
        is_error = bool(result.get("is_error")) or result.get("subtype") not in (None, "success")
        turns = int(result.get("num_turns") or sum(1 for e in events if e.get("type") == "assistant"))
        final = result.get("result") if isinstance(result.get("result"), str) else ""
        error = None
        if is_error:
            error = f"Claude Code: {result.get('subtype')}: {final or result.get('errors') or 'error'}"
        return ParsedRun(
            success=not is_error and exit_code == 0, final_message=final, events=events, turns=turns, error=error
        )
