"""The gym-style env without a rollout: spaces, seeded reset, errors, the import guard, the CLI."""

from __future__ import annotations

import asyncio
import gc
import importlib
import os
import re
import subprocess
import sys
import warnings

import pytest

import clawgym_env
from clawgym_env import TaskSpec, TaskSuite
from clawgym_env._import_guard import ShadowedPackageError, check_top_level_packages
from clawgym_env.checker import check_env


@pytest.fixture()
def user_env():
    tasks = [
        TaskSpec(id=f"u{i}", instruction=f"task {i}", verifier=lambda p: 1.0, metadata={"split": "train"})
        for i in range(10)
    ]
    clawgym_env.register(TaskSuite(name="UserApi", tasks=tasks))
    return clawgym_env.make("UserApi-WhiteBox")


def test_make_runs_on_the_runtime_it_is_given(user_env, tmp_path):
    """Environments made with one Runtime share its proxy and sandboxes (a trainer's, an evaluation's); without
    one they use the process-wide default."""
    from clawgym_env.runtime import Runtime

    runtime = Runtime(tmp_path / "run")
    try:
        envs = [clawgym_env.make("UserApi-WhiteBox", runtime=runtime, split="test") for _ in range(2)]
        assert all(env.runtime is runtime for env in envs)
        assert envs[0].options.split == "test"  # the other keywords still override the env's options
        assert user_env.runtime is not runtime
    finally:
        runtime.close()


def test_a_closed_runtime_closes_its_event_loop(tmp_path):
    """Every evaluation makes Runtimes of its own: a closed one leaves no loop for a later test's gc pass."""
    from clawgym_env.runtime import Runtime

    runtime = Runtime(tmp_path / "run")
    assert runtime.run(asyncio.sleep(0, result=7)) == 7
    runtime.close()
    assert runtime.loop.is_closed()
    with pytest.raises(RuntimeError, match="closed"):
        runtime.run(asyncio.sleep(0))
    del runtime
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert not [w for w in caught if "unclosed event loop" in str(w.message)]


def test_reset_is_deterministic_in_the_seed(user_env):
    picks = {user_env.reset(seed=s)[0]["task_id"] for s in range(20)}
    assert len(picks) > 1  # different seeds pick different instances
    assert user_env.reset(seed=3)[0] == user_env.reset(seed=3)[0]
    obs, info = user_env.reset(options={"task_id": "u4"})
    assert obs == {"task_id": "u4", "instruction": "task 4"} and info["task_id"] == "u4"
    assert obs in user_env.observation_space


def test_reset_unknown_task_id(user_env):
    with pytest.raises(KeyError, match="close matches"):
        user_env.reset(options={"task_id": "u44"})


def test_step_requires_reset_and_a_policy(user_env):
    with pytest.raises(RuntimeError, match="reset"):
        user_env.step(object())
    user_env.reset(seed=0)
    with pytest.raises(TypeError, match="Policy"):
        user_env.step("not a policy")


def test_action_space_cannot_be_sampled(user_env):
    with pytest.raises(NotImplementedError, match="Policy") as raised:
        user_env.action_space.sample()
    # the function the message points at exists
    module, name = re.search(r"([\w.]+)\.(\w+)\('tiny-qwen3'\)", str(raised.value)).groups()
    assert callable(getattr(importlib.import_module(module), name))


def test_gymnasium_checks_pass_without_a_step(user_env):
    check_env(user_env)


def test_import_guard_detects_a_shadowing_package(tmp_path, monkeypatch):
    fake = tmp_path / "verifiers"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "verifiers", raising=False)  # find_spec answers from sys.modules first
    with pytest.raises(ShadowedPackageError, match="shadows ours"):
        check_top_level_packages(("verifiers",))


def test_cli_lists_environments():
    out = subprocess.run(
        [sys.executable, "-m", "clawgym_cli", "list", "--json", "--suite", "OfficeQA"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert '"OfficeQA-ClaudeCode"' in out and "JobBench" not in out


def test_cli_tables_keep_their_columns_when_piped():
    """Piped, rich falls back to 80 columns and squashes tables; the CLI's console is wider."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run(
        [sys.executable, "-m", "clawgym_cli", "list", "--suite", "ClawGymBench"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    rows = [line for line in out.splitlines() if "ClawGymBench-" in line]
    styles = [style.value for style in clawgym_env.ApiStyle]
    assert len(rows) == 5 and all(any(style in row for style in styles) for row in rows), out  # no cell wrapped
    assert max(len(line) for line in out.splitlines()) > 80, out


def test_cli_names_a_missing_dependency_and_raises_our_own_import_errors(tmp_path, monkeypatch):
    import typer

    from clawgym_cli.app import load

    (tmp_path / "needs_missing_dep.py").write_text("import clawgym_no_such_dependency_xyz\nrun = 1\n")
    (tmp_path / "broken_import.py").write_text("from clawgym_env.records import NoSuchName\nrun = 1\n")
    (tmp_path / "missing_own_module.py").write_text("import clawgym_env.no_such_module\nrun = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(typer.Exit) as exited:
        load("needs_missing_dep", "run", "a feature")
    assert exited.value.exit_code == 2
    with pytest.raises(ImportError, match="NoSuchName"):  # a bug in our code is shown, not "not available"
        load("broken_import", "run", "a feature")
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        load("missing_own_module", "run", "a feature")
