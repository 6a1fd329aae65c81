"""benchmarks.async_training end to end at plumbing size: two arms (k = 0 and 1) of the main job's recipe with
the tiny model through the real pi harness, their rows published and merged, and the side-by-side table."""

from __future__ import annotations

from pathlib import Path

from benchmarks.async_training import main, read_timings
from evaluation.evidence import read_rows
from trainers.main_job import QUICK_OVERRIDES


def test_the_benchmark_trains_both_arms_side_by_side_and_publishes(tmp_path: Path, capsys) -> None:
    quick = [o for o in QUICK_OVERRIDES if not o.startswith("checkpoint")] + ["engine=transformers"]
    args = ["--out", str(tmp_path / "out"), "--staleness", "0", "1", "--seeds", "0", "--publish", str(tmp_path)]
    assert main([*args, "--", *quick]) == 0
    table = capsys.readouterr().out
    assert "staleness-0" in table and "staleness-1" in table and "vs staleness-0" in table
    rows = read_rows(tmp_path / "async_training.jsonl.gz")
    before = [r for r in rows if r.phase == "before"]
    assert before and {r.arm for r in before} == {"untrained"}  # measured once, shared by both arms
    assert len(before) == len({(r.task_id, r.repeat) for r in before})
    assert {r.arm for r in rows if r.phase == "after"} == {"staleness-0", "staleness-1"}
    timings = read_timings(tmp_path / "async_training_steps.jsonl.gz")
    assert [(t.arm, t.step) for t in timings] == [
        ("staleness-0", 1),
        ("staleness-0", 2),
        ("staleness-1", 1),
        ("staleness-1", 2),
    ]
    assert all(t.weight_sync_bytes > 0 and t.step_s >= t.update_s > 0 for t in timings)
    assert all(t.staleness_max <= 1 for t in timings) and timings[-1].checkpoint_bytes
    from benchmarks.experiment_report import async_training_block

    block = async_training_block(tmp_path)  # the docs' table, from the published files alone
    assert "| staleness-0 |" in block and "| staleness-1 |" in block and "(n=1)" in block
    assert main([*args, "--", *quick]) == 0  # read back from the run directories, merged without duplicates
    assert len(read_timings(tmp_path / "async_training_steps.jsonl.gz")) == 4
    assert len(read_rows(tmp_path / "async_training.jsonl.gz")) == len(rows)


def test_the_replay_matches_hand_computed_schedules() -> None:
    """Every rollout takes 10 s, the update 4 s: synchronous steps take 14 s; with k = 1 the next batch runs
    during the update, so a step takes max(10, 4) = 10 s and the trainer idles 6 of them."""
    import numpy as np

    from benchmarks.staleness_replay import replay

    d = np.array([10.0])
    sync = replay(d, 8, 4.0, 0, steps=100)
    ahead = replay(d, 8, 4.0, 1, steps=100)
    assert sync["step_s"] == 14.0 and sync["trainer_idle"] == 1 - 4 / 14
    assert abs(ahead["step_s"] - (10 * 100 + 4) / 100) < 1e-9  # the last update is not hidden
    assert ahead["slots_idle"] < 0.01 and sync["slots_idle"] > 0.28
    slow_tail = replay(np.array([1.0] * 99 + [100.0]), 64, 4.0, 0)
    assert slow_tail["slots_idle"] > 0.9  # one slow harness start in a wide batch idles every slot


def test_each_variant_changes_only_what_it_names(tmp_path: Path) -> None:
    from benchmarks.async_training import arm_name, arm_overrides
    from trainers.main import compose

    def cfg(variant: str | None):  # type: ignore[no-untyped-def]
        return compose(arm_overrides(0, variant, 0, tmp_path / "run", tmp_path / "cache", ["engine=vllm"]))

    plain, bf16, adapter = cfg(None), cfg("bf16"), cfg("adapter")
    assert (plain.optim.autocast, bf16.optim.autocast) == (None, "bfloat16")
    assert (plain.model.lora.sync, adapter.model.lora.sync, bf16.model.lora.sync) == ("merged", "adapter", "merged")
    assert plain.model_dump(exclude={"optim"}) == bf16.model_dump(exclude={"optim"})
    assert [arm_name(0), arm_name(0, "bf16")] == ["staleness-0", "staleness-0+bf16"]


def test_an_arm_run_without_the_synchronous_arm_is_reported_without_a_difference() -> None:
    """`--staleness 2` alone: its gain is reported and published; the comparison with k = 0 is left to the
    published table (it once raised here, after training, before publishing)."""
    from benchmarks.async_training import StepTiming, report
    from evaluation.evidence import EvidenceRow

    def row(arm: str, phase: str, task: int, reward: float) -> EvidenceRow:
        return EvidenceRow(
            experiment="async_training", arm=arm, phase=phase, seed=0, eval_harness="Pi", suite="ClawGymBench",
            task_id=f"t{task}", reward=reward,
        )  # fmt: skip

    rows = [row("untrained", "before", t, 0.0) for t in range(4)] + [
        row("staleness-2", "after", t, 1.0) for t in range(4)
    ]
    timing = dict(step_s=10.0, update_s=4.0, wait_s=6.0, rollout_s=6.0, producer_wait_s=0.0, weight_sync_s=0.1)
    timings = [StepTiming(arm="staleness-2", seed=0, step=1, weight_sync_bytes=1e6, staleness_max=2,
                          rollouts_stale_dropped=0, **timing)]  # fmt: skip
    table = report(rows, timings)
    assert "staleness-2" in table and "+1.000" in table
