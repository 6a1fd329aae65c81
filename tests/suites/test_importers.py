"""Importers on valid and broken task folders, written here in both formats."""

import asyncio
import json
import shutil
import textwrap
from pathlib import Path

import pytest
from host_sandbox_double import HostDirSandboxTestDouble

from clawgym_env.interfaces import HarnessResult, VerifyContext
from clawgym_env.sandbox.workspace import materialize_workspace
from clawgym_env.specs import TaskSuite
from task_suites import apply_reference
from task_suites.importers import load_clawgym_folder, load_pinchbench_folder
from task_suites.importers.__main__ import main as importer_cli

CHECK_PY = """\
import json, pathlib
p = pathlib.Path("greeting.txt")
scores = {"exists": float(p.exists()), "content": float(p.exists() and p.read_text().strip() == "hello clawgym")}
print(json.dumps(scores))
print(sum(scores.values()) / len(scores))
"""
REWARD_SH = '#!/bin/bash\nset -e\ncd "$(dirname "$0")/.."\npython3 reward/check.py\n'


def clawgym_task(root: Path, name: str, entry, *, reward=True, inputs=True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "data_entry.json").write_text(entry if isinstance(entry, str) else json.dumps(entry))
    if inputs:
        (d / "input_files").mkdir()
        (d / "input_files" / "readme.txt").write_text("Write greeting.txt.\n")
    if reward:
        (d / "reward").mkdir()
        (d / "reward" / "reward.sh").write_text(REWARD_SH)
        (d / "reward" / "check.py").write_text(CHECK_PY)
    return d


def entry(task_id: str, **kw):
    return {
        "task_id": task_id,
        "user_query": "Create greeting.txt containing exactly: hello clawgym",
        "input_mount_dir": "/root/.openclaw/workspace",
        "metadata": {"category": "files", "reference": {"files": {"greeting.txt": "hello clawgym\n"}}},
        **kw,
    }


@pytest.fixture
def clawgym_folder(tmp_path):
    root = tmp_path / "clawgym_tasks"
    clawgym_task(root, "t1_ok", entry("greet_1"))
    clawgym_task(root, "t2_ok", entry("greet_2", metadata={"split": "test"}), inputs=False)
    clawgym_task(root, "b1_no_reward", entry("greet_3"), reward=False)
    clawgym_task(root, "b2_bad_json", "{not json")
    clawgym_task(root, "b3_no_query", {"task_id": "x", "input_mount_dir": "/w"})
    clawgym_task(root, "b4_relative_mount", entry("greet_4", input_mount_dir="workspace"))
    clawgym_task(root, "z5_duplicate", entry("greet_1"))
    (root / "b6_empty").mkdir()
    return root


def test_clawgym_folder_loads_valid_and_reports_each_broken(clawgym_folder):
    suite = load_clawgym_folder(clawgym_folder)
    assert isinstance(suite, TaskSuite)
    assert [t.id for t in suite.tasks] == ["greet_1", "greet_2"]
    reasons = {p.path.name: p.reason for p in suite.problems}
    assert set(reasons) == {
        "b1_no_reward",
        "b2_bad_json",
        "b3_no_query",
        "b4_relative_mount",
        "z5_duplicate",
        "b6_empty",
    }
    assert "reward.sh is missing" in reasons["b1_no_reward"]
    assert "not valid JSON" in reasons["b2_bad_json"]
    assert "user_query" in reasons["b3_no_query"]
    assert "absolute" in reasons["b4_relative_mount"]
    assert "already used" in reasons["z5_duplicate"]
    assert "no data_entry.json" in reasons["b6_empty"]
    assert [t.id for t in suite.load("test")] == ["greet_2"]
    assert suite.tasks[0].mount_path == "/root/.openclaw/workspace"
    assert "BROKEN" in suite.report()


async def verify_clawgym(task, ws: Path) -> float:
    sandbox = HostDirSandboxTestDouble(ws, task.mount_path)
    result = await task.verifier.verify(VerifyContext(sandbox=sandbox, task=task))
    assert result.error is None, result.explanation
    return result.reward, result.subscores


async def test_clawgym_task_runs_reward_sh_on_reference_and_empty(clawgym_folder, tmp_path):
    task = load_clawgym_folder(clawgym_folder).tasks[0]
    ws = materialize_workspace(task.workspace, tmp_path / "ws_empty")
    assert (ws / "readme.txt").exists() and not (ws / "reward").exists()  # the checker is not visible up front
    assert (await verify_clawgym(task, ws))[0] == 0.0
    ws2 = materialize_workspace(task.workspace, tmp_path / "ws_ref")
    apply_reference(task, ws2)
    reward, subs = await verify_clawgym(task, ws2)
    assert reward == 1.0 and subs == {"exists": 1.0, "content": 1.0}


