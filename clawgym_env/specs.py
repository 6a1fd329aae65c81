"""Specs: the pydantic models at the registry boundary.

A task is exactly three things: an instruction, a workspace initializer and a verifier. A harness is
an adapter factory plus the API style it speaks. An environment is a (suite, harness) pair plus options.
Everything else (sandboxes, proxy, trainers) reads these and never needs to change for a new task.
"""

from __future__ import annotations

import enum
import importlib
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from clawgym_env.verifier_api import as_verifier

DEFAULT_MOUNT_PATH = "/root/.openclaw/workspace"
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class ApiStyle(str, enum.Enum):
    """The model API a harness speaks to the serving proxy."""

    ANTHROPIC_MESSAGES = "anthropic-messages"
    OPENAI_CHAT = "openai-chat"
    OPENAI_RESPONSES = "openai-responses"
    IN_PROCESS = "in-process"  # the white-box loop calls the engine directly


class WorkspaceSpec(BaseModel):
    """How a task's workspace is seeded: literal files, a folder to copy, and/or a function.

    All three may be combined; they are applied in that order. Paths are relative to the workspace and
    may not escape it (no absolute paths, no `..`): that is checked here, before anything is written.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    files: dict[str, str | bytes] = Field(default_factory=dict)
    directory: Path | None = None
    function: Callable[[Path], None] | None = None

    @field_validator("files")
    @classmethod
    def _relative_paths_only(cls, files: dict[str, str | bytes]) -> dict[str, str | bytes]:
        for name in files:
            check_relative_path(name)
        return files

    @field_validator("directory")
    @classmethod
    def _directory_exists(cls, directory: Path | None) -> Path | None:
        if directory is not None and not Path(directory).is_dir():
            raise ValueError(f"workspace directory {directory} does not exist or is not a folder")
        return directory

    @classmethod
    def coerce(cls, value: Any) -> WorkspaceSpec:
        """Accept the short forms users write: a dict of files, a folder path, or a function."""
        if value is None:
            return cls()
        if isinstance(value, WorkspaceSpec):
            return value
        if isinstance(value, dict):
            return cls(files=value)
        if isinstance(value, (str, Path)):
            return cls(directory=Path(value))
        if callable(value):
            return cls(function=value)
        raise TypeError(
            "workspace must be a dict of {relative path: str | bytes}, a folder path, a function "
            f"taking the workspace Path, or a WorkspaceSpec; got {type(value).__name__}"
        )


def check_relative_path(name: str) -> PurePosixPath:
    """Reject a workspace path that could escape the workspace (absolute, `..`, empty)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"workspace path {name!r} is empty")
    if "\x00" in name:
        raise ValueError(f"workspace path {name!r} contains a NUL byte")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise ValueError(f"workspace path {name!r} is absolute; use a path relative to the workspace")
    if any(part == ".." for part in path.parts):
        raise ValueError(f"workspace path {name!r} contains '..' and would escape the workspace")
    return path


class TaskSpec(BaseModel):
    """One task instance: instruction + workspace + verifier (plus bookkeeping)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    id: str = Field(min_length=1)
    instruction: str = Field(min_length=1)
    workspace: WorkspaceSpec = Field(default_factory=WorkspaceSpec)
    verifier: Any
    mount_path: str = DEFAULT_MOUNT_PATH
    timeout_s: float = Field(default=600.0, gt=0)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("workspace", mode="before")
    @classmethod
    def _coerce_workspace(cls, value: Any) -> WorkspaceSpec:
        return WorkspaceSpec.coerce(value)

    @field_validator("verifier", mode="before")
    @classmethod
    def _coerce_verifier(cls, value: Any) -> Any:
        return as_verifier(value)

    @field_validator("mount_path")
    @classmethod
    def _absolute_mount(cls, value: str) -> str:
        path = PurePosixPath(value)
        if not path.is_absolute() or ".." in path.parts or str(path) == "/":
            raise ValueError(
                f"mount_path {value!r} must be an absolute path below / without '..' "
                f"(ClawGym tasks use {DEFAULT_MOUNT_PATH})"
            )
        return str(path)


class TaskSuite(BaseModel):
    """A named collection of tasks, split into train and held-out instances.

    `tasks` is a list, or a loader `split -> list[TaskSpec]` (possibly given as an import string
    "module:function" so that registering a suite costs nothing until it is used).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    tasks: list[TaskSpec] | None = None
    loader: Callable[..., list[TaskSpec]] | str | None = None
    splits: tuple[str, ...] = ("train", "test")
    description: str = ""
    _cache: dict[tuple[str, Any], list[TaskSpec]] = {}

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(f"suite name {value!r} must be letters, digits and '_' (no '-'), starting with a letter")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> TaskSuite:
        if (self.tasks is None) == (self.loader is None):
            raise ValueError("a TaskSuite needs exactly one of `tasks` (a list) or `loader` (split -> tasks)")
        self._cache = {}
        return self

    def load(self, split: str = "train", **kwargs: Any) -> list[TaskSpec]:
        """The task instances of one split, loaded once and cached."""
        if split not in self.splits:
            raise ValueError(f"suite {self.name} has no split {split!r}; choose one of {list(self.splits)}")
        key = (split, tuple(sorted(kwargs.items())))
        if key not in self._cache:
            if self.tasks is not None:
                tasks = [t for t in self.tasks if t.metadata.get("split", "train") == split] or (
                    list(self.tasks) if split == "train" else []
                )
            else:
                loader = resolve_callable(self.loader)
                tasks = list(loader(split=split, **kwargs))
            bad = [t for t in tasks if not isinstance(t, TaskSpec)]
            if bad:
                raise TypeError(f"suite {self.name} loader returned {type(bad[0]).__name__}, expected TaskSpec")
            self._cache[key] = tasks
        return self._cache[key]


