"""Sandbox backends: where each rollout's harness runs, isolated and ephemeral.

`make_backend("local")` gives the bubblewrap backend (the default), `make_backend("daytona")` the remote one.
"""

from __future__ import annotations

from typing import Any

from clawgym_env.interfaces import SandboxBackend
from clawgym_env.sandbox.workspace import WorkspacePathError, materialize_workspace

BACKENDS = ("local", "daytona")


def make_backend(name: str, **options: Any) -> SandboxBackend:
    """Build a sandbox backend by name; `options` go to its constructor."""
    if name == "local":
        from clawgym_env.sandbox.local_backend import LocalSandboxBackend

        return LocalSandboxBackend(**options)
    if name == "daytona":
        from clawgym_env.sandbox.daytona import DaytonaSandboxBackend

        return DaytonaSandboxBackend(**options)
    raise ValueError(f"unknown sandbox backend {name!r}; choose one of {list(BACKENDS)}")


__all__ = ["BACKENDS", "WorkspacePathError", "make_backend", "materialize_workspace"]