def test_clawgym_single_task_folder_and_all_broken(clawgym_folder, tmp_path):
    assert [t.id for t in load_clawgym_folder(clawgym_folder / "t1_ok").tasks] == ["greet_1"]
    only_broken = tmp_path / "broken_only"
    shutil.copytree(clawgym_folder / "b2_bad_json", only_broken / "b2")
    with pytest.raises(ValueError, match="no loadable ClawGym task"):
        load_clawgym_folder(only_broken)
    with pytest.raises(FileNotFoundError):
        load_clawgym_folder(tmp_path / "nope")


def test_importer_command(clawgym_folder, capsys):
    assert importer_cli(["clawgym", str(clawgym_folder), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["tasks"] == ["greet_1", "greet_2"] and len(report["broken"]) == 6


PB_AUTOMATED = """\
---
id: task_90_notes
name: Write notes
category: files
grading_type: automated
timeout_seconds: 90
workspace_files:
  - source: notes_src.txt
    dest: notes.txt
  - path: extra/hint.txt
    content: "uppercase it"
level: 0
reference_files:
  NOTES.md: "ALPHA BETA\\n"
---

## Prompt

Read notes.txt and write its text in upper case to NOTES.md.

## Expected Behavior

The agent reads the file and writes the upper-cased copy.

## Grading Criteria

- [ ] NOTES.md exists
- [ ] Content is upper case

## Automated Checks

```python
def grade(transcript: list, workspace_path: str) -> dict:
    from pathlib import Path
    p = Path(workspace_path) / "NOTES.md"
    used_tool = any(e.get("type") == "message" for e in transcript)
    return {
        "file_created": 1.0 if p.exists() else 0.0,
        "content_upper": 1.0 if p.exists() and p.read_text().strip() == "ALPHA BETA" else 0.0,
    }
```
"""

PB_HYBRID = """\
---
id: task_91_hybrid
name: Hybrid
category: writing
grading_type: hybrid
grading_weights: {automated: 0.6, llm_judge: 0.4}
---

## Prompt

Write a haiku about crabs to haiku.txt.

## Automated Checks

```python
def grade(transcript, workspace_path):
    import os
    return {"file": float(os.path.exists(os.path.join(workspace_path, "haiku.txt")))}
```

## LLM Judge Rubric

### Criterion 1: Form (Weight: 50%)

**Score 1.0**: Three lines, 5-7-5 syllables.

### Criterion 2: Topic (Weight: 50%)

**Score 1.0**: About crabs.
"""

GRADE_OK = "\n## Automated Checks\n\n```python\ndef grade(t, w):\n    return {'a': 1.0}\n```\n"

BROKEN_PB = {
    "no_front_matter.md": "## Prompt\n\nDo it.\n",
    "bad_yaml.md": "---\nid: [unclosed\n---\n\n## Prompt\n\nx\n",
    "no_id.md": "---\nname: x\n---\n\n## Prompt\n\nx\n",
    "no_prompt.md": "---\nid: t_np\n---\n\n## Expected Behavior\n\nx\n",
    "bad_type.md": "---\nid: t_bt\ngrading_type: vibes\n---\n\n## Prompt\n\nx\n",
    "no_code.md": "---\nid: t_nc\ngrading_type: automated\n---\n\n## Prompt\n\nx\n",
    "syntax.md": "---\nid: t_sx\n---\n\n## Prompt\n\nx\n\n## Automated Checks\n\n```python\ndef grade(t, w:\n    return {}\n```\n",
    "no_grade_fn.md": "---\nid: t_nf\n---\n\n## Prompt\n\nx\n\n## Automated Checks\n\n```python\ndef score(t, w):\n    return {}\n```\n",
    "missing_fixture.md": "---\nid: t_mf\nworkspace_files:\n  - source: nowhere.txt\n    dest: a.txt\n---\n\n## Prompt\n\nx\n"
    + GRADE_OK,
    "escaping_dest.md": "---\nid: t_ed\nworkspace_files:\n  - path: ../evil.txt\n    content: x\n---\n\n## Prompt\n\nx\n"
    + GRADE_OK,
    "dup.md": PB_AUTOMATED,
}


@pytest.fixture
def pinch_folder(tmp_path):
    root = tmp_path / "pinch"
    (root / "fixtures").mkdir(parents=True)
    (root / "fixtures" / "notes_src.txt").write_text("alpha beta\n")
    (root / "a_task_90.md").write_text(PB_AUTOMATED)
    (root / "b_task_91.md").write_text(PB_HYBRID)
    (root / "TASK_TEMPLATE.md").write_text("---\nid: template\n---\n")
    for name, text in BROKEN_PB.items():
        (root / f"x_{name}").write_text(text)
    return root


def test_pinchbench_folder_loads_valid_and_reports_each_broken(pinch_folder):
    suite = load_pinchbench_folder(pinch_folder)
    assert [t.id for t in suite.tasks] == ["task_90_notes", "task_91_hybrid"]
    reasons = {p.path.name.removeprefix("x_"): p.reason for p in suite.problems}
    assert set(reasons) == set(BROKEN_PB)
    assert "front matter" in reasons["no_front_matter.md"] and "YAML" in reasons["bad_yaml.md"]
    assert "id" in reasons["no_id.md"] and "Prompt" in reasons["no_prompt.md"]
    assert "vibes" in reasons["bad_type.md"] and "python" in reasons["no_code.md"]
    assert "compile" in reasons["syntax.md"] and "grade" in reasons["no_grade_fn.md"]
    assert "nowhere.txt" in reasons["missing_fixture.md"] and ".." in reasons["escaping_dest.md"]
    assert "already used" in reasons["dup.md"]
    task = suite.tasks[0]
    assert task.timeout_s == 90 and task.metadata["level"] == 0 and task.metadata["category"] == "files"
    assert task.metadata["grading_criteria"] == ["NOTES.md exists", "Content is upper case"]
    assert (
        task.workspace.files["notes.txt"] == b"alpha beta\n"
        and task.workspace.files["extra/hint.txt"] == "uppercase it"
    )


def run_verifier(task, ws, events=()):
    ctx = VerifyContext(
        sandbox=None,
        task=task,
        workspace_dir=ws,
        harness_result=HarnessResult(
            harness="t", events=[{"type": "message", "message": {"role": "assistant"}}, *events]
        ),
    )
    return asyncio.run(task.verifier.verify(ctx))


def test_pinchbench_grade_runs_on_reference_wrong_and_empty(pinch_folder, tmp_path):
    task = load_pinchbench_folder(pinch_folder).tasks[0]
    ws = materialize_workspace(task.workspace, tmp_path / "ws")
    empty = run_verifier(task, ws)
    assert empty.error is None and empty.reward == 0.0
    (ws / "NOTES.md").write_text("alpha beta")
    wrong = run_verifier(task, ws)
    assert wrong.reward == 0.5 and wrong.subscores == {"file_created": 1.0, "content_upper": 0.0}
    apply_reference(task, ws)
    assert run_verifier(task, ws).reward == 1.0


def test_pinchbench_grade_crash_and_bad_scores_are_errors(tmp_path):
    from task_suites.importers import PinchBenchGradeVerifier

    cases = {
        "def grade(t, w):\n    raise KeyError('oops')\n": "oops",
        "def grade(t, w):\n    return {'a': 2}\n": "[0, 1]",
        "def grade(t, w):\n    return []\n": "non-empty dict",
        "def grade(t, w):\n    import time\n    time.sleep(5)\n    return {'a': 1}\n": "timed out",
    }
    for code, needle in cases.items():
        v = PinchBenchGradeVerifier(code, timeout_s=1.0)
        result = asyncio.run(v.verify(VerifyContext(sandbox=None, task=None, workspace_dir=tmp_path)))
        assert result.error is not None and needle in result.error, (code, result.error)


def test_pinchbench_hybrid_without_judge_is_an_error(pinch_folder, tmp_path):
    task = load_pinchbench_folder(pinch_folder).tasks[1]
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "haiku.txt").write_text("crabs\n")
    result = run_verifier(task, ws)
    assert result.error is not None and "judge" in result.error
    assert result.subscores["automated"] == 1.0


def test_pinchbench_hybrid_with_judge(pinch_folder, tmp_path):
    from clawgym_env.engines import ScriptedTestEngine, load_qwen_tokenizer
    from verifiers import ModelJudge

    tok = load_qwen_tokenizer()
    judge = ModelJudge(ScriptedTestEngine(tok, ["yes", "no"]), tok)
    task = load_pinchbench_folder(pinch_folder, judge=judge).tasks[1]
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "haiku.txt").write_text("crabs\n")
    result = run_verifier(task, ws)
    assert result.error is None
    assert result.reward == pytest.approx(0.6 * 1.0 + 0.4 * 0.5)
    assert textwrap.dedent("Write a haiku") in judge.engine.prompt_texts[0]


