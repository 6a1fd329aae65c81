"""The learning benchmark's bookkeeping (fast): verdict arithmetic and reuse of finished runs."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.learning_curve import finished_summary, verdict
from evaluation.evidence import EvidenceRow
from trainers.main import compose


def _stored(gains: list[float], harness: str = "Pi") -> list[EvidenceRow]:
    """Per seed, 8 tasks x 4 rollouts: half the untrained rollouts score 0.5, the trained ones that plus gain."""
    rows = []
    for seed, g in enumerate(gains):
        for task in range(8):
            for rep in range(4):
                base = 0.5 if (task + rep) % 2 else 0.0
                common = {"experiment": "l", "seed": seed, "eval_harness": harness, "suite": "S", "task_id": f"t{task}"}
                rows.append(EvidenceRow(**common, arm="untrained", phase="before", repeat=rep, reward=base))
                rows.append(EvidenceRow(**common, arm="grpo", phase="after", repeat=rep, reward=base + g))
    return rows


def test_learned_means_the_paired_interval_lies_above_zero() -> None:
    runs = [{"start": 0.25, "end": 0.65, "gain": 0.4}] * 2
    clear = verdict("grpo", runs, _stored([0.4, 0.4]))
    assert clear["learned"] and clear["gains"]["Pi"]["low"] > 0 and clear["gains"]["Pi"]["seeds"] == 2
    mixed = verdict("grpo", runs, _stored([0.4, -0.4]))  # one seed up, one down: the interval spans zero
    assert not mixed["learned"] and mixed["gains"]["Pi"]["low"] < 0 < mixed["gains"]["Pi"]["high"]
    assert not verdict("grpo", runs, _stored([-0.2, -0.2]))["learned"]  # a loss, shown, is not learning
    assert not verdict("grpo", runs, [])["learned"]  # nothing stored: no claim


def test_a_finished_run_with_the_same_config_is_reused(tmp_path) -> None:
    cfg = compose(["seed=1", f"run_dir={tmp_path}", "steps=3"])
    assert finished_summary(tmp_path, cfg) is None
    (tmp_path / "config.json").write_text(cfg.model_dump_json())
    (tmp_path / "summary.json").write_text(
        json.dumps({"eval_start": {"eval_reward_mean": 0.1}, "eval_end": {"eval_reward_mean": 0.5}})
    )
    assert finished_summary(tmp_path, cfg)["eval_end"]["eval_reward_mean"] == 0.5  # read back from JSON: exact
    # same run directory, another config (or display setting aside): not reused unless only display differs
    assert finished_summary(tmp_path, compose(["seed=1", f"run_dir={tmp_path}", "steps=4"])) is None
    assert (
        finished_summary(tmp_path, compose(["seed=1", f"run_dir={tmp_path}", "steps=3", "logging.progress=false"]))
        is not None
    )


def test_evaluation_speed_settings_do_not_make_a_finished_run_stale(tmp_path) -> None:
    cfg = compose(["seed=1", f"run_dir={tmp_path}", "steps=3"])
    (tmp_path / "config.json").write_text(cfg.model_dump_json())
    (tmp_path / "summary.json").write_text(json.dumps({"eval_end": {"eval_reward_mean": 0.5}}))
    faster = compose(faster_overrides(tmp_path))
    assert finished_summary(tmp_path, faster) is not None
    # how often it saved decides how much a stop loses, not what it trained
    assert finished_summary(tmp_path, compose([*faster_overrides(tmp_path), "checkpoint.every=1"])) is not None
    assert finished_summary(tmp_path, compose(["seed=1", f"run_dir={tmp_path}", "steps=3", "eval.repeats=4"])) is None


def faster_overrides(run_dir: Path) -> list[str]:
    return ["seed=1", f"run_dir={run_dir}", "steps=3", "eval.concurrency=3", f"eval.cache_dir={run_dir}"]
