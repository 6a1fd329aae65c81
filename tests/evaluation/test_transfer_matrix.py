"""The transfer matrix: its arithmetic (before/after, noise, mixed vs single), and its --quick form end to end
(tiny random model, real trainers, real harness CLIs): table, JSON and plot shape, and a rerun that trains
and evaluates nothing again."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from benchmarks.transfer_matrix import (
    ARMS,
    EVAL_HARNESSES,
    UNTRAINED,
    Cell,
    MatrixReport,
    MatrixSettings,
    SeedResult,
    aggregate,
    arm_overrides,
    main,
    mixed_vs_single,
)
from trainers.main import compose


def seeds(*rewards: float) -> list[SeedResult]:
    return [SeedResult(seed=i, reward=r, rollouts=2, failed=0, results="-") for i, r in enumerate(rewards)]


def test_a_cell_is_before_to_after_with_the_learning_tests_noise() -> None:
    cell = aggregate(Cell(arm="Pi", harness="Pi", before=seeds(0.25, 0.35), after=seeds(0.75, 0.65)))
    # gains 0.50 and 0.30: mean 0.40; std (ddof 1) of before 0.0707, of gains 0.1414 -> noise 0.1414
    assert cell.seeds == 2 and cell.before_mean == pytest.approx(0.30) and cell.after_mean == pytest.approx(0.70)
    assert cell.gain_mean == pytest.approx(0.40) and cell.noise == pytest.approx(0.02**0.5)
    assert cell.improved and "0.300→0.700 (+0.400 ±0.141, n=2)" == cell.text()
    flat = aggregate(Cell(arm="Pi", harness="Pi", before=seeds(0.1, 0.6), after=seeds(0.3, 0.7)))
    assert flat.improved is False  # the start alone spreads more than the gain
    one = aggregate(Cell(arm="Pi", harness="Pi", before=seeds(0.1, 0.6), after=seeds(0.3)))
    assert one.seeds == 1 and one.noise is None and one.improved is None  # one seed cannot tell noise
    assert aggregate(Cell(arm="Pi", harness="Pi", before=seeds(0.1))).text() == "to run"


def test_mixed_against_single_per_harness() -> None:
    cells = {
        "Pi": {"Pi": aggregate(Cell(arm="Pi", harness="Pi", before=seeds(0.2, 0.2), after=seeds(0.5, 0.5)))},
        "Pi+ClaudeCode": {
            "Pi": aggregate(Cell(arm="Pi+ClaudeCode", harness="Pi", before=seeds(0.2, 0.2), after=seeds(0.3, 0.3))),
            "ClaudeCode": aggregate(Cell(arm="Pi+ClaudeCode", harness="ClaudeCode", before=seeds(0.1, 0.1))),
        },
    }
    out = mixed_vs_single(cells)
    assert out["Pi"]["difference"] == pytest.approx(-0.2) and out["Pi"]["noise"] == pytest.approx(0.0)
    assert out["ClaudeCode"]["difference"] is None  # neither arm measured there yet


def test_each_arm_trains_through_its_harnesses_with_the_main_recipe(tmp_path: Path) -> None:
    for arm, harnesses in ARMS.items():
        cfg = compose(arm_overrides(arm, 3, tmp_path / arm, MatrixSettings()))
        assert cfg.env.ids == [f"ClawGymBench-{h}" for h in harnesses], arm
        assert cfg.seed == 3 and cfg.env.suite_seed == 0  # one set of held-out tasks for every seed
        assert "qwen2.5-coder-0.5b" in cfg.model.name and cfg.model.lora.enabled  # the learning test's recipe
        assert cfg.checkpoint.resume == "auto" and not cfg.eval.at_start


def means(report: MatrixReport) -> dict[str, dict[str, tuple]]:
    return {
        a: {h: (c.before_mean, c.after_mean, c.noise, c.seeds) for h, c in row.items()}
        for a, row in report.cells.items()
    }


@pytest.mark.harness
def test_quick_matrix_writes_table_json_plot_and_a_rerun_skips_finished_cells(tmp_path: Path) -> None:
    arms = ["WhiteBox", "Pi+ClaudeCode"]
    argv = ["--quick", "--out", str(tmp_path), "--arms", *arms, "--seeds", "0", "1"]
    first = main(argv)
    assert list(first.cells) == [UNTRAINED, *arms]
    for row in first.cells.values():
        assert list(row) == EVAL_HARNESSES
        for cell in row.values():
            assert cell.seeds == 2 and cell.before_mean is not None and cell.noise is not None
            assert all(r.rollouts == 1 for r in cell.before + cell.after)
    for arm in arms:
        assert all(cell.after_mean is not None for cell in first.cells[arm].values())
    assert sorted((r.arm, r.seed, r.trained_now) for r in first.training) == sorted(
        (a, s, True) for a in arms for s in (0, 1)
    )
    # the untrained policy is measured once per seed and harness, then reused by every arm's "before"
    assert first.evaluations_measured == 2 * len(EVAL_HARNESSES) * (1 + len(arms)) and first.evaluations_reused == 0
    saved = MatrixReport.model_validate_json((tmp_path / "matrix.json").read_text())
    assert saved.cells == first.cells
    text = (tmp_path / "matrix.txt").read_text()
    assert all(f"evaluated in {h}" in text for h in EVAL_HARNESSES) and "→" in text and "n=2" in text
    assert "mixed vs single" not in text  # no single-harness Pi or Claude Code arm in this run
    assert (tmp_path / "matrix.png").stat().st_size > 5000
    mixed = json.loads((tmp_path / "train" / "pi-claudecode-seed0" / "config.json").read_text())
    assert mixed["env"]["ids"] == ["ClawGymBench-Pi", "ClawGymBench-ClaudeCode"]

    start = time.perf_counter()
    again = main(argv)
    assert not any(r.trained_now for r in again.training) and again.evaluations_measured == 0
    assert again.evaluations_reused == first.evaluations_measured and means(again) == means(first)
    assert time.perf_counter() - start < 60  # nothing trained or rolled out (training alone took minutes)

    plan = main(["--quick", "--out", str(tmp_path), "--plan", "--seeds", "0", "1"])
    assert list(plan.cells) == [UNTRAINED, *ARMS]
    assert {a: row for a, row in means(plan).items() if a in first.cells} == means(first)
    assert plan.cells["Pi"]["Pi"].text() == "to run" and plan.cells["ClaudeCode"]["WhiteBox"].text() == "to run"
