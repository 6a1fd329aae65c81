"""Seed a task's workspace on the host: literal files, a copied folder, then a function.

Every path from task data is checked before anything is written (validate first, then write), so a bad
path leaves the destination untouched. Paths may not be absolute, contain `..`, or pass through a symlink;
a copied folder may not contain symlinks that point outside itself.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

from clawgym_env.specs import WorkspaceSpec, check_relative_path


class WorkspacePathError(ValueError):
    """A workspace path from task data would escape the workspace; nothing was written."""


def materialize_workspace(spec: WorkspaceSpec, dest: Path) -> Path:
    """Write `spec` into the folder `dest` (created if missing) and return it."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    files = {_checked(name): data for name, data in spec.files.items()}
    for rel in files:
        _refuse_symlinks_on_the_way(root, rel)
    copies: list[tuple[Path, PurePosixPath]] = []
    if spec.directory is not None:
        copies = _plan_copy(Path(spec.directory))
        for _, rel in copies:
            _refuse_symlinks_on_the_way(root, rel)

    for rel, data in files.items():
        target = root.joinpath(*rel.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            target.write_text(data, encoding="utf-8")
        else:
            target.write_bytes(data)
    for source, rel in copies:
        target = root.joinpath(*rel.parts)
        if source.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(os.readlink(source))
        elif source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    if spec.function is not None:
        spec.function(root)
    return root


def _checked(name: str) -> PurePosixPath:
    try:
        path = check_relative_path(name)
    except ValueError as exc:
        raise WorkspacePathError(str(exc)) from None
    if path == PurePosixPath("."):
        raise WorkspacePathError(f"workspace path {name!r} names the workspace itself, not a file in it")
    return path


def _refuse_symlinks_on_the_way(root: Path, rel: PurePosixPath) -> None:
    """Refuse to write through a symlink that already exists in the destination (it could point anywhere)."""
    current = root
    for part in rel.parts:
        current = current / part
        if current.is_symlink():
            raise WorkspacePathError(
                f"workspace path {str(rel)!r} goes through the existing symlink {current}; "
                "remove the symlink or choose another path"
            )


def _plan_copy(source_root: Path) -> list[tuple[Path, PurePosixPath]]:
    """List (source, relative path) of a folder to copy; refuse symlinks that leave the folder."""
    real_root = source_root.resolve()
    plan: list[tuple[Path, PurePosixPath]] = []
    for dirpath, dirnames, filenames in os.walk(source_root, followlinks=False):
        for name in sorted(dirnames) + sorted(filenames):
            source = Path(dirpath) / name
            rel = PurePosixPath(source.relative_to(source_root).as_posix())
            if source.is_symlink():
                link = os.readlink(source)
                resolved = (source.parent / link).resolve()
                if os.path.isabs(link) or not resolved.is_relative_to(real_root):
                    raise WorkspacePathError(
                        f"workspace folder {source_root} holds the symlink {rel} -> {link}, which points outside "
                        "the folder; replace it with a relative link inside the folder or a copy of its target"
                    )
            plan.append((source, rel))
    return plan
