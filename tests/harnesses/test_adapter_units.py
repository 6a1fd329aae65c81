"""Adapter pieces without a run: install checks, generated configs, and reading each CLI's own events."""

from __future__ import annotations

import json
import tomllib

import pytest

from clawgym_env.interfaces import HarnessContext, HarnessNotInstalled
from harness_adapters.base import McpServer, coerce_mcp_servers, parse_json_document
from harness_adapters.claude_code import ClaudeCodeAdapter
from harness_adapters.codex import CodexAdapter
from harness_adapters.openclaw import OpenClawAdapter
from harness_adapters.pi import PiAdapter
from tests.harnesses.helpers import write_task


class SandboxStub:
    """Only a workspace path: config generation reads nothing else."""

    workspace_path = "/root/.openclaw/workspace"
    proxy_base_url = "http://127.0.0.1:9"


def ctx() -> HarnessContext:
    return HarnessContext(
        sandbox=SandboxStub(),
        task=write_task(),
        base_url="http://127.0.0.1:9/rollouts/r1",
        api_key="sk-test",
        model_name="policy",
        timeout_s=60,
    )  # type: ignore[arg-type]


@pytest.mark.parametrize("adapter", [ClaudeCodeAdapter, OpenClawAdapter, CodexAdapter, PiAdapter])
def test_missing_install_names_the_setup_command(adapter, tmp_path) -> None:
    with pytest.raises(HarnessNotInstalled, match="bash scripts/setup.sh"):
        adapter(install_root=tmp_path).check_installed()


@pytest.mark.parametrize("adapter", [ClaudeCodeAdapter, OpenClawAdapter, CodexAdapter, PiAdapter])
def test_installed_pinned_versions(adapter) -> None:
    a = adapter()
    a.check_installed()
    assert a.version() == a.pinned_version


def test_claude_code_plan_narrows_tools_and_points_every_model_at_the_policy() -> None:
    plan = ClaudeCodeAdapter(tools="Bash,Write", max_retries=2).plan(ctx(), "/root/h")
    assert "--tools=Bash,Write" in plan.argv and plan.argv[-1] == write_task().instruction
    assert plan.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/rollouts/r1"
    assert plan.env["ANTHROPIC_MODEL"] == plan.env["ANTHROPIC_SMALL_FAST_MODEL"] == "policy"
    assert plan.env["CLAUDE_CODE_MAX_RETRIES"] == "2" and plan.env["IS_SANDBOX"] == "1"
    assert plan.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert plan.env["CLAUDE_CODE_DISABLE_AUTO_MEMORY"] == "1"  # its prompt section lured the policy to MEMORY.md


def test_claude_code_waits_for_a_slow_first_token_as_long_as_the_rollout_may_run() -> None:
    """Its client drops a call with no byte for 300 s (a queued 4k-token prefill on a loaded CPU took longer:
    all 8 first calls of a held-out evaluation were dropped at 303 s):
    the client timeouts follow the rollout's limit, never below Claude Code's own floor."""
    slow = HarnessContext(
        sandbox=SandboxStub(),
        task=write_task(),
        base_url="http://127.0.0.1:9/rollouts/r1",
        api_key="sk-test",
        model_name="policy",
        timeout_s=1200,
    )  # type: ignore[arg-type]
    plan = ClaudeCodeAdapter().plan(slow, "/root/h")
    assert plan.env["CLAUDE_STREAM_IDLE_TIMEOUT_MS"] == plan.env["API_TIMEOUT_MS"] == "1200000"
    assert plan.env["API_FORCE_IDLE_TIMEOUT"] == "0"  # Bun's own 300 s fetch timeout off
    assert ClaudeCodeAdapter().plan(ctx(), "/root/h").env["CLAUDE_STREAM_IDLE_TIMEOUT_MS"] == "300000"


def test_codex_config_is_valid_toml_with_mcp_and_no_outbound_features() -> None:
    server = McpServer(name="search", command="/usr/bin/env", args=("A=1", "python3", "s.py"), env={"K": "v"})
    adapter = CodexAdapter(mcp_servers=[server])
    plan = adapter.plan(ctx(), "/root/h")
    config = tomllib.loads(plan.files["/root/h/.codex/config.toml"])
    assert plan.env["CODEX_HOME"] == "/root/h/.codex"  # under the private HOME, never /tmp
    assert config["model"] == "policy" and config["check_for_update_on_startup"] is False
    assert config["analytics"]["enabled"] is False and config["features"]["plugins"] is False
    provider = config["model_providers"]["policy"]
    assert provider["wire_api"] == "responses" and provider["base_url"].endswith("/rollouts/r1/v1")
    assert plan.env[provider["env_key"]] == "sk-test"
    assert config["mcp_servers"]["search"] == {
        "command": "/usr/bin/env",
        "args": ["A=1", "python3", "s.py"],
        "env": {"K": "v"},
        "required": True,
        "startup_timeout_sec": 60,  # Codex waits for the server before its first call
    }


