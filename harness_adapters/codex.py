"""Codex CLI (`@openai/codex` 0.171.0) headless over the Responses API (the only one it speaks).

    codex exec --skip-git-repo-check --json --dangerously-bypass-approvals-and-sandbox "<instruction>"

with a generated `$CODEX_HOME/config.toml`. Traps (docs/harnesses.md): a catalog model name switches Codex to
a JS "code-mode" tool format unfit for an open-weights policy, so the model name is used as given (keep it
off the catalog); analytics and plugins are off (else it calls out); its own bubblewrap sandbox cannot run
inside ours, so it is bypassed; and CODEX_HOME must not be under /tmp, so it lives in the private HOME.
MCP servers go in `[mcp_servers.<name>]`, marked `required` so Codex waits for each to connect (up to
`startup_timeout_sec`) before its first model call instead of racing it, and fails clearly if one cannot start.
Codex offers an MCP server's tools as one Responses `namespace` tool; the proxy flattens it
(clawgym_env/proxy/apis/openai_responses.py), so the policy calls `mcp__<server>__<tool>`.
"""

from __future__ import annotations

import json
from typing import Any

from clawgym_env.interfaces import HarnessContext
from clawgym_env.specs import ApiStyle
from harness_adapters.base import CliHarnessAdapter, LaunchPlan, ParsedRun, parse_jsonl

KEY_VAR = "CLAWGYM_POLICY_API_KEY"


def toml_str(value: str) -> str:
    """A TOML basic string (JSON string escapes are valid TOML escapes)."""
    return json.dumps(value, ensure_ascii=False)


def toml_list(values: list[str]) -> str:
    return "[" + ", ".join(toml_str(v) for v in values) + "]"


class CodexAdapter(CliHarnessAdapter):
    name = "Codex"
    api_style = ApiStyle.OPENAI_RESPONSES
    binary = "codex"
    package = "@openai/codex"
    pinned_version = "0.171.0"

    def __init__(self, *, reasoning_summary: str | None = None, mcp_startup_timeout_s: int = 60, **kw: Any) -> None:
        super().__init__(**kw)
        self.reasoning_summary = reasoning_summary
        self.mcp_startup_timeout_s = mcp_startup_timeout_s

    def config_toml(self, ctx: HarnessContext) -> str:
        lines = [
            f"model = {toml_str(ctx.model_name)}",
            'model_provider = "policy"',
            "check_for_update_on_startup = false",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[features]",
            "plugins = false",
            "",
            "[model_providers.policy]",
            'name = "policy"',
            f"base_url = {toml_str(ctx.base_url.rstrip('/') + '/v1')}",
            'wire_api = "responses"',
            f"env_key = {toml_str(KEY_VAR)}",
            "request_max_retries = 1",
            "stream_max_retries = 1",
        ]
        for server in self.mcp_servers:
            lines += [
                "",
                f"[mcp_servers.{server.name}]",
                f"command = {toml_str(server.command)}",
                f"args = {toml_list(list(server.args))}",
                "required = true",
                f"startup_timeout_sec = {self.mcp_startup_timeout_s}",
            ]
            if server.env:
                lines.append(
                    "env = { " + ", ".join(f"{toml_str(k)} = {toml_str(v)}" for k, v in server.env.items()) + " }"
                )
        return "\n".join(lines) + "\n"

    def plan(self, ctx: HarnessContext, home: str) -> LaunchPlan:
        codex_home = f"{home}/.codex"  # under the private HOME, never /tmp
        argv = [
            "codex",
            "exec",
            "--skip-git-repo-check",
            "--json",
            "--dangerously-bypass-approvals-and-sandbox",
            "--cd",
            ctx.sandbox.workspace_path,
            ctx.task.instruction,
        ]
        env = {"CODEX_HOME": codex_home, KEY_VAR: ctx.api_key}
        return LaunchPlan(
            argv=argv,
            env=env,
            cwd=ctx.sandbox.workspace_path,
            files={f"{codex_home}/config.toml": self.config_toml(ctx)},
        )

    def parse(self, stdout: str, stderr: str, exit_code: int | None) -> ParsedRun:
        events = parse_jsonl(stdout)
        failed = next((e for e in events if e.get("type") in ("turn.failed", "error")), None)
        completed = any(e.get("type") == "turn.completed" for e in events)
        messages = [
            e["item"].get("text", "")
            for e in events
            if e.get("type") == "item.completed"
            and isinstance(e.get("item"), dict)
            and e["item"].get("type") == "agent_message"
        ]
        # one model call per reasoning/message/command batch is not visible here; count the items that end a turn
        turns = sum(
            1
            for e in events
            if e.get("type") == "item.completed"
            and isinstance(e.get("item"), dict)
            and e["item"].get("type") in ("agent_message", "command_execution", "mcp_tool_call", "file_change")
        )
        final = messages[-1] if messages else ""
        if failed is not None or not completed:
            detail = (
                failed.get("error", failed.get("message"))
                if failed
                else (stderr.strip()[-400:] or "no turn.completed event")
            )
            return ParsedRun(
                success=False, final_message=final, events=events, turns=turns, error=f"Codex turn failed: {detail}"
            )
        return ParsedRun(success=exit_code == 0, final_message=final, events=events, turns=turns)
