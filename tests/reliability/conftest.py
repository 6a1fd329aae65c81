"""Fixtures of the reliability suite: a registered faulty harness, envs on a private run dir and sandbox
root, and the leak check every test ends with (no sandbox folder, no sandbox process left)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import clawgym_env
from clawgym_env import TaskSuite
from clawgym_env.registry import registry
from tests.reliability import doubles


def sandbox_processes(root: Path) -> list[str]:
    """Processes of this machine whose command line names a sandbox folder under `root` (bwrap, init)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(root) in cmdline:
            found.append(f"{pid}: {cmdline[:200]}")
    return found


def assert_no_leaks(root: Path) -> None:
    """Every sandbox was destroyed: its host folder is gone and none of its processes lives on."""
    leftovers = sorted(p.name for p in root.iterdir()) if root.exists() else []
    assert leftovers == [], f"sandbox folders left behind: {leftovers}"
    assert sandbox_processes(root) == [], "sandbox processes left behind"


@pytest.fixture(scope="session", autouse=True)
def registered() -> None:
    """The faulty harness and a small suite, registered the way a user would (`clawgym_env.register`)."""
    if doubles.HARNESS_NAME not in registry.harnesses:
        clawgym_env.register(doubles.harness_spec())
    if doubles.SUITE_NAME not in registry.suites:
        clawgym_env.register(TaskSuite(name=doubles.SUITE_NAME, tasks=[doubles.fault_task("ok", i) for i in range(4)]))


@pytest.fixture
def sandbox_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "sandboxes"
    yield root
    assert_no_leaks(root)


@pytest.fixture
def make_env(tmp_path: Path, sandbox_root: Path) -> Iterator[Any]:
    """`make_env(harness="FaultyHarnessTestDouble", **options)`: an env on its own runtime (run dir, proxy)."""
    envs: list[Any] = []

    def make(harness: str = doubles.HARNESS_NAME, **options: Any) -> Any:
        options.setdefault("run_dir", tmp_path / f"run{len(envs)}")
        options.setdefault("backend_options", {"root": str(sandbox_root)})
        env = clawgym_env.make(f"{doubles.SUITE_NAME}-{harness}", **options)
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()
