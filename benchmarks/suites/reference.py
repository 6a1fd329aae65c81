"""Helpers for tests and scripted policies: seed a task's workspace, and write its reference solution.

Every bundled task carries `metadata["reference"]["files"]` (relative path -> content): writing those
files into the seeded workspace solves the task (its verifier gives 1.0). Scripted test policies write
them through a harness's own write tool; tests write them directly with `apply_reference`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from clawgym_env.specs import TaskSpec, check_relative_path


def reference_files(task: TaskSpec) -> dict[str, str]:
    """The reference solution of a task as {relative path: text}; a clear error if it has none."""
    reference = task.metadata.get("reference") or {}
    files = reference.get("files") if isinstance(reference, dict) else None
    if not isinstance(files, dict) or not files:
        raise ValueError(f"task {task.id} has no metadata['reference']['files'] (no reference solution)")
    return {str(k): str(v) for k, v in files.items()}


def write_workspace(task: TaskSpec, dest: str | Path) -> Path:
    """Seed `dest` the way a sandbox would: literal files, then the copied folder, then the function."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    spec = task.workspace
    for name, data in spec.files.items():
        check_relative_path(name)
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
    if spec.directory is not None:
        shutil.copytree(spec.directory, dest, dirs_exist_ok=True, symlinks=True)
    if spec.function is not None:
        spec.function(dest)
    return dest


def apply_reference(task: TaskSpec, workspace_dir: str | Path) -> list[str]:
    """Write the task's reference files into `workspace_dir`; returns the paths written."""
    root = Path(workspace_dir)
    written = []
    for rel, content in reference_files(task).items():
        check_relative_path(rel)
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        written.append(rel)
    return written
