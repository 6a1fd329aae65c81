"""Hydra configs compose and validate for every group option; metrics land in JSONL/TensorBoard and a plot."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

import trainers
from trainers.grpo import GRPOConfig
from trainers.loop import TaskSampler, build_envs
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
    assert type(cfg.algorithm) is (PPOConfig if algorithm == "ppo" else GRPOConfig)
    assert cfg.algorithm.name == algorithm
    assert cfg.optim.total_steps == 3 and cfg.env.ids


def test_ppo_has_no_grpo_only_options() -> None:
    assert not {"normalize_std", "drop_degenerate"} & set(PPOConfig.model_fields)
    with pytest.raises(ValidationError, match="normalize_std"):
        compose(["algorithm=ppo", "+algorithm.normalize_std=false"])


@pytest.mark.parametrize("group", ["model", "engine", "sandbox"])
def test_every_group_option_composes(group: str) -> None:
    selects = {
        "model": ("name", lambda c: c.model.name),
        "engine": ("kind", lambda c: c.engine.kind),
        "sandbox": ("backend", lambda c: c.sandbox.backend),
    }
    key, chosen = selects[group]
    for option in options(group):
        cfg = compose([f"{group}={option}"])
        expected = yaml.safe_load((CONF / group / f"{option}.yaml").read_text())
        assert chosen(cfg) == expected[key], (group, option)  # the option file, not the default, was composed
        section = getattr(cfg, group).model_dump(mode="json")
        for field, value in expected.items():
            if field != "options":  # options are passed on as given; the typed fields must round-trip
                assert section[field] == value or isinstance(value, dict), (group, option, field)


def test_bad_overrides_are_refused_with_the_option_named() -> None:
    with pytest.raises(ValidationError, match="eps_lo"):
        compose(["+algorithm.eps_lo=0.1"])
    with pytest.raises(ValidationError, match="band"):
        compose(["+algorithm.correction.bands=0.1"])
    with pytest.raises(ValidationError, match="union_tag_invalid|does not match any of the expected tags"):
        compose(["algorithm.name=reinforce"])
    with pytest.raises(ValidationError, match="env"):
        compose(["env.group_size=0"])


def uncommented_options(text: str) -> list[str]:
    """Lines that set a value (`key: value`, not a section header `key:` or a defaults entry) without a `#` comment."""
    out = []
    for line in text.splitlines():
        code = line.split("#", 1)[0]
        match = re.match(r"^\s*[\w.-]+:\s*(\S.*)$", code)
        if match and "#" not in line:
            out.append(line.strip())
    return out


def test_every_yaml_option_is_commented() -> None:
    assert uncommented_options("a: 1  # one\nb:\n  c: 2\n  d: 3  # three\n") == ["c: 2"]  # the check itself works
    paths = sorted(CONF.rglob("*.yaml"))
    assert len(paths) >= 10
    for path in paths:
        text = path.read_text()
        assert text.lstrip().startswith("#"), f"{path} has no header comment"
        assert not uncommented_options(text), f"{path}: options without a comment: {uncommented_options(text)}"


def test_the_sampling_temperature_is_one_knob() -> None:
    cfg = compose(["algorithm.temperature=0.7"])
    assert cfg.algorithm.temperature == 0.7
    with pytest.raises(ValidationError, match="algorithm.temperature"):
        compose(["+env.options.temperature=0.7"])
    # the training envs sample at it; evaluation too unless eval.temperature says otherwise
    (train_env,) = build_envs(cfg, None, "train")
    (eval_env,) = build_envs(cfg, None, "test", evaluation=True)
    assert train_env.options.temperature == 0.7 and eval_env.options.temperature == 0.7
    cfg = compose(["algorithm=ppo", "algorithm.temperature=0.6", "eval.temperature=0"])
    assert build_envs(cfg, None, "train")[0].options.temperature == 0.6
    assert build_envs(cfg, None, "test", evaluation=True)[0].options.temperature == 0.0


def test_harness_options_reach_only_their_harness() -> None:
    """`env.harness_options.<Harness>` sets one adapter's options in a mixed batch (OpenClaw's API style next
    to Claude Code, which has no such option); a key that is no harness is refused."""
    chat = "+env.harness_options.OpenClaw.api_style=openai-chat"
    cfg = compose(["env=clawgym_mixed", "env.ids=[ClawGymBench-OpenClaw,ClawGymBench-ClaudeCode]", chat])
    openclaw, claude = build_envs(cfg, None, "train")
    assert openclaw.options.harness_options == {"api_style": "openai-chat"} and claude.options.harness_options == {}
    assert openclaw.adapter.api_style.value == "openai-chat"  # the adapter is built with it
    with pytest.raises(ValidationError, match="no registered harness"):
        compose(["+env.harness_options.Openclaw.api_style=openai-chat"])
    # an experiment's evaluation through OpenClaw reads it from any arm's config, even a white-box arm's
    from benchmarks.transfer_matrix import evaluation_env_overrides

    white = compose(["env=clawgym_whitebox", chat])
    assert evaluation_env_overrides(white, "ClawGymBench-OpenClaw", {"max_calls": 2}) == {
        "max_calls": 2,
        "harness_options": {"api_style": "openai-chat"},
    }
    assert evaluation_env_overrides(white, "ClawGymBench-ClaudeCode", {"max_calls": 2}) == {"max_calls": 2}


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
        logger.log(
            {
                "reward/A": 0.1 * step,
                "reward/B": 0.2,
                "loss": 1.0 / step,
                "clip_frac": 0.01,
                "is_ratio_mean": 1.0,
                "is_kl_k3": 0.001,
                "entropy": 2.0,
                "nan_metric": float("nan"),
            },
            step,
        )
    logger.log({"eval_reward/A": 0.5}, 3, kind="eval")
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and rows[0]["nan_metric"] is None and rows[-1]["kind"] == "eval"
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    out = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "m.png")
    assert out.stat().st_size > 10_000
