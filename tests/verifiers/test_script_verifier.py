"""ScriptVerifier on the HostDirSandboxTestDouble (the real bubblewrap sandbox: test_script_verifier_bwrap.py)."""

from pathlib import Path

import pytest
from host_sandbox_double import HostDirSandboxTestDouble

from clawgym_env.interfaces import VerifyContext
from clawgym_env.specs import TaskSpec
from verifiers import ScriptVerifier, parse_reward_output

CHECK_PY = """
import json, pathlib
ans = pathlib.Path("answer.txt")
scores = {"exists": float(ans.exists()), "correct": float(ans.exists() and ans.read_text().strip() == "42")}
print(json.dumps(scores))
print(sum(scores.values()) / len(scores))
"""


async def run(verifier, root: Path):
    sandbox = HostDirSandboxTestDouble(root)
    task = TaskSpec(id="t", instruction="x", verifier=verifier)
    return await verifier.verify(VerifyContext(sandbox=sandbox, task=task)), sandbox


def reward_dir(tmp_path: Path) -> Path:
    d = tmp_path / "reward_src"
    d.mkdir()
    (d / "check.py").write_text(CHECK_PY)
    (d / "reward.sh").write_text('#!/bin/bash\nset -e\ncd "$(dirname "$0")/.."\npython3 reward/check.py\n')
    return d


async def test_good_workspace_scores_one_with_subscores(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "answer.txt").write_text("42\n")
    v = ScriptVerifier(["bash", "reward/reward.sh"], files_dir=reward_dir(tmp_path), files_dest="reward")
    result, sandbox = await run(v, ws)
    assert result.error is None, result.explanation
    assert result.reward == 1.0
    assert result.subscores == {"exists": 1.0, "correct": 1.0}
    assert (ws / "reward" / "check.py").exists()  # copied in only at verification time


async def test_wrong_workspace_scores_partial(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "answer.txt").write_text("41\n")
    v = ScriptVerifier(["bash", "reward/reward.sh"], files_dir=reward_dir(tmp_path), files_dest="reward")
    result, _ = await run(v, ws)
    assert result.error is None and result.reward == 0.5 and result.subscores["correct"] == 0.0


async def test_empty_workspace_scores_zero_not_error(tmp_path):
    v = ScriptVerifier(["bash", "reward/reward.sh"], files_dir=reward_dir(tmp_path), files_dest="reward")
    result, _ = await run(v, tmp_path / "ws")
    assert result.error is None and result.reward == 0.0


@pytest.mark.parametrize(
    ("script", "needle"),
    [
        ("echo hello", "not a float"),
        ("echo 1.5", "outside [0, 1]"),
        ("echo nan", "outside [0, 1]"),
        ("true", "printed nothing"),
        ("echo 0.7; exit 3", "exited with 3"),
        ("echo boom >&2; exit 1", "boom"),
    ],
)
async def test_malformed_output_is_a_verifier_error(tmp_path, script, needle):
    result, _ = await run(ScriptVerifier(script), tmp_path / "ws")
    assert result.error is not None and needle in result.error
    assert result.reward == 0.0


async def test_timeout_is_reported(tmp_path):
    result, _ = await run(ScriptVerifier("sleep 5; echo 1", timeout_s=0.5), tmp_path / "ws")
    assert result.error is not None and "timed out" in result.error


async def test_last_line_wins_and_trailing_blank_lines_are_ignored(tmp_path):
    result, _ = await run(ScriptVerifier("echo 0.2; echo; echo 0.75; echo"), tmp_path / "ws")
    assert result.error is None and result.reward == 0.75


async def test_inline_files_and_env(tmp_path):
    v = ScriptVerifier(
        "python3 .grader/g.py", files={".grader/g.py": "import os\nprint(os.environ['LEVEL'])\n"}, env={"LEVEL": "0.25"}
    )
    result, _ = await run(v, tmp_path / "ws")
    assert result.reward == 0.25


def test_parse_reward_output_rejects_junk():
    assert parse_reward_output('{"a": 1}\n0.5\n') == (0.5, {"a": 1.0})
    with pytest.raises(ValueError):
        parse_reward_output("0.5 done")


def test_bad_configuration_is_refused(tmp_path):
    from verifiers import VerifierConfigError

    with pytest.raises(VerifierConfigError):
        ScriptVerifier("")
    with pytest.raises(VerifierConfigError):
        ScriptVerifier("true", files_dir=tmp_path / "missing")