class HarnessSpec(BaseModel):
    """A harness: a factory for its adapter and the API style it speaks by default."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    adapter: Callable[..., Any] | str  # factory or "module:Class"
    api_style: ApiStyle
    version: str | None = None
    description: str = ""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(f"harness name {value!r} must be letters, digits and '_' (no '-'), starting with a letter")
        return value

    def make_adapter(self, **options: Any) -> Any:
        return resolve_callable(self.adapter)(**options)


class ForestOptions(BaseModel):
    """Switches of the reconstruction filters (see clawgym_env.trajectory)."""

    drop_dead_leaves: bool = True
    set_aside_compaction: bool = True
    set_aside_subagents: bool = True
    keep_subagent_trees: bool = False
    max_leaves: int = Field(default=16, ge=1)
    # a call whose prompt, past the shared system/tools root, is shorter than this
    # fraction of the longest history already in its tree is a context-compaction restart
    compaction_ratio: float = Field(default=0.5, gt=0, le=1)


class EnvOptions(BaseModel):
    """Per-environment options; every one can be overridden in `make(id, **overrides)`."""

    model_config = ConfigDict(extra="forbid")

    split: str = "train"
    suite_kwargs: dict[str, Any] = Field(default_factory=dict)
    backend: str = "local"
    backend_options: dict[str, Any] = Field(default_factory=dict)
    harness_options: dict[str, Any] = Field(default_factory=dict)
    max_calls: int = Field(default=48, ge=1, description="per-rollout cap on model calls (OpenClaw has no loop guard)")
    max_rollout_tokens: int = Field(default=262_144, ge=1, description="per-rollout cap on generated + prompt tokens")
    score_capped: bool = Field(
        default=False,
        description="a rollout the proxy cut off at max_calls / max_rollout_tokens is truncated but still verified "
        "and scored (and trained on), instead of failing; for small policies that loop on tool calls",
    )
    max_new_tokens: int = Field(default=1024, ge=1, description="per-call cap on generated tokens")
    temperature: float = Field(default=1.0, ge=0)
    rollout_timeout_s: float | None = Field(default=None, gt=0, description="overrides the task's own timeout")
    forest: ForestOptions = Field(default_factory=ForestOptions)
    run_dir: Path | None = None
    proxy_shards: int = Field(
        default=1, ge=1, description="proxy processes of this env's own runtime (with run_dir): above 1 a ShardedProxy"
    )
    keep_workspace: bool = False


class EnvSpec(BaseModel):
    """A registered environment: `<Suite>-<Harness>` with its options."""

    model_config = ConfigDict(frozen=True)

    id: str
    suite: str
    harness: str
    options: EnvOptions = Field(default_factory=EnvOptions)

    @model_validator(mode="after")
    def _id_matches(self) -> EnvSpec:
        if self.id != f"{self.suite}-{self.harness}":
            raise ValueError(f"env id {self.id!r} must be '<Suite>-<Harness>' = {self.suite}-{self.harness!s}")
        return self


def resolve_callable(target: Callable[..., Any] | str | None) -> Callable[..., Any]:
    """Turn "package.module:attr" into the object; pass callables through."""
    if target is None:
        raise ValueError("nothing to resolve")
    if callable(target):
        return target
    module_name, _, attr = target.partition(":")
    if not attr:
        raise ValueError(f"import string {target!r} must look like 'package.module:attribute'")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ImportError(f"{module_name} has no attribute {attr!r} (from {target!r})") from exc
