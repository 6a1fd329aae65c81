"""What every importer returns: a TaskSuite plus a one-by-one report of the task folders it skipped."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, Field

from clawgym_env.specs import TaskSuite


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
