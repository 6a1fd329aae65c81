"""Every bundled suite: deterministic, disjoint splits, reference solution scores 1.0, no work scores low."""

import asyncio
import hashlib
import importlib
from pathlib import Path

import pytest
from host_sandbox_double import HostDirSandboxTestDouble

from clawgym_env.builtin import BUILTIN_SUITES
from clawgym_env.interfaces import HarnessResult, VerifyContext
from clawgym_env.sandbox.workspace import materialize_workspace
from clawgym_env.specs import TaskSuite, resolve_callable
from task_suites import apply_reference

SUITE_LOADERS = {name: loader for name, (loader, _) in BUILTIN_SUITES.items()}

SUITES = sorted(SUITE_LOADERS)
EASY = {"OfficeQAEasy", "JobBenchEasy"}
"""Level 0 of a document suite with its input file in the instruction (task_suites.inline)."""


def levels(name: str) -> set[int]:
    return {0} if name in EASY else {0, 1, 2}


def loader(name):
    return resolve_callable(SUITE_LOADERS[name])


def fingerprint(task, with_id: bool = True) -> str:
    """Everything that defines a task; without the id/metadata: what defines the instance itself."""
    h = hashlib.sha256()
    h.update(task.instruction.encode() + repr(sorted(task.metadata["reference"]["files"].items())).encode())
    if with_id:
        h.update(task.id.encode() + repr(sorted(task.metadata.items(), key=str)).encode())
    if task.workspace.directory is not None:
        for p in sorted(Path(task.workspace.directory).rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(task.workspace.directory)).encode() + p.read_bytes())
    for k, v in sorted(task.workspace.files.items()):
        h.update(k.encode() + (v.encode() if isinstance(v, str) else v))
    return h.hexdigest()


def content_key(task) -> str:
    return task.metadata["instance_key"]


async def score(task, ws: Path):
    sandbox = HostDirSandboxTestDouble(ws, task.mount_path)
    ctx = VerifyContext(sandbox=sandbox, task=task, harness_result=HarnessResult(harness="test"), workspace_dir=ws)
    return await task.verifier.verify(ctx)


@pytest.mark.parametrize("name", SUITES)
def test_same_seed_same_tasks_and_splits_disjoint(name):
    load = loader(name)
    a, b = load("train", seed=3, count=9), load("train", seed=3, count=9)
    assert [fingerprint(t) for t in a] == [fingerprint(t) for t in b]
    assert len(a) == 9 and {t.metadata["level"] for t in a} == levels(name)
    other_seed = load("train", seed=4, count=9)
    assert [t.instruction for t in other_seed] != [t.instruction for t in a]
    train, test = load("train", seed=0, count=24), load("test", seed=0, count=12)
    assert {content_key(t) for t in train}.isdisjoint({content_key(t) for t in test})
    assert {fingerprint(t, with_id=False) for t in train}.isdisjoint({fingerprint(t, with_id=False) for t in test})
    assert len({t.id for t in train + test}) == 36
    for t in train + test:
        md = t.metadata
        assert md["split"] in ("train", "test") and md["level"] in levels(name) and md["category"]
        assert md["reference"]["files"] and all(len(c) < 4000 for c in md["reference"]["files"].values())
    assert all(t.metadata["split"] == "test" for t in test)


@pytest.mark.parametrize("name", SUITES)
@pytest.mark.parametrize("split", ["train", "test"])
def test_reference_scores_one_and_no_work_scores_low(name, split, tmp_path):
    tasks = loader(name)(split, seed=1, count=6)
    for i, task in enumerate(tasks):
        seeded = materialize_workspace(task.workspace, tmp_path / f"{i}_seeded")
        idle = asyncio.run(score(task, seeded))
        assert idle.error is None, (task.id, idle.error)
        assert idle.reward < 0.5, (task.id, idle.explanation)
        empty = tmp_path / f"{i}_empty"
        empty.mkdir()
        blank = asyncio.run(score(task, empty))
        assert blank.error is None and blank.reward < 0.5, (task.id, blank.explanation)
        solved = materialize_workspace(task.workspace, tmp_path / f"{i}_ref")
        apply_reference(task, solved)
        result = asyncio.run(score(task, solved))
        assert result.error is None, (task.id, result.error)
        assert result.reward == 1.0, (task.id, result.explanation)
        assert result.subscores and result.explanation