def pb_task_with_sources(task_id: str, *sources: tuple[str, str]) -> str:
    """A PinchBench task file (real front-matter shape) whose workspace_files copy `(source, dest)` pairs."""
    entries = "".join(f"  - source: {source}\n    dest: {dest}\n" for source, dest in sources)
    return (
        f"---\nid: {task_id}\nname: Assets\ncategory: data\ngrading_type: automated\ntimeout_seconds: 60\n"
        f"workspace_files:\n{entries}---\n\n## Prompt\n\nSummarize the data.\n" + GRADE_OK
    )


@pytest.fixture
def pinch_repo(tmp_path):
    """The published PinchBench layout: `<repo>/tasks/*.md` beside `<repo>/assets/<source>`."""
    repo = tmp_path / "pinchbench"
    (repo / "tasks").mkdir(parents=True)
    (repo / "assets" / "data").mkdir(parents=True)
    (repo / "assets" / "data" / "x.csv").write_text("a,b\n1,2\n")
    (repo / "assets" / "notes.md").write_text("# notes\n")
    (repo / "tasks" / "a_ok.md").write_text(pb_task_with_sources("a_ok", ("data/x.csv", "x.csv")))
    return repo


def broken_reason(tasks: Path) -> str:
    """The one problem reported besides the valid `a_ok` task (a folder with no valid task raises)."""
    suite = load_pinchbench_folder(tasks)
    assert [t.id for t in suite.tasks] == ["a_ok"]
    (problem,) = suite.problems
    return problem.reason


