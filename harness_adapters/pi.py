"""pi-coding-agent (`@mariozechner/pi-coding-agent` 0.73.1) headless over Chat Completions (or Anthropic).

    pi --provider policy --model <name> -p --mode json --no-session "<instruction>"

with a generated `$HOME/.pi/agent/models.json`. Trap (docs/harnesses.md): on persistent API errors pi exits
0; the failure only shows as `stopReason: "error"` on the last assistant message, so success is read from
the `agent_end` event. pi has no MCP client by design ("No MCP" in its README): asking for MCP servers
here is refused with a clear error.
"""

from __future__ import annotations

import json
from typing import Any

from clawgym_env.interfaces import HarnessContext
from clawgym_env.specs import ApiStyle
from harness_adapters.base import CliHarnessAdapter, LaunchPlan, ParsedRun, parse_jsonl

PI_APIS = {ApiStyle.OPENAI_CHAT: "openai-completions", ApiStyle.ANTHROPIC_MESSAGES: "anthropic-messages"}


class PiAdapter(CliHarnessAdapter):
    name = "Pi"
    api_style = ApiStyle.OPENAI_CHAT
    binary = "pi"
    package = "@mariozechner/pi-coding-agent"
    pinned_version = "0.73.1"

    def __init__(
        self,
        *,
        api_style: str | ApiStyle = ApiStyle.OPENAI_CHAT,
        context_window: int = 32_768,
        max_tokens: int = 4096,
        tools: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        style = ApiStyle(api_style)
        if style not in PI_APIS:
            raise ValueError(f"pi speaks {[s.value for s in PI_APIS]}; got {style.value!r}")
        if self.mcp_servers:
            raise ValueError(
                "pi has no MCP client (its README: 'No MCP'); attach MCP tools to ClaudeCode, Codex, OpenClaw "
                "or WhiteBox instead"
            )
        self.api_style = style
        self.context_window = context_window
        self.max_tokens = max_tokens
        self.tools = tools

    def models_json(self, ctx: HarnessContext) -> dict[str, Any]:
        api = PI_APIS[self.api_style]
        base = ctx.base_url.rstrip("/") + ("/v1" if api == "openai-completions" else "")
        return {
            "providers": {
                "policy": {
                    "baseUrl": base,
                    "api": api,
                    "apiKey": ctx.api_key,
                    "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                    "models": [
                        {
                            "id": ctx.model_name,
                            "reasoning": False,
                            "contextWindow": self.context_window,
                            "maxTokens": self.max_tokens,
                        }
                    ],
                }
            }
        }

    def plan(self, ctx: HarnessContext, home: str) -> LaunchPlan:
        argv = ["pi", "--provider", "policy", "--model", ctx.model_name, "-p", "--mode", "json", "--no-session"]
        if self.tools:
            argv += ["--tools", self.tools]
        argv.append(ctx.task.instruction)
        files = {f"{home}/.pi/agent/models.json": json.dumps(self.models_json(ctx), indent=1)}
        env = {"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1"}
        return LaunchPlan(argv=argv, env=env, cwd=ctx.sandbox.workspace_path, files=files)

    def parse(self, stdout: str, stderr: str, exit_code: int | None) -> ParsedRun:
        all_events = parse_jsonl(stdout)
        # message_update carries one streamed delta each: drop them, the message_end events hold the text
        events = [e for e in all_events if e.get("type") != "message_update"]
        end = next((e for e in reversed(events) if e.get("type") == "agent_end"), None)
        if end is None:
            tail = (stderr.strip() or stdout.strip())[-400:]
            return ParsedRun(success=False, events=events, error=f"pi gave no agent_end event: {tail}")
        assistants = [m for m in end.get("messages", []) if isinstance(m, dict) and m.get("role") == "assistant"]
        turns = len(assistants)
        last = assistants[-1] if assistants else {}
        stop = last.get("stopReason")
        final = "".join(
            b.get("text", "") for b in last.get("content", []) if isinstance(b, dict) and b.get("type") == "text"
        )
        if stop in ("error", "aborted") or not assistants:
            error = f"pi stopped with {stop or 'no assistant message'}: {last.get('errorMessage', '')}".strip()
            return ParsedRun(success=False, final_message=final, events=events, turns=turns, error=error)
        return ParsedRun(success=exit_code == 0, final_message=final, events=events, turns=turns)
