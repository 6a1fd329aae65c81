"""RubricVerifier (code criteria + a judge model through the real Qwen tokenizer) and CompositeVerifier."""

import asyncio
import json
from pathlib import Path

import pytest

from clawgym_env.engines import ScriptedTestEngine, load_qwen_tokenizer
from clawgym_env.interfaces import HarnessResult, VerifierResult, VerifyContext
from clawgym_env.specs import TaskSpec
from verifiers import (
    CheckFunctionVerifier,
    CompositeVerifier,
    Criterion,
    FileExists,
    JsonMatches,
    ModelJudge,
    RubricVerifier,
    VerifierConfigError,
)


def run(verifier, ws: Path, message: str = "Wrote the summary."):
    ctx = VerifyContext(
        sandbox=None,
        task=TaskSpec(id="t", instruction="x", verifier=verifier),
        harness_result=HarnessResult(harness="test", final_message=message),
        workspace_dir=ws,
    )
    return asyncio.run(verifier.verify(ctx))


CODE_CRITERIA = [
    Criterion("file_written", weight=1, check=FileExists("summary.json")),
    Criterion("total_right", weight=2, check=JsonMatches("summary.json", {"total": 120})),
    Criterion("mentions_north", weight=1, check=lambda ws: "north" in (ws / "summary.json").read_text().lower()),
]


def write(ws: Path, data) -> Path:
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "summary.json").write_text(data if isinstance(data, str) else json.dumps(data))
    return ws


def test_code_rubric_good_wrong_malformed(tmp_path):
    v = RubricVerifier(CODE_CRITERIA)
    assert run(v, write(tmp_path / "a", {"total": 120, "top": "North"})).reward == 1.0
    wrong = run(v, write(tmp_path / "b", {"total": 99, "top": "North"}))
    assert wrong.reward == pytest.approx(0.5) and wrong.subscores["total_right"] == 0.0
    malformed = run(v, write(tmp_path / "c", "{not json"))
    assert malformed.error is None and malformed.reward == pytest.approx(0.25)  # only "file_written"


def test_judge_criterion_without_judge_is_an_error_not_a_pass(tmp_path):
    criteria = CODE_CRITERIA + [Criterion("tone", question="Is the summary written in a neutral tone?")]
    result = run(RubricVerifier(criteria), write(tmp_path / "a", {"total": 120, "top": "North"}))
    assert result.error is not None and "tone" in result.error and "judge" in result.error
    assert result.reward == 0.0
    assert result.subscores["total_right"] == 1.0  # the code criteria still report


@pytest.fixture(scope="module")
def tokenizer():
    return load_qwen_tokenizer()


def test_model_judge_renders_with_chat_template_and_reads_yes_no(tmp_path, tokenizer):
    engine = ScriptedTestEngine(tokenizer, ["Yes.", "no"])
    judge = ModelJudge(engine, tokenizer)
    criteria = [
        Criterion("has_total", check=JsonMatches("summary.json", {"total": 120})),
        Criterion("neutral", question="Is the summary neutral?", weight=1),
        Criterion("cites_source", question="Does the summary cite its source file?", weight=2),
    ]
    result = run(RubricVerifier(criteria, judge=judge), write(tmp_path / "a", {"total": 120}))
    assert result.error is None
    assert result.subscores == {"has_total": 1.0, "neutral": 1.0, "cites_source": 0.0}
    assert result.reward == pytest.approx(0.5)
    assert engine.calls == 2
    prompt = engine.prompt_texts[0]
    assert prompt.startswith("<|im_start|>system") and prompt.rstrip().endswith("<|im_start|>assistant")
    assert "Is the summary neutral?" in prompt and '"total": 120' in prompt and "Wrote the summary." in prompt


def test_unparseable_judge_answer_is_an_error(tmp_path, tokenizer):
    judge = ModelJudge(ScriptedTestEngine(tokenizer, ["maybe, hard to say"]), tokenizer)
    v = RubricVerifier([Criterion("q", question="Is it good?")], judge=judge)
    result = run(v, write(tmp_path / "a", {"total": 1}))
    assert result.error is not None and "neither yes nor no" in result.error


def test_rubric_config_errors():
    with pytest.raises(VerifierConfigError):
        Criterion("both", check=lambda ws: True, question="q?")
    with pytest.raises(VerifierConfigError):
        RubricVerifier([Criterion("a", check=lambda ws: True), Criterion("a", check=lambda ws: True)])


def test_composite_weights_names_and_error_propagation(tmp_path):
    ws = write(tmp_path / "a", {"total": 120})
    part_a = CheckFunctionVerifier(lambda ws: {"x": 1.0, "y": 0.0}, name="a")
    part_b = RubricVerifier(CODE_CRITERIA)
    comp = CompositeVerifier({"checks": (part_a, 1.0), "rubric": (part_b, 3.0)})
    result = run(comp, ws)
    assert result.error is None
    rubric_reward = 3 / 4  # file + total, not "north"
    assert result.subscores["checks"] == 0.5 and result.subscores["rubric"] == pytest.approx(rubric_reward)
    assert result.subscores["checks/x"] == 1.0 and result.subscores["rubric/mentions_north"] == 0.0
    assert result.reward == pytest.approx((0.5 + 3 * rubric_reward) / 4)

    def broken(ws):
        raise ValueError("checker bug")

    failing = CompositeVerifier({"ok": part_a, "bad": CheckFunctionVerifier(broken)})
    out = run(failing, ws)
    assert out.error is not None and "'bad'" in out.error and "checker bug" in out.error

    class Fixed:
        async def verify(self, ctx):
            return VerifierResult(reward=0.2)

    assert run(CompositeVerifier({"fixed": Fixed()}), ws).reward == pytest.approx(0.2)
    with pytest.raises(VerifierConfigError):
        CompositeVerifier({})
