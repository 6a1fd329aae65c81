"""Importer for the ClawGym task-folder format.

    <folder>/<task>/data_entry.json   {"task_id", "user_query", "input_mount_dir", "metadata"}
    <folder>/<task>/input_files/      optional: copied into the workspace before the agent starts
    <folder>/<task>/reward/reward.sh  copied to <workspace>/reward/ after the agent ends (replacing
                                      whatever the agent left there), run inside the sandbox; its last
                                      stdout line is the reward (a float in [0, 1])

`metadata.reward_stdin` (a ClawGym extension) names a file of reward/ that is not copied into the
sandbox but given to reward.sh on stdin: private data (expected outputs, hidden test inputs) that the
agent's own program, which the checker may run, cannot read.

`load_clawgym_folder(path)` loads every task folder under `path` (or `path` itself if it is one task),
reporting each broken folder with its reason while the rest still load.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from clawgym_env.specs import DEFAULT_MOUNT_PATH, TaskSpec, WorkspaceSpec
from task_suites.importers.common import ImportedSuite, import_suite
from verifiers.script import ScriptVerifier

DATA_ENTRY = "data_entry.json"


class ClawGymDataEntry(BaseModel):
    """The fields of data_entry.json that ClawGym defines (extra fields are kept in metadata)."""

    task_id: str = Field(min_length=1)
    user_query: str = Field(min_length=1)
    input_mount_dir: str = DEFAULT_MOUNT_PATH
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("task_id", "user_query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("input_mount_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not PurePosixPath(value).is_absolute():
            raise ValueError(f"must be an absolute path such as {DEFAULT_MOUNT_PATH}, got {value!r}")
        return value


def load_clawgym_task(folder: Path, *, default_split: str = "train", reward_timeout_s: float = 300.0) -> TaskSpec:
    """One ClawGym task folder as a TaskSpec; ValueError says what is wrong with the folder."""
    folder = Path(folder)
    entry_path = folder / DATA_ENTRY
    if not entry_path.is_file():
        raise ValueError(f"no {DATA_ENTRY} in the folder")
    try:
        raw = json.loads(entry_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{DATA_ENTRY} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{DATA_ENTRY} must hold a JSON object, got {type(raw).__name__}")
    try:
        entry = ClawGymDataEntry.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{DATA_ENTRY} fields are wrong: {problems}") from None
    reward_dir = folder / "reward"
    if not (reward_dir / "reward.sh").is_file():
        raise ValueError("reward/reward.sh is missing (it computes the reward after the agent ends)")
    inputs = folder / "input_files"
    if inputs.exists() and not inputs.is_dir():
        raise ValueError("input_files exists but is not a folder")
    metadata = dict(entry.metadata)
    metadata.setdefault("split", default_split)
    metadata.setdefault("source", str(folder))
    metadata.setdefault("format", "clawgym")
    extra = {k: v for k, v in raw.items() if k not in ClawGymDataEntry.model_fields}
    if extra:
        metadata.setdefault("data_entry_extra", extra)
    verifier = ScriptVerifier(
        ["bash", "reward/reward.sh"],
        files_dir=reward_dir,
        files_dest="reward",
        stdin_file=metadata.get("reward_stdin"),
        timeout_s=float(metadata.get("reward_timeout_s", reward_timeout_s)),
        name=f"reward.sh[{entry.task_id}]",
    )
    return TaskSpec(
        id=entry.task_id,
        instruction=entry.user_query,
        workspace=WorkspaceSpec(directory=inputs) if inputs.is_dir() else WorkspaceSpec(),
        verifier=verifier,
        mount_path=entry.input_mount_dir,
        timeout_s=float(metadata.get("timeout_s", 600.0)),
        metadata=metadata,
    )


def load_clawgym_folder(
    path: str | Path,
    *,
    name: str | None = None,
    default_split: str = "train",
    reward_timeout_s: float = 300.0,
) -> ImportedSuite:
    """Every ClawGym task under `path` as a suite; broken folders are listed in `suite.problems`."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder of ClawGym tasks")
    folders = (
        [root]
        if (root / DATA_ENTRY).exists()
        else sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    )
    return import_suite(
        root,
        folders,
        lambda folder: load_clawgym_task(folder, default_split=default_split, reward_timeout_s=reward_timeout_s),
        kind="ClawGym",
        name=name,
        empty_hint="no task folders with data_entry.json",
    )
