"""What every importer returns: a TaskSuite plus a one-by-one report of the task folders it skipped."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from clawgym_env.specs import TaskSpec, TaskSuite


class BrokenTask(BaseModel):
    """A task that could not be loaded, and why (the rest of the folder still loads)."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


class ImportedSuite(TaskSuite):
    """A `TaskSuite` loaded from a folder; `problems` lists the broken tasks one by one."""

    source: Path | None = None
    problems: list[BrokenTask] = Field(default_factory=list)

    def report(self) -> str:
        loaded = len(self.tasks or [])
        lines = [f"{self.name}: loaded {loaded} task(s) from {self.source}, {len(self.problems)} broken"]
        lines += [f"  BROKEN {p}" for p in self.problems]
        return "\n".join(lines)


def suite_name_for(folder: Path, prefix: str) -> str:
    """A valid suite name (letters, digits, '_') derived from the folder name."""
    stem = re.sub(r"[^A-Za-z0-9_]", "_", Path(folder).resolve().name).strip("_") or "tasks"
    name = f"{prefix}_{stem}"
    return name if name[0].isalpha() else f"S{name}"


def import_suite(
    root: Path,
    sources: Sequence[Path],
    load_one: Callable[[Path], TaskSpec],
    *,
    kind: str,
    name: str | None,
    empty_hint: str,
) -> ImportedSuite:
    """Load each task source with `load_one`; a broken one (any exception) or a repeated id is reported
    in `problems` and the rest still load. Raises only when nothing loads."""
    tasks: list[TaskSpec] = []
    problems: list[BrokenTask] = []
    seen: dict[str, Path] = {}
    for source in sources:
        try:
            task = load_one(source)
        except Exception as exc:  # noqa: BLE001 - reported one by one, never stops the import
            reason = str(exc) if isinstance(exc, (ValueError, OSError)) else f"{type(exc).__name__}: {exc}"
            problems.append(BrokenTask(path=source, reason=reason))
            continue
        if task.id in seen:
            problems.append(BrokenTask(path=source, reason=f"id {task.id!r} already used by {seen[task.id]}"))
            continue
        seen[task.id] = source
        tasks.append(task)
    if not tasks:
        details = "".join(f"\n  {p}" for p in problems) if problems else f" ({empty_hint})"
        raise ValueError(f"no loadable {kind} task under {root}{details}")
    splits = tuple(dict.fromkeys(["train", "test", *(t.metadata["split"] for t in tasks)]))
    return ImportedSuite(
        name=name or suite_name_for(root, kind),
        tasks=tasks,
        splits=splits,
        source=root,
        problems=problems,
        description=f"{kind} tasks imported from {root}",
    )
