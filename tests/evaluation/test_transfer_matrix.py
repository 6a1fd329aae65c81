"""The transfer matrix: its cells (paired gains with intervals from the evidence rows, mixed vs single at
equal budget), and its --quick form end to end (tiny random model, real trainers, real harness CLIs): table,
JSON, plot and evidence file, and a rerun that trains and evaluates nothing again."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.transfer_matrix import (
    ARMS,
    DEFAULT_EVAL_HARNESSES,
    EXTRA_GROUPS,
    GROUPS_PER_STEP,
    UNTRAINED,
    Cell,
    MatrixReport,
    MatrixSettings,
    SeedResult,
    aggregate,
    arm_overrides,
    evaluation_env_overrides,
    main,
    mixed_vs_single,
)
from evaluation.evidence import EvidenceRow, read_rows, write_rows
from trainers.main import compose


def seeds(*rewards: float) -> list[SeedResult]:
    return [SeedResult(seed=i, reward=r, rollouts=2, failed=0, results="-") for i, r in enumerate(rewards)]


def evidence(arm: str, harness: str, before: list[list[float]], after: list[list[float]]) -> list[EvidenceRow]:
    """Rows of 4 tasks per seed: task t of seed s scores before[s][t] untrained and after[s][t] trained."""
    rows = []
    for phase, name, table in (("before", UNTRAINED, before), ("after", arm, after)):
        for s, values in enumerate(table):
            for t, reward in enumerate(values):
                rows.append(
                    EvidenceRow(
                        experiment="m",
                        arm=name,
                        phase=phase,
                        seed=s,
                        eval_harness=harness,
                        suite="ClawGymBench",
                        task_id=f"t{t}",
                        reward=reward,
                    )
                )
    return rows


def test_a_cell_is_the_paired_gain_with_its_interval() -> None:
    before = [[0.0, 0.5, 0.0, 0.5], [0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 0.0, 0.0]]
    after = [[1.0, 1.0, 0.5, 1.0], [1.0, 0.5, 1.0, 1.0], [0.5, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.5]]
    rows = evidence("Pi", "Pi", before, after)
    cell = Cell(arm="Pi", harness="Pi", before=seeds(*np.mean(before, 1)), after=seeds(*np.mean(after, 1)))
    cell = aggregate(cell, rows, comparisons=6)
    assert cell.before_mean == pytest.approx(0.25) and cell.after_mean == pytest.approx(0.875)
    assert cell.gain.value == pytest.approx(0.625) and cell.gain.seeds == 4 and cell.gain.comparisons == 6
    assert cell.gain.shown and cell.gain.holds_after and cell.gain.low > 0.3
    assert cell.text().startswith("0.250→0.875 (+0.625 [") and "shown, n=4" in cell.text()
    flat = aggregate(Cell(arm="Pi", harness="Pi", before=seeds(0.25), after=seeds(0.3)), rows[:4] + rows[16:20], 1)
    assert flat.gain.seeds == 1
    assert aggregate(Cell(arm="Pi", harness="Pi", before=seeds(0.1)), rows, 1).text() == "to run"
    # the trained policy measured but not its untrained pair (another session's cache): said so, not "to run"
    unpaired = aggregate(Cell(arm="Pi", harness="Pi", after=seeds(0.5, 0.75)), rows, 1)
    assert unpaired.gain is None and unpaired.text() == "after 0.625 (n=2); untrained to run"


def test_mixed_against_single_is_a_paired_difference() -> None:
    before = [[0.0, 0.5, 0.0, 0.5]] * 4
    rows = evidence("ClaudeCode", "ClaudeCode", before, [[1.0, 1.0, 0.5, 1.0]] * 4)
    rows += [
        r
        for r in evidence("OpenClaw+ClaudeCode", "ClaudeCode", before, [[0.0, 0.5, 0.0, 0.5]] * 4)
        if r.phase == "after"
    ]
    cells = {
        arm: {
            "ClaudeCode": aggregate(
                Cell(arm=arm, harness="ClaudeCode", before=seeds(0.25) * 4, after=seeds(0.5) * 4), rows, 1
            )
        }
        for arm in ("ClaudeCode", "OpenClaw+ClaudeCode")
    }
    out = mixed_vs_single(cells, rows, 1)
    d = out["OpenClaw+ClaudeCode"]["ClaudeCode"]
    assert d.value == pytest.approx(-0.625) and d.shown  # the mixed arm gained nothing, the single one +0.625
    assert "OpenClaw" not in out["OpenClaw+ClaudeCode"]  # no single-harness OpenClaw arm measured


def test_each_arm_trains_through_its_harnesses_on_an_equal_budget(tmp_path: Path) -> None:
    defaults = MatrixSettings()  # the article's arms and harnesses, 4 seeds, PinchBench as the unseen suite
    assert defaults.arms == ["WhiteBox", "OpenClaw", "ClaudeCode", "OpenClaw+ClaudeCode"]
    assert defaults.eval_harnesses == DEFAULT_EVAL_HARNESSES == ["WhiteBox", "OpenClaw", "ClaudeCode"]
    assert defaults.seeds == [0, 1, 2, 3] and defaults.transfer_suites == ["PinchBench"]
    for arm, harnesses in ARMS.items():
        cfg = compose(arm_overrides(arm, 3, tmp_path / arm, MatrixSettings()))
        assert cfg.env.ids == [f"ClawGymBench-{h}" for h in harnesses], arm
        assert cfg.env.tasks_per_step * len(cfg.env.ids) == GROUPS_PER_STEP and cfg.env.group_size == 8, arm
        assert cfg.seed == 3 and cfg.env.suite_seed == 0  # one set of held-out tasks for every seed
        assert cfg.env.eval_tasks * cfg.eval.repeats == 64  # held-out rollouts per evaluation
        assert "qwen2.5-coder-0.5b" in cfg.model.name and cfg.model.lora.enabled  # the learning test's recipe
        assert cfg.checkpoint.resume == "auto" and cfg.checkpoint.every == 1 and not cfg.eval.at_start
        assert cfg.algorithm.name == ("ppo" if arm.endswith("-PPO") else "grpo"), arm
        assert cfg.env.extra_groups == (EXTRA_GROUPS if arm.endswith("-DS") else 0), arm  # dynamic sampling
        # OpenClaw speaks the chat API where it trains and in its evaluation column, whatever the arm; the configs
        # of arms without OpenClaw stay as they were (their finished runs and evaluations are reused)
        assert cfg.env.harness_options == ({"OpenClaw": {"api_style": "openai-chat"}} if "OpenClaw" in arm else {})
        chat = evaluation_env_overrides(cfg, "PinchBench-OpenClaw", {})["harness_options"]
        assert chat == {"api_style": "openai-chat"} and evaluation_env_overrides(cfg, "PinchBench-Pi", {}) == {}
    for arm in ("WhiteBox", "ClaudeCode"):  # `--suite`: every arm trains on that suite instead
        other = MatrixSettings(suite="OfficeQAEasy")
        assert compose(arm_overrides(arm, 0, tmp_path / "o", other)).env.ids == [f"OfficeQAEasy-{arm}"]
        assert other.experiment == "transfer_matrix_OfficeQAEasy" and defaults.experiment == "transfer_matrix"
    with pytest.raises(ValueError, match="unknown suite 'OfficeQA-Easy'; registered suites: .*OfficeQAEasy"):
        main(["--suite", "OfficeQA-Easy", "--out", str(tmp_path / "bad"), "--plan"])
    custom = compose(
        arm_overrides(
            "OpenClaw",
            0,
            tmp_path / "x",
            MatrixSettings(overrides=["++env.harness_options.OpenClaw.api_style=openai-responses"]),
        )
    )
    assert custom.env.harness_options == {"OpenClaw": {"api_style": "openai-responses"}}  # the user's override wins
    custom_eval = evaluation_env_overrides(custom, "ClawGymBench-OpenClaw", {})["harness_options"]
    assert custom_eval == {"api_style": "openai-responses"}


def test_an_unfinished_run_started_with_another_recipe_is_not_continued(tmp_path: Path) -> None:
    from benchmarks.transfer_matrix import train_arm

    run_dir = tmp_path / "train" / "openclaw-seed0"
    older = MatrixSettings(overrides=["++env.harness_options.OpenClaw.api_style=openai-responses"])
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(
        compose(arm_overrides("OpenClaw", 0, run_dir, older, training=True)).model_dump_json()
    )
    with pytest.raises(RuntimeError, match="another config"):
        train_arm("OpenClaw", 0, tmp_path, MatrixSettings())
    assert not (run_dir / "checkpoints").exists()  # refused before anything was trained


def trained_rows(rows: list[EvidenceRow]) -> list[EvidenceRow]:
    return [r for r in rows if r.phase == "train"]


def means(report: MatrixReport) -> dict[str, dict[str, tuple]]:
    return {
        a: {h: (c.before_mean, c.after_mean, c.gain.value if c.gain else None, c.seeds) for h, c in row.items()}
        for a, row in report.cells.items()
    }


@pytest.mark.harness
@pytest.mark.timeout(600)  # 2 seeds x 2 arms through OpenClaw and Claude Code: 273-283 s measured on an idle machine
def test_quick_matrix_writes_table_json_plot_evidence_and_a_rerun_skips_finished_cells(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arms, harnesses = ["WhiteBox", "OpenClaw+ClaudeCode"], ["WhiteBox", "OpenClaw"]
    argv = [
        "--quick",
        "--out",
        str(tmp_path / "m"),
        "--arms",
        *arms,
        "--seeds",
        "0",
        "1",
        "--eval-harnesses",
        *harnesses,
    ]
    first = main([*argv, "--publish", str(tmp_path / "published")])
    out = tmp_path / "m"
    assert list(first.cells) == [UNTRAINED, *arms]
    for row in first.cells.values():
        assert list(row) == harnesses
        for cell in row.values():
            assert cell.seeds == 2 and cell.before_mean is not None
            assert all(r.rollouts == 1 for r in cell.before + cell.after)
    for arm in arms:
        assert all(cell.gain is not None and cell.gain.seeds == 2 for cell in first.cells[arm].values())
    assert first.comparisons == len(arms) * len(harnesses)
    assert sorted((r.arm, r.seed, r.trained_now) for r in first.training) == sorted(
        (a, s, True) for a in arms for s in (0, 1)
    )
    # the untrained policy is measured once per seed, suite and harness, then reused by every arm's "before";
    # every policy is evaluated on the training suite and on PinchBench, which no arm trains on
    n_evals = 2 * len(harnesses) * (1 + len(arms)) * 2
    assert first.evaluations_measured == n_evals and first.evaluations_reused == 0

    # every rollout is a row: one per evaluation (quick: 1 task x 1 repeat) and each training rollout
    rows = read_rows(out / "evidence.jsonl.gz")
    assert read_rows(tmp_path / "published" / "transfer_matrix.jsonl.gz") == rows
    evaluated = [r for r in rows if r.phase != "train"]
    assert len(evaluated) == n_evals
    assert all(r.evaluation and r.draw == 0 for r in evaluated)  # each says which measurement it is a draw of
    assert {(r.arm, r.phase) for r in evaluated} == {(UNTRAINED, "before"), *((a, "after") for a in arms)}
    assert {r.suite for r in evaluated} == {"ClawGymBench", "PinchBench"}
    assert {r.suite for r in trained_rows(rows)} == {"ClawGymBench"}
    assert all(
        r.checkpoint == f"train/{r.arm.lower().replace('+', '-')}-seed{r.seed}/checkpoints/latest.pt"
        for r in evaluated
        if r.phase == "after"
    )
    trained = trained_rows(rows)
    mixed = [r for r in trained if r.arm == "OpenClaw+ClaudeCode"]
    white = [r for r in trained if r.arm == "WhiteBox"]
    assert {r.eval_harness for r in mixed} == {"OpenClaw", "ClaudeCode"} and {r.step for r in trained} == {1}
    assert len(mixed) == len(white) > 0  # equal training budgets
    assert all(r.commit != "unknown" for r in rows)
    cell = first.cells["WhiteBox"]["WhiteBox"]
    recomputed = np.mean(
        [r.reward for r in evaluated if (r.arm, r.eval_harness, r.suite) == ("WhiteBox", "WhiteBox", "ClawGymBench")]
    )
    assert cell.after_mean == pytest.approx(recomputed)  # the table is what the rows say

    saved = MatrixReport.model_validate_json((out / "matrix.json").read_text())
    assert saved.cells == first.cells
    text = (out / "matrix.txt").read_text()
    assert all(f"evaluated in {h}" in text for h in harnesses) and "→" in text and "n=2" in text
    assert "vs" not in text.split("comparisons)")[-1]  # no single-harness OpenClaw or Claude Code arm here
    assert (out / "matrix.png").stat().st_size > 5000
    config = json.loads((out / "train" / "openclaw-claudecode-seed0" / "config.json").read_text())
    assert config["env"]["ids"] == ["ClawGymBench-OpenClaw", "ClawGymBench-ClaudeCode"]

    start = time.perf_counter()
    again = main([*argv, "--publish", str(tmp_path / "published")])
    assert not any(r.trained_now for r in again.training) and again.evaluations_measured == 0
    assert again.evaluations_reused == first.evaluations_measured and means(again) == means(first)
    assert read_rows(out / "evidence.jsonl.gz") == rows
    assert read_rows(tmp_path / "published" / "transfer_matrix.jsonl.gz") == rows  # the same draws: no new ones
    assert time.perf_counter() - start < 60  # nothing trained or rolled out (training alone took minutes)

    # an unfinished run (no summary yet): --plan reads its training rows so far, evaluates nothing
    unfinished = [r.model_copy(update={"arm": "Pi", "eval_harness": "Pi"}) for r in white]
    write_rows(out / "train" / "pi-seed0" / "rollouts.jsonl", unfinished)
    plan = main(
        ["--quick", "--out", str(out), "--plan", "--seeds", "0", "1", "--arms", *ARMS, "--eval-harnesses", *harnesses]
    )
    assert [r for r in read_rows(out / "evidence.jsonl.gz") if r.arm == "Pi"] == unfinished
    assert list(plan.cells) == [UNTRAINED, *ARMS]
    assert {a: row for a, row in means(plan).items() if a in first.cells} == means(first)
    assert plan.cells["Pi"]["WhiteBox"].text() == "to run" and plan.cells["ClaudeCode"]["WhiteBox"].text() == "to run"
    assert plan.evaluations_reused > 0 and "exactly as the run did" not in capsys.readouterr().out
    # a plan with other overrides than the run's (here the evaluation temperature) finds nothing and says why
    plan_argv = ["--quick", "--out", str(out), "--plan", "--seeds", "0", "--eval-harnesses", *harnesses]
    other = main([*plan_argv, "--", "eval.temperature=0.5"])
    assert other.evaluations_reused == 0 and "exactly as the run did" in capsys.readouterr().out

    # --skip-untrained: a trained policy evaluated anew (another output folder, same training runs) pairs with
    # the untrained rows already published; no untrained evaluation runs, and the published ones stay
    second = tmp_path / "m2"
    shutil.copytree(out / "train", second / "train")
    published = tmp_path / "published" / "transfer_matrix.jsonl.gz"
    before = [r for r in read_rows(published) if r.phase == "before"]
    only = ["--quick", "--out", str(second), "--arms", "WhiteBox", "--seeds", "0", "--eval-harnesses", "WhiteBox"]
    skipped = main([*only, "--transfer-suites", "--skip-untrained", "--publish", str(tmp_path / "published")])
    assert skipped.evaluations_measured == 1 and not any(r.trained_now for r in skipped.training)
    assert not [r for r in read_rows(second / "evidence.jsonl.gz") if r.phase == "before"]
    assert [r for r in read_rows(published) if r.phase == "before"] == before
    new_after = [r for r in read_rows(second / "evidence.jsonl.gz") if r.phase == "after"]
    assert len(new_after) == 1 and new_after[0] in read_rows(published)


@pytest.mark.timeout(300)
def test_quick_matrix_on_another_suite_trains_and_evaluates_there(tmp_path: Path) -> None:
    """`--suite OfficeQAEasy`: training and the held-out evaluation use that suite, the evidence names it, and
    it is published to its own file (the ClawGymBench matrix's stays untouched)."""
    argv = ["--quick", "--suite", "OfficeQAEasy", "--out", str(tmp_path / "m"), "--arms", "WhiteBox", "--seeds", "0"]
    report = main([*argv, "--eval-harnesses", "WhiteBox", "--transfer-suites", "--publish", str(tmp_path / "pub")])
    assert report.evaluations_measured == 2 and report.cells["WhiteBox"]["WhiteBox"].gain is not None
    rows = read_rows(tmp_path / "pub" / "transfer_matrix_OfficeQAEasy.jsonl.gz")
    assert not (tmp_path / "pub" / "transfer_matrix.jsonl.gz").exists()
    assert {r.suite for r in rows} == {"OfficeQAEasy"} and {r.experiment for r in rows} == {report.settings.experiment}
    assert {r.phase for r in rows} == {"train", "before", "after"}
    assert all(r.task_id.startswith("OfficeQAEasy-") for r in rows)
    assert "OfficeQAEasy transfer matrix" in (tmp_path / "m" / "matrix.txt").read_text()
