"""The learning benchmark's bookkeeping (fast): verdict arithmetic and reuse of finished runs."""

from __future__ import annotations

import json

from benchmarks.learning_curve import finished_summary, verdict
from trainers.main import compose


def test_verdict_needs_a_gain_above_the_noise() -> None:
    rows = [{"start": 0.30, "end": 0.70, "gain": 0.40}, {"start": 0.40, "end": 0.75, "gain": 0.35}]
    assert verdict(rows)["learned"]
    noisy = [{"start": 0.1, "end": 0.3, "gain": 0.2}, {"start": 0.6, "end": 0.7, "gain": 0.1}]
    assert not verdict(noisy)["learned"]  # the start alone varies by more than the gain
    assert not verdict([{"start": 0.5, "end": 0.4, "gain": -0.1}, {"start": 0.5, "end": 0.4, "gain": -0.1}])["learned"]


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
    faster = compose(["seed=1", f"run_dir={tmp_path}", "steps=3", "eval.concurrency=3", f"eval.cache_dir={tmp_path}"])
    assert finished_summary(tmp_path, faster) is not None
    assert finished_summary(tmp_path, compose(["seed=1", f"run_dir={tmp_path}", "steps=3", "eval.repeats=4"])) is None
