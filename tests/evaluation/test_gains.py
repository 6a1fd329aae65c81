"""The per-rollout evidence files and the paired bootstrap that turns them into gains with intervals."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from evaluation import EvalConfig, EvalRow, build_report
from evaluation.evidence import EvidenceLog, EvidenceRow, degenerate_groups, read_rows, rows_from_report, write_rows
from evaluation.gains import difference, gain


def row(arm: str, phase: str, seed: int, task: str, reward: float, harness: str = "H", **kw) -> EvidenceRow:
    return EvidenceRow(
        experiment="t",
        arm=arm,
        phase=phase,
        seed=seed,
        eval_harness=harness,
        suite="S",
        task_id=task,
        reward=reward,
        **kw,
    )


def simulated(
    rng: np.random.Generator, effect: float, *, seeds=4, tasks=16, repeats=4, seed_sd=0.1
) -> list[EvidenceRow]:
    """Before/after rollouts of one arm: task difficulties vary, training adds `effect` plus seed noise."""
    rows = []
    for s in range(seeds):
        p = rng.uniform(0.1, 0.6, size=tasks)
        shift = effect + rng.normal(0.0, seed_sd)
        for t in range(tasks):
            for r in range(repeats):
                rows.append(row("untrained", "before", s, f"t{t}", float(rng.random() < p[t]), repeat=r))
                rows.append(row("A", "after", s, f"t{t}", float(rng.random() < np.clip(p[t] + shift, 0, 1)), repeat=r))
    return rows


def test_the_gain_is_the_paired_mean_over_seeds_of_task_means() -> None:
    rows = [
        # seed 0: before task means 0.5 and 0.0, after 1.0 and 1.0: gain 0.75
        row("untrained", "before", 0, "a", 0.0),
        row("untrained", "before", 0, "a", 1.0),
        row("untrained", "before", 0, "b", 0.0),
        row("A", "after", 0, "a", 1.0),
        row("A", "after", 0, "b", 1.0),
        # seed 1: before 1.0 (one task), after 0.5: gain -0.5; task c only after: not paired, left out
        row("untrained", "before", 1, "a", 1.0),
        row("A", "after", 1, "a", 0.5),
        row("A", "after", 1, "c", 0.0),
        # another harness and another arm are not this cell
        row("untrained", "before", 0, "a", 0.0, harness="G"),
        row("B", "after", 0, "a", 0.0),
    ]
    estimate = gain(rows, "A", "H", n_resamples=500)
    assert estimate.value == pytest.approx((0.75 - 0.5) / 2)
    assert (estimate.seeds, estimate.tasks, estimate.rollouts_before, estimate.rollouts_after) == (2, 1, 4, 3)
    assert estimate.low <= estimate.value <= estimate.high


def test_no_effect_is_rarely_shown_and_a_real_one_usually_is() -> None:
    """Calibration on experiments of the matrix's shape (4 seeds x 16 tasks x 4 rollouts)."""
    rng = np.random.default_rng(7)
    false_claims = sum(gain(simulated(rng, 0.0), "A", "H", seed=i, n_resamples=1000).shown for i in range(60))
    found = sum(gain(simulated(rng, 0.3), "A", "H", seed=i, n_resamples=1000).shown for i in range(20))
    assert false_claims <= 6, f"{false_claims}/60 null experiments called a gain"  # nominal 3
    assert found >= 17, f"a +0.3 effect was shown in only {found}/20"


def test_bonferroni_widens_the_interval_with_the_number_of_comparisons() -> None:
    rows = simulated(np.random.default_rng(3), 0.12)
    one, twelve = gain(rows, "A", "H"), gain(rows, "A", "H", comparisons=12)
    assert one.value == twelve.value and (one.low, one.high) == (twelve.low, twelve.high)
    assert twelve.adjusted_low < one.low and twelve.adjusted_high > one.high
    assert twelve.comparisons == 12


def test_the_difference_of_two_arms_shares_the_before_draws() -> None:
    rng = np.random.default_rng(5)
    rows = simulated(rng, 0.3)
    rows += [r.model_copy(update={"arm": "A2"}) for r in rows if r.arm == "A"]  # an identical second arm
    same = difference(rows, "A", "A2", "H")
    assert same.value == 0.0 and same.low <= 0.0 <= same.high
    assert same.high - same.low < gain(rows, "A", "H").high - gain(rows, "A", "H").low  # the shared before cancels
    with pytest.raises(ValueError, match="no seed has both"):
        gain(rows, "missing", "H")


def test_evidence_rows_round_trip_and_are_readable_without_clawgym(tmp_path) -> None:
    rows = [
        EvalRow(env_id="S-H", suite="S", harness="H", task_id="t1", reward=0.5, success=False, num_calls=2),
        EvalRow(env_id="S-H", suite="S", harness="H", task_id="t1", repeat=1, reward=1.0, success=True),
        EvalRow(env_id="S-H", suite="S", harness="H", task_id="t2", reward=0.7, success=False, status="failed"),
    ]
    report = build_report(rows, EvalConfig(env_ids=["S-H"]))
    evidence = rows_from_report(report, experiment="e", arm="Pi", phase="after", seed=3, commit="abc")
    assert [r.reward for r in evidence] == [0.5, 1.0, 0.0]  # a failed rollout counts 0
    path = write_rows(tmp_path / "e.jsonl.gz", evidence)
    first = path.read_bytes()
    assert write_rows(path, evidence).read_bytes() == first  # reproducible bytes: a rerun leaves git clean
    assert read_rows(path) == evidence
    plain = [json.loads(line) for line in gzip.open(path, "rt")]
    assert {k: plain[1][k] for k in ("arm", "eval_harness", "seed", "phase", "task_id", "reward")} == {
        "arm": "Pi",
        "eval_harness": "H",
        "seed": 3,
        "phase": "after",
        "task_id": "t1",
        "reward": 1.0,
    }


def test_training_rows_are_truncated_on_resume_and_degenerate_groups_counted(tmp_path) -> None:
    log = EvidenceLog(tmp_path / "rollouts.jsonl")
    for step in (1, 2, 3):
        rewards = [0.0, 0.0] if step != 2 else [0.0, 1.0]
        log.append([row("Pi", "train", 0, "t", r, step=step) for r in rewards])
    assert degenerate_groups(read_rows(log.path)) == {"Pi": (2, 3)}
    assert log.truncate_after(2) == 2
    assert sorted({r.step for r in read_rows(log.path)}) == [1, 2]
