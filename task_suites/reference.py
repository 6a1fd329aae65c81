"""A task's reference solution, for tests and scripted policies.

Every bundled task carries `metadata["reference"]["files"]` (relative path -> content): writing those
files into the seeded workspace solves the task (its verifier gives 1.0). Scripted test policies write
them through a harness's own write tool; tests seed the workspace the way a sandbox does
(`clawgym_env.sandbox.workspace.materialize_workspace`) and write the reference with `apply_reference`.
"""

from __future__ import annotations

from pathlib import Path

from clawgym_env.sandbox.workspace import materialize_workspace
from clawgym_env.specs import TaskSpec, WorkspaceSpec


def reference_files(task: TaskSpec) -> dict[str, str]:
    """The reference solution of a task as {relative path: text}; a clear error if it has none."""
    reference = task.metadata.get("reference") or {}
    files = reference.get("files") if isinstance(reference, dict) else None
    if not isinstance(files, dict) or not files:
        raise ValueError(f"task {task.id} has no metadata['reference']['files'] (no reference solution)")
    return {str(k): str(v) for k, v in files.items()}


def apply_reference(task: TaskSpec, workspace_dir: str | Path) -> list[str]:
    """Write the task's reference files into `workspace_dir` with the sandbox's own seeding (its path and
    symlink checks); returns the paths written."""
    files = reference_files(task)
    materialize_workspace(WorkspaceSpec(files=files), Path(workspace_dir))
    return list(files)
