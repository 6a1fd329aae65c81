"""Hydra configs compose and validate for every group option; metrics land in JSONL/TensorBoard and a plot."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

import trainers
from trainers.config import algorithm_config
from trainers.grpo import GRPOConfig
from trainers.loop import TaskSampler
from trainers.main import compose
from trainers.metrics_log import MetricsLogger
from trainers.plots import plot_metrics
from trainers.ppo import PPOConfig

CONF = Path(trainers.__file__).parent / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize(("algorithm", "env"), list(itertools.product(options("algorithm"), options("env"))))
def test_every_algorithm_env_pair_composes(algorithm: str, env: str) -> None:
    cfg = compose([f"algorithm={algorithm}", f"env={env}", "steps=3"])
    algo = algorithm_config(cfg.algorithm)
    assert isinstance(algo, PPOConfig if algorithm == "ppo" else GRPOConfig)
    assert cfg.optim.total_steps == 3 and cfg.env.ids


@pytest.mark.parametrize("group", ["model", "engine", "sandbox"])
def test_every_group_option_composes(group: str) -> None:
    for option in options(group):
        compose([f"{group}={option}"])


def test_bad_overrides_are_refused_with_the_option_named() -> None:
    with pytest.raises(ValidationError, match="no option"):
        compose(["+algorithm.eps_lo=0.1"])
    with pytest.raises(ValidationError, match="env"):
        compose(["env.group_size=0"])


def test_every_yaml_option_is_commented() -> None:
    for path in CONF.rglob("*.yaml"):
        text = path.read_text()
        assert text.lstrip().startswith("#"), f"{path} has no header comment"


def test_task_sampler_resumes_its_position() -> None:
    a = TaskSampler(5, seed=1)
    a.draw(3)
    state = a.state()
    expected = a.draw(6)
    b = TaskSampler(5, seed=99)
    b.set_state(state)
    assert b.draw(6) == expected
    assert sorted(TaskSampler(5, seed=2).draw(5)) == list(range(5))  # an epoch has no repeats


def test_metrics_jsonl_tensorboard_and_plot(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path)
    for step in range(1, 4):
        logger.log({"reward/A": 0.1 * step, "reward/B": 0.2, "loss": 1.0 / step, "clip_frac": 0.01,
                    "is_ratio_mean": 1.0, "is_kl_k3": 0.001, "entropy": 2.0, "nan_metric": float("nan")}, step)  # fmt: skip
    logger.log({"eval_reward/A": 0.5}, 3, kind="eval")
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and rows[0]["nan_metric"] is None and rows[-1]["kind"] == "eval"
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    out = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "m.png")
    assert out.stat().st_size > 10_000
