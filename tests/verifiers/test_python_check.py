import asyncio
import time
from pathlib import Path

from clawgym_env.interfaces import HarnessResult, VerifyContext
from clawgym_env.specs import TaskSpec
from verifiers import CheckFunctionVerifier, python_check


@python_check(weights={"correct": 3})
def check_answer(ws: Path):
    answer = ws / "answer.txt"
    return {"exists": answer.exists(), "correct": answer.exists() and answer.read_text().strip() == "7"}


def run(verifier, ws: Path, message: str = ""):
    ctx = VerifyContext(
        sandbox=None,
        task=TaskSpec(id="t", instruction="x", verifier=verifier),
        harness_result=HarnessResult(harness="test", final_message=message),
        workspace_dir=ws,
    )
    return asyncio.run(verifier.verify(ctx))


def test_good_wrong_and_empty(tmp_path):
    (tmp_path / "answer.txt").write_text("7\n")
    good = run(check_answer, tmp_path)
    assert good.reward == 1.0 and good.subscores == {"exists": 1.0, "correct": 1.0}
    (tmp_path / "answer.txt").write_text("8\n")
    wrong = run(check_answer, tmp_path)
    assert wrong.reward == 0.25 and "correct" in wrong.explanation
    (tmp_path / "answer.txt").unlink()
    assert run(check_answer, tmp_path).reward == 0.0


def test_final_message_argument_and_float_return(tmp_path):
    v = CheckFunctionVerifier(lambda ws, msg: 1.0 if "done" in msg else 0.0, name="said_done")
    assert run(v, tmp_path, "all done").reward == 1.0
    assert run(v, tmp_path, "nope").subscores == {"said_done": 0.0}


def test_crash_bad_value_empty_dict_and_timeout_are_errors(tmp_path):
    def crash(ws):
        raise RuntimeError("bug in checker")

    assert "bug in checker" in run(CheckFunctionVerifier(crash), tmp_path).error
    assert (
        "outside" in run(CheckFunctionVerifier(lambda ws: 1.5), tmp_path).error
        or "[0, 1]" in run(CheckFunctionVerifier(lambda ws: 1.5), tmp_path).error
    )
    assert run(CheckFunctionVerifier(lambda ws: {}), tmp_path).error
    assert run(CheckFunctionVerifier(lambda ws: "yes"), tmp_path).error
    slow = CheckFunctionVerifier(lambda ws: time.sleep(2) or 1.0, timeout_s=0.2)
    assert "timed out" in run(slow, tmp_path).error


def test_decorated_function_stays_callable(tmp_path):
    assert check_answer(tmp_path) == {"exists": False, "correct": False}
