"""Small MCP servers that harnesses launch inside the rollout's sandbox (stdio transport)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

from harness_adapters.base import McpServer

HERE = Path(__file__).resolve().parent


def sandbox_python_argv() -> list[str]:
    """How to start a Python that has our venv's packages, *inside* the local sandbox.

    The venv's own interpreter may live under /root (pyenv), which is a private tmpfs in the sandbox; so use
    the system python3 (visible read-only) with the venv's site-packages on PYTHONPATH. `env` sets it, since
    some harnesses (OpenClaw) strip interpreter variables from an MCP server's own `env` block.
    """
    from clawgym_env.sandbox.local_backend import default_python

    python = default_python()
    site = sysconfig.get_paths()["purelib"]
    return ["/usr/bin/env", f"PYTHONPATH={site}", python]


def workspace_search_server(root: str | None = None, name: str = "workspace_search") -> McpServer:
    """The workspace-search server as a stdio McpServer, launched inside the sandbox by the harness."""
    argv = [*sandbox_python_argv(), str(HERE / "workspace_search.py")]
    if root:
        argv += ["--root", root]
    return McpServer(name=name, command=argv[0], args=tuple(argv[1:]))


__all__ = ["sandbox_python_argv", "workspace_search_server"]
