"""OpenClaw (`openclaw` 2026.9.6) headless through `openclaw agent exec` (Node 24).

    openclaw agent exec --config <generated json5> --cwd <workspace> --model policy/<name> --json "<instruction>"

The API style is selectable: openai-responses (default: the only mode whose `input` list is an exact prefix
extension of the previous call), openai-completions, anthropic-messages (both rewrite history; HARNESSES.md §2).
OpenClaw has no loop guard of its own (2,205 calls in one measured run), so the proxy's per-rollout call cap
matters here. Its 10-15 s start-up is measured and discussed in docs/harnesses.md.
MCP servers go in the config's `mcp.servers` (stdio: command, args, env).
"""

from __future__ import annotations

import json
import math
from typing import Any

from clawgym_env.interfaces import HarnessContext
from clawgym_env.specs import ApiStyle
from harness_adapters.base import CliHarnessAdapter, LaunchPlan, ParsedRun, parse_json_document

OPENCLAW_APIS = {
    ApiStyle.OPENAI_RESPONSES: "openai-responses",
    ApiStyle.OPENAI_CHAT: "openai-completions",
    ApiStyle.ANTHROPIC_MESSAGES: "anthropic-messages",
}


class OpenClawAdapter(CliHarnessAdapter):
    name = "OpenClaw"
    api_style = ApiStyle.OPENAI_RESPONSES
    binary = "openclaw"
    package = "openclaw"
    pinned_version = "2026.9.6"

    def __init__(
        self,
        *,
        api_style: str | ApiStyle = ApiStyle.OPENAI_RESPONSES,
        local_model_lean: bool = False,
        code_mode: str | None = "direct",
        context_window: int = 32_768,
        max_tokens: int = 4096,
        state_dir: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        style = ApiStyle(api_style)
        if style not in OPENCLAW_APIS:
            raise ValueError(f"OpenClaw speaks {[s.value for s in OPENCLAW_APIS]}; got {style.value!r}")
        self.api_style = style
        self.local_model_lean = local_model_lean
        self.code_mode = code_mode
        self.context_window = context_window
        self.max_tokens = max_tokens
        self.state_dir = state_dir

    def config(self, ctx: HarnessContext) -> dict[str, Any]:
        api = OPENCLAW_APIS[self.api_style]
        base = ctx.base_url.rstrip("/") + ("" if api == "anthropic-messages" else "/v1")
        config: dict[str, Any] = {
            "agents": {"defaults": {"model": {"primary": f"policy/{ctx.model_name}"}}},
            "models": {
                "mode": "replace",
                "providers": {
                    "policy": {
                        "baseUrl": base,
                        "apiKey": ctx.api_key,
                        "api": api,
                        "timeoutSeconds": max(30, int(ctx.timeout_s)),
                        "models": [
                            {
                                "id": ctx.model_name,
                                "name": ctx.model_name,
                                "reasoning": False,
                                "input": ["text"],
                                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                                "contextWindow": self.context_window,
                                "maxTokens": self.max_tokens,
                            }
                        ],
                    }
                },
            },
        }
        if self.mcp_servers:
            config["mcp"] = {
                "servers": {
                    s.name: {"command": s.command, "args": list(s.args), **({"env": dict(s.env)} if s.env else {})}
                    for s in self.mcp_servers
                }
            }
        return config

    def plan(self, ctx: HarnessContext, home: str) -> LaunchPlan:
        config_path = f"{home}/openclaw.json"
        timeout = max(1, math.floor(self.run_timeout(ctx)) - 2)  # finish (and clean up) before our own kill
        argv = [
            "openclaw", "agent", "exec", "--config", config_path, "--cwd", ctx.sandbox.workspace_path,
            "--model", f"policy/{ctx.model_name}", "--timeout", str(timeout), "--json",
        ]  # fmt: skip
        if self.local_model_lean:
            argv.append("--local-model-lean")
        if self.code_mode:
            argv += ["--code-mode", self.code_mode]
        if self.state_dir:
            argv += ["--state-dir", self.state_dir]
        argv.append(ctx.task.instruction)
        env = {"OPENCLAW_NO_RESPAWN": "1"}
        return LaunchPlan(argv=argv, env=env, cwd=ctx.sandbox.workspace_path, files={config_path: json.dumps(self.config(ctx), indent=1)})

    def parse(self, stdout: str, stderr: str, exit_code: int | None) -> ParsedRun:
        envelope = parse_json_document(stdout)
        if envelope is None:
            tail = (stderr.strip() or stdout.strip())[-400:]
            return ParsedRun(success=False, error=f"OpenClaw printed no JSON envelope: {tail}")
        ok = bool(envelope.get("ok")) and envelope.get("status") == "ok"
        final = envelope.get("final") if isinstance(envelope.get("final"), str) else ""
        turns = int(envelope.get("assistantTurns") or 0)
        error = None
        if not ok:
            err = envelope.get("error")
            message = err.get("message") if isinstance(err, dict) else err
            error = f"OpenClaw {envelope.get('status', 'error')}: {message or 'no message'}"
        return ParsedRun(success=ok and exit_code == 0, final_message=final or "", events=[envelope], turns=turns, error=error)
