"""Each harness's "write a file" tool call, as a scripted test engine emits it (Qwen's tool-call format).

Health checks, scripted reference policies, harness tests and benchmarks all need a model turn that makes a
harness write a file with its own tool and its own argument schema; this is the one place that knows them.

    write_file_call("ClaudeCode", "/workspace/answer.txt", "42")   # by harness name
    write_file_call_for_tools({"read", "write"}, path, content)      # recognised from the tools a prompt offers
"""

from __future__ import annotations

import base64
import json
from typing import Any

from clawgym_env.specs import DEFAULT_MOUNT_PATH

WRITE_TOOL = {
    "ClaudeCode": "Write",
    "OpenClaw": "write",
    "Pi": "write",
    "WhiteBox": "write",
    "Codex": "exec_command",
}
"""The tool each built-in harness writes a file with (Codex has no write tool: it runs a shell command)."""

SHELL_TOOLS = ("bash", "Bash", "exec", "shell")
"""Shell tools of other harnesses, used when a prompt offers no write tool."""


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A completion in Qwen's native tool-call format (what the proxy's renderer parses back into a call)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def write_file_call(harness: str, path: str, content: str, workdir: str = DEFAULT_MOUNT_PATH) -> str:
    """The tool call that makes `harness` (a built-in harness name) write `content` to the absolute `path`."""
    if harness not in WRITE_TOOL:
        raise ValueError(f"no known write tool for harness {harness!r}; known: {sorted(WRITE_TOOL)}")
    return _write_with(WRITE_TOOL[harness], path, content, workdir)


def write_file_call_for_tools(tool_names: set[str], path: str, content: str, workdir: str = DEFAULT_MOUNT_PATH) -> str:
    """The same call for whichever harness offers `tool_names` (read from the tool schemas in its prompt).

    Write -> Claude Code, write -> pi / OpenClaw / the white-box loop, exec_command -> Codex, then any shell.
    """
    for tool in ("Write", "write", "exec_command", *SHELL_TOOLS):
        if tool in tool_names:
            return _write_with(tool, path, content, workdir)
    raise ValueError(f"no write or shell tool among the harness's tools {sorted(tool_names)}")


def _write_with(tool: str, path: str, content: str, workdir: str) -> str:
    if tool == "Write":
        return tool_call("Write", {"file_path": path, "content": content})
    if tool == "write":
        return tool_call("write", {"path": path, "content": content})
    # A shell: the content travels base64-encoded, so no quoting of it can break the command.
    encoded = base64.b64encode(content.encode()).decode()
    shell = f"mkdir -p \"$(dirname '{path}')\" && printf '%s' '{encoded}' | base64 -d > '{path}'"
    if tool == "exec_command":
        return tool_call("exec_command", {"cmd": shell, "workdir": workdir})
    return tool_call(tool, {"command": shell})
