"""Clean up after a crashed run: sandboxes whose owning process is gone (processes, cgroups, mounts, folders)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from clawgym_env.sandbox.cgroups import SandboxCgroup
from clawgym_env.sandbox.host_files import remove_tree, unmount_workspace
from clawgym_env.sandbox.host_setup import default_root


def reap_leftovers(root: Path | str | None = None, *, min_age_s: float = 60.0) -> list[str]:
    """Clean up sandboxes of crashed runs under `root`: kill their processes, remove cgroups and folders.

    A sandbox is a leftover when the process that made it is gone (its pid is dead, or reused by a process
    started later). Folders without a state file are removed once older than `min_age_s` (a crash during
    create). Returns the ids removed.
    """
    root = Path(root or default_root())
    if not root.is_dir():
        return []
    reaped: list[str] = []
    for entry in sorted(root.iterdir()):
        if not entry.is_dir() or not entry.name.startswith("sbx-"):
            continue
        state_file = entry / "sandbox.json"
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            if time.time() - entry.stat().st_mtime > min_age_s:
                unmount_workspace(entry / "workspace")
                remove_tree(entry)
                reaped.append(entry.name)
            continue
        if owner_alive(state):
            continue
        bwrap_pid = state.get("bwrap_pid")
        if bwrap_pid:
            with contextlib.suppress(psutil.Error, OSError):
                proc = psutil.Process(bwrap_pid)
                if proc.create_time() <= float(state.get("created", 0)) + 5:
                    os.killpg(bwrap_pid, signal.SIGKILL)
        for d in state.get("cgroups", []):
            SandboxCgroup(Path(d), Path(d), 1).remove()
        unmount_workspace(entry / "workspace")
        remove_tree(entry)
        reaped.append(entry.name)
    return reaped


def owner_alive(state: Mapping[str, Any]) -> bool:
    try:
        owner = psutil.Process(int(state["owner_pid"]))
        return abs(owner.create_time() - float(state["owner_started"])) < 1.0
    except (psutil.Error, KeyError, ValueError, TypeError):
        return False