@pytest.mark.parametrize("name", SUITES)
def test_levels_counts_and_bad_arguments(name):
    load = loader(name)
    assert {t.metadata["level"] for t in load("train", level=0, count=4)} == {0}
    assert load("test", level=max(levels(name)), count=0) == []
    with pytest.raises(ValueError, match="split"):
        load("validation")
    with pytest.raises(ValueError, match="level"):
        load("train", level=7)


@pytest.mark.parametrize("name", SUITES)
def test_registered_as_lead_does(name):
    suite = TaskSuite(name=name, loader=SUITE_LOADERS[name])
    tasks = suite.load("test", count=3)
    assert len(tasks) == 3 and all(t.metadata["split"] == "test" for t in tasks)


def test_level0_is_one_small_file_and_a_short_instruction():
    for name in set(SUITES) - set(EASY):
        for task in loader(name)("train", level=0, count=4):
            files = task.workspace.files or {}
            if task.workspace.directory is not None:
                files = {p: 1 for p in Path(task.workspace.directory).rglob("*") if p.is_file()}
            assert len(files) <= 1, (task.id, list(files))
            assert len(task.instruction) < 400, task.id


def test_suite_modules_expose_load():
    for name in SUITES:
        module = importlib.import_module(SUITE_LOADERS[name].split(":")[0])
        assert callable(module.load)


@pytest.mark.parametrize(
    ("name", "file_criterion"),
    [
        ("ClawGymBench", "exists"),
        ("OfficeQA", "exists"),
        ("JobBench", "answer_written"),
        ("OfficeQAEasy", "exists"),
        ("JobBenchEasy", "answer_written"),
    ],
)
def test_level0_gives_half_credit_for_the_right_file(name, file_criterion, tmp_path):
    """The asked-for file with the wrong content scores 0.5: GRPO gets a signal before the content is right."""
    for i, task in enumerate(loader(name)("train", level=0, count=8)):
        assert "write tool" in task.instruction, task.instruction
        ws = materialize_workspace(task.workspace, tmp_path / f"{i}_wrong")
        for rel in task.metadata["reference"]["files"]:
            (ws / rel).write_text("not the answer\n")
        result = asyncio.run(score(task, ws))
        assert result.error is None and result.reward == 0.5, (task.id, result.explanation)
        assert file_criterion in result.subscores, result.subscores


@pytest.mark.parametrize("name", sorted(EASY))
def test_easy_suite_is_level0_with_its_file_in_the_instruction(name):
    """An Easy task has an empty workspace and every input file quoted before level 0's question (the
    instruction's end is the level-0 draft's: tests/suites/test_inline.py); the quote holds the fact."""
    for task in loader(name)("test", count=8):
        assert not task.workspace.files and task.workspace.directory is None, task.id
        quoted, question = task.instruction.rsplit("```\n\n", 1)
        assert quoted.startswith("Content of ") and "write tool" in question, task.instruction
        answer = task.metadata["reference"]["files"]["answer.txt"].strip()
        if task.metadata["category"] in ("lookup", "images", "documents"):  # read off the file, not computed
            assert answer in quoted.replace(",", "") or answer in quoted, (task.id, answer)


def test_reference_is_written_with_the_sandbox_seeding_checks(tmp_path):
    """apply_reference goes through materialize_workspace: a symlink in the workspace cannot redirect it."""
    from clawgym_env.sandbox.workspace import WorkspacePathError

    task = loader("ClawGymBench")("train", level=0, count=1)[0]
    workspace = materialize_workspace(task.workspace, tmp_path / "ws")
    outside = tmp_path / "outside"
    outside.mkdir()
    rel = next(iter(task.metadata["reference"]["files"]))
    target = workspace / rel
    if target.exists():
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(outside / "stolen.txt")  # the policy left a symlink where the answer goes
    with pytest.raises(WorkspacePathError):
        apply_reference(task, workspace)
    assert not (outside / "stolen.txt").exists()