@pytest.mark.parametrize(
    ("style", "api", "suffix"),
    [
        ("openai-responses", "openai-responses", "/v1"),
        ("openai-chat", "openai-completions", "/v1"),
        ("anthropic-messages", "anthropic-messages", "/rollouts/r1"),
    ],
)
def test_openclaw_config_per_api_style(style, api, suffix) -> None:
    plan = OpenClawAdapter(api_style=style).plan(ctx(), "/root/h")
    config = json.loads(plan.files["/root/h/openclaw.json"])
    provider = config["models"]["providers"]["policy"]
    assert provider["api"] == api and provider["baseUrl"].endswith(suffix)
    assert "--model" in plan.argv and plan.argv[plan.argv.index("--model") + 1] == "policy/policy"
    assert int(plan.argv[plan.argv.index("--timeout") + 1]) < 60  # ends before our own kill


def test_pi_models_file_and_refusals() -> None:
    plan = PiAdapter().plan(ctx(), "/root/h")
    models = json.loads(plan.files["/root/h/.pi/agent/models.json"])
    assert models["providers"]["policy"]["api"] == "openai-completions"
    assert plan.env["PI_OFFLINE"] == "1"
    with pytest.raises(ValueError, match="no MCP client"):
        PiAdapter(mcp_servers=[McpServer(name="s", command="x")])
    with pytest.raises(ValueError, match="pi speaks"):
        PiAdapter(api_style="openai-responses")


def test_mcp_server_coercion_errors() -> None:
    with pytest.raises(TypeError, match="'name', 'command'"):
        coerce_mcp_servers([{"command": "x"}])
    with pytest.raises(ValueError, match="unique"):
        coerce_mcp_servers([{"name": "a", "command": "x"}, {"name": "a", "command": "y"}])


# --------------------------------------------------------------------------- success judged from events
def test_pi_exit_zero_with_error_stop_reason_is_a_failure() -> None:
    stdout = "\n".join(
        json.dumps(e)
        for e in [
            {"type": "session"},
            {"type": "agent_start"},
            {
                "type": "agent_end",
                "messages": [
                    {"role": "user", "content": []},
                    {"role": "assistant", "content": [], "stopReason": "error", "errorMessage": "500 engine down"},
                ],
            },
        ]
    )
    parsed = PiAdapter().parse(stdout, "", 0)
    assert not parsed.success and "500 engine down" in parsed.error


def test_claude_code_error_result_is_a_failure() -> None:
    stdout = json.dumps(
        {"type": "result", "subtype": "success", "is_error": True, "result": "API Error: 500", "num_turns": 1}
    )
    parsed = ClaudeCodeAdapter().parse(stdout, "", 1)
    assert not parsed.success and "API Error: 500" in parsed.error
    assert not ClaudeCodeAdapter().parse("", "boom", 1).success


def test_codex_turn_failed_is_a_failure_even_with_exit_zero() -> None:
    stdout = "\n".join(
        json.dumps(e) for e in [{"type": "turn.started"}, {"type": "turn.failed", "error": {"message": "x"}}]
    )
    assert not CodexAdapter().parse(stdout, "", 0).success


def test_openclaw_envelope_parsing() -> None:
    ok = 'log line\n{\n "ok": true, "status": "ok", "final": "done", "assistantTurns": 2\n}\n'
    parsed = OpenClawAdapter().parse(ok, "", 0)
    assert parsed.success and parsed.final_message == "done" and parsed.turns == 2
    bad = json.dumps({"ok": False, "status": "error", "error": {"message": "HTTP 500"}})
    parsed = OpenClawAdapter().parse(bad, "", 1)
    assert not parsed.success and "HTTP 500" in parsed.error
    assert parse_json_document("no json here") is None


def test_one_write_tool_call_per_harness():
    """harness_adapters.tool_calls: each harness's own write tool; the shell form carries any content intact."""
    import base64
    import json
    import re

    from harness_adapters.tool_calls import WRITE_TOOL, write_file_call, write_file_call_for_tools

    def parsed(completion: str) -> dict:
        return json.loads(completion.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))

    for harness, tool in WRITE_TOOL.items():
        assert parsed(write_file_call(harness, "/w/a.txt", "x"))["name"] == tool
    assert parsed(write_file_call_for_tools({"Read", "Write", "Bash"}, "/w/a.txt", "x"))["arguments"] == {
        "file_path": "/w/a.txt",
        "content": "x",
    }
    tricky = 'it\'s $HOME `and` "quotes"\n'
    shell = parsed(write_file_call_for_tools({"exec_command"}, "/w/a.txt", tricky, "/w"))["arguments"]["cmd"]
    assert base64.b64decode(re.search(r"printf '%s' '([A-Za-z0-9+/=]+)'", shell).group(1)).decode() == tricky
    assert parsed(write_file_call_for_tools({"bash"}, "/w/a.txt", "x"))["name"] == "bash"
    with pytest.raises(ValueError, match="no write or shell tool"):
        write_file_call_for_tools({"read"}, "/w/a.txt", "x")
    with pytest.raises(ValueError, match="no known write tool"):
        write_file_call("NoSuchHarness", "/w/a.txt", "x")