def test_pinchbench_real_layout_reads_sources_from_sibling_assets(pinch_repo):
    (pinch_repo / "tasks" / "task_csv.md").write_text(
        pb_task_with_sources("task_csv", ("data/x.csv", "x.csv"), ("notes.md", "docs/notes.md"))
    )
    suite = load_pinchbench_folder(pinch_repo / "tasks")
    assert suite.problems == [] and [t.id for t in suite.tasks] == ["a_ok", "task_csv"]
    files = suite.tasks[1].workspace.files
    assert files == {"x.csv": b"a,b\n1,2\n", "docs/notes.md": b"# notes\n"}


def test_pinchbench_source_order_fixtures_then_assets_then_folder(pinch_repo):
    tasks = pinch_repo / "tasks"
    (tasks / "fixtures").mkdir()
    (tasks / "fixtures" / "notes.md").write_text("from fixtures\n")
    (tasks / "data").mkdir()
    (tasks / "data" / "x.csv").write_text("from folder\n")
    (tasks / "only_here.txt").write_text("folder only\n")
    (tasks / "t.md").write_text(
        pb_task_with_sources("t_order", ("notes.md", "a"), ("data/x.csv", "b"), ("only_here.txt", "c"))
    )
    files = load_pinchbench_folder(tasks).tasks[1].workspace.files
    assert files == {"a": b"from fixtures\n", "b": b"a,b\n1,2\n", "c": b"folder only\n"}


def test_pinchbench_missing_source_error_lists_every_place(pinch_repo):
    tasks = pinch_repo / "tasks"
    (tasks / "t.md").write_text(pb_task_with_sources("t_missing", ("data/nope.csv", "nope.csv")))
    reason = broken_reason(tasks)
    assert "not found" in reason
    for place in (tasks / "fixtures", pinch_repo / "assets", tasks):
        assert str(place / "data" / "nope.csv") in reason, reason


@pytest.mark.parametrize("link", ["file", "folder"])
def test_pinchbench_source_symlinked_out_of_assets_is_refused(pinch_repo, tmp_path, link):
    secret = tmp_path / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("host secret\n")
    if link == "file":
        (pinch_repo / "assets" / "data" / "leak.csv").symlink_to(secret)
        source = "data/leak.csv"
    else:
        (pinch_repo / "assets" / "ext").symlink_to(secret.parent, target_is_directory=True)
        source = "ext/secret.txt"
    tasks = pinch_repo / "tasks"
    (tasks / "t.md").write_text(pb_task_with_sources("t_leak", (source, "leak.txt")))
    reason = broken_reason(tasks)
    assert "outside" in reason and "refused" in reason and str(pinch_repo / "assets") in reason
    assert "host secret" not in reason


def test_pinchbench_symlink_inside_assets_is_allowed(pinch_repo):
    (pinch_repo / "assets" / "alias.csv").symlink_to(pinch_repo / "assets" / "data" / "x.csv")
    tasks = pinch_repo / "tasks"
    (tasks / "t.md").write_text(pb_task_with_sources("t_alias", ("alias.csv", "x.csv")))
    assert load_pinchbench_folder(tasks).tasks[1].workspace.files == {"x.csv": b"a,b\n1,2\n"}


def test_pinchbench_relative_tasks_folder_finds_sibling_assets(pinch_repo, monkeypatch):
    monkeypatch.chdir(pinch_repo / "tasks")
    assert load_pinchbench_folder(".").tasks[0].workspace.files == {"x.csv": b"a,b\n1,2\n"}
