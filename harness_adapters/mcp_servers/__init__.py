"""Small MCP servers that harnesses launch inside the rollout's sandbox (stdio transport)."""

from __future__ import annotations

import sys
from pathlib import Path

from harness_adapters.base import McpServer

HERE = Path(__file__).resolve().parent


def workspace_search_server(root: str | None = None, name: str = "workspace_search") -> McpServer:
    """The workspace search server as a stdio McpServer (the venv's python and this file are visible inside
    the local sandbox: its root is a read-only view of the host)."""
    args = [str(HERE / "workspace_search.py")]
    if root:
        args += ["--root", root]
    return McpServer(name=name, command=sys.executable, args=tuple(args))


__all__ = ["workspace_search_server"]
