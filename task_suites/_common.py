"""Deterministic generation shared by the bundled suites.

Instances come from one seeded stream per (suite, seed, level); each instance's split is a hash of its
content key, so the train and test splits can never hold the same instance, and the same seed always
gives the same tasks. `count` tasks are drawn per call (round-robin over levels when `level` is None).
"""

from __future__ import annotations

import hashlib
import io
import random
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clawgym_env.specs import TaskSpec, WorkspaceSpec

LEVELS = (0, 1, 2)
SPLITS = ("train", "test")
DEFAULT_COUNT = {"train": 24, "test": 8}
TEST_FRACTION_MOD = 4  # one instance in four (by content hash) is held out


@dataclass
class Draft:
    """One generated instance before it gets its id and split."""

    key: str  # the content that defines the instance (decides its split)
    instruction: str
    workspace: WorkspaceSpec | dict[str, str | bytes] | Callable[..., None]
    verifier: Any
    category: str
    reference: dict[str, str]
    timeout_s: float = 600.0
    extra: dict[str, Any] = field(default_factory=dict)


def split_of(suite: str, key: str) -> str:
    digest = hashlib.sha256(f"{suite}\0{key}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") % TEST_FRACTION_MOD == 0 else "train"


def check_args(suite: str, split: str, level: int | None, count: int | None, levels: tuple[int, ...] = LEVELS) -> None:
    if split not in SPLITS:
        raise ValueError(f"{suite}: unknown split {split!r}; choose one of {list(SPLITS)}")
    if level is not None and level not in levels:
        raise ValueError(f"{suite}: unknown level {level!r}; choose one of {list(levels)} or None for all")
    if count is not None and count < 0:
        raise ValueError(f"{suite}: count must be >= 0, got {count}")


def generate(
    suite: str,
    make: Callable[[random.Random, int], Draft],
    *,
    split: str = "train",
    level: int | None = None,
    seed: int = 0,
    count: int | None = None,
    levels: tuple[int, ...] = LEVELS,
    max_attempts_per_task: int = 200,
) -> list[TaskSpec]:
    """`count` tasks of `split` (all of the suite's `levels` round-robin when `level` is None)."""
    check_args(suite, split, level, count, levels)
    levels = levels if level is None else (level,)
    if count is None:
        count = DEFAULT_COUNT[split] * len(levels)
    per_level = [count // len(levels) + (1 if i < count % len(levels) else 0) for i in range(len(levels))]
    by_level: list[list[TaskSpec]] = []
    for lvl, n in zip(levels, per_level):
        tasks: list[TaskSpec] = []
        seen: set[str] = set()
        attempt = 0
        while len(tasks) < n:
            if attempt > max_attempts_per_task * max(n, 1):
                raise RuntimeError(f"{suite}: could not draw {n} distinct level-{lvl} {split} tasks from seed {seed}")
            rng = random.Random(f"{suite}|{seed}|{lvl}|{attempt}")
            attempt += 1
            draft = make(rng, lvl)
            if draft.key in seen or split_of(suite, draft.key) != split:
                continue
            seen.add(draft.key)
            tasks.append(
                TaskSpec(
                    id=f"{suite}-{split}-L{lvl}-s{seed}-{len(tasks):04d}",
                    instruction=draft.instruction,
                    workspace=draft.workspace,
                    verifier=draft.verifier,
                    timeout_s=draft.timeout_s,
                    metadata={
                        "suite": suite,
                        "split": split,
                        "level": lvl,
                        "category": draft.category,
                        "seed": seed,
                        "instance_key": hashlib.sha256(draft.key.encode()).hexdigest()[:16],
                        "reference": {"files": dict(draft.reference)},
                        **draft.extra,
                    },
                )
            )
        by_level.append(tasks)
    out: list[TaskSpec] = []
    for i in range(max(per_level, default=0)):
        out.extend(tasks[i] for tasks in by_level if i < len(tasks))
    return out


def fixed_zip(data: bytes) -> bytes:
    """Rewrite a zip (xlsx, docx) with fixed timestamps so the same content gives the same bytes."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            fixed = zipfile.ZipInfo(info.filename, date_time=(2024, 1, 1, 0, 0, 0))
            fixed.compress_type = zipfile.ZIP_DEFLATED
            fixed.external_attr = info.external_attr
            content = src.read(info.filename)
            if info.filename == "docProps/core.xml":  # openpyxl stamps the save time into `modified`
                content = re.sub(rb"(<dcterms:(created|modified)[^>]*>)[^<]*", rb"\g<1>2024-01-01T00:00:00Z", content)
            dst.writestr(fixed, content)
    return out.getvalue()
