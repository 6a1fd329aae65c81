"""The white-box vs black-box comparison: tiny real training through trainers.loop.train (WhiteBox loop and
the pi CLI), the trained policies rebuilt from their checkpoints, evaluated with the baseline under both."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import clawgym_env
from clawgym_cli.compare import BASELINE, CompareConfig, ComparisonReport, build_policy, compare, train_config
from clawgym_env.engines.vllm_engine import VLLM_MISSING, vllm_available
from evaluation import GroupStats, Interval

WB, PI = "trained in WhiteBox", "trained in Pi"
# entropy bonus, degenerate groups kept: the random tiny model earns no reward, yet its weights still move,
# so a trained policy that is not really the trained one would show
MOVE = ["algorithm.entropy_coef=0.05", "algorithm.drop_degenerate=false"]


def policy_versions(calls_jsonl: Path) -> set[int]:
    return {json.loads(line)["policy_version"] for line in calls_jsonl.read_text().splitlines()}


@pytest.mark.harness
def test_tiny_comparison_trains_both_and_evaluates_all_under_both(tmp_path: Path) -> None:
    report = compare(
        "ClawGymBench",
        "Pi",
        "tiny-qwen3",
        out=tmp_path,
        steps=1,
        group_size=2,
        train_tasks=1,
        eval_tasks=1,
        max_new_tokens=8,
        max_calls=2,
        lr=1e-3,
        train_overrides=MOVE,
    )
    assert report.policies == [BASELINE, WB, PI] and report.harnesses == ["WhiteBox", "Pi"]
    for label in report.policies:
        for harness in report.harnesses:
            stats = report.cells[label][harness]
            assert stats.rollouts == 1 and 0.0 <= stats.mean_reward <= 1.0
    # each training really ran through its own env and saved the step-1 weights, which the evaluation served
    assert {run.env_id for run in report.training.values()} == {"ClawGymBench-WhiteBox", "ClawGymBench-Pi"}
    for run in report.training.values():
        assert run.summary["steps"] == 1 and Path(run.checkpoint).is_file()
        assert json.loads((Path(run.run_dir) / "config.json").read_text())["env"]["ids"] == [run.env_id]
    evals = {label: Path(path).parent for label, path in report.evaluations.items()}
    assert policy_versions(evals[BASELINE] / "calls.jsonl") == {0}
    assert policy_versions(evals[WB] / "calls.jsonl") == policy_versions(evals[PI] / "calls.jsonl") == {1}
    # the files of the documented command
    saved = ComparisonReport.load(tmp_path / "comparison.json")
    assert saved.cells == report.cells
    text = (tmp_path / "comparison.txt").read_text()
    for needle in ("evaluated in WhiteBox", "evaluated in Pi", BASELINE, WB, PI):
        assert needle in text
    assert (tmp_path / "comparison.png").stat().st_size > 5000

    # the trained policy is the checkpoint's weights, and they differ from the start
    cfg = train_config(report.config, "ClawGymBench-WhiteBox", tmp_path / "x")
    state = torch.load(report.training[WB].checkpoint, map_location="cpu", weights_only=False)["model"]
    start = build_policy(cfg).engine.model.state_dict()
    trained = build_policy(cfg, report.training[WB].checkpoint).engine.model.state_dict()
    name = next(k for k in state if k.endswith("q_proj.weight"))
    assert torch.equal(trained[name], state[name])
    assert not torch.equal(start[name], state[name])


def test_train_config_carries_every_knob(tmp_path: Path) -> None:
    config = CompareConfig(
        model="smollm2-135m",
        algorithm="ppo",
        steps=3,
        group_size=5,
        tasks_per_step=2,
        train_tasks=7,
        level=1,
        lr=3e-4,
        max_new_tokens=99,
        max_calls=3,
        train_overrides=["optim.weight_decay=0.1"],
    )
    cfg = train_config(config, "OfficeQA-Codex", tmp_path)
    assert cfg.env.ids == ["OfficeQA-Codex"] and cfg.env.group_size == 5 and cfg.env.tasks_per_step == 2
    assert cfg.env.train_tasks == 7 and cfg.env.level == 1 and cfg.steps == 3 and cfg.checkpoint.every == 3
    assert cfg.algorithm.name == "ppo" and cfg.model.name == "smollm2-135m"
    assert cfg.optim.lr == 3e-4 and cfg.optim.weight_decay == 0.1
    assert cfg.env.options["max_new_tokens"] == 99 and cfg.env.options["max_calls"] == 3
    assert cfg.run_dir == tmp_path
    local = train_config(CompareConfig(model="/models/my-hf-folder"), "OfficeQA-Pi", tmp_path)
    assert local.model.name == "/models/my-hf-folder"


def test_bad_comparisons_fail_before_any_training(tmp_path: Path) -> None:
    def never(cfg):
        raise AssertionError("training must not start")

    with pytest.raises(ValueError, match="black-box harness"):
        compare(harness="WhiteBox", out=tmp_path, train_fn=never)
    with pytest.raises(clawgym_env.UnknownEnvironmentError, match="ClawGymBench-Pi"):
        compare(harness="Pie", out=tmp_path, train_fn=never)
    with pytest.raises(ValueError, match="steps"):
        compare(steps=0, out=tmp_path, train_fn=never)


def test_a_training_that_saves_no_checkpoint_is_reported(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="wrote no checkpoint"):
        compare(out=tmp_path, train_fn=lambda cfg: {"steps": 0})


def test_table_and_plot_from_cells(tmp_path: Path) -> None:
    def stats(mean: float) -> GroupStats:
        return GroupStats(
            rollouts=8,
            tasks=8,
            mean_reward=mean,
            reward_ci=Interval(low=mean - 0.1, high=mean + 0.1),
            success_rate=mean / 2,
        )

    cells = {
        BASELINE: {"WhiteBox": stats(0.2), "Pi": stats(0.1)},
        WB: {"WhiteBox": stats(0.6), "Pi": stats(0.3)},
        PI: {"WhiteBox": stats(0.4), "Pi": stats(0.5)},
    }
    report = ComparisonReport(
        config=CompareConfig(), policies=[BASELINE, WB, PI], harnesses=["WhiteBox", "Pi"], cells=cells
    )
    report.save(tmp_path)
    lines = (tmp_path / "comparison.txt").read_text().splitlines()
    wb_line = next(line for line in lines if line.lstrip("│ ").startswith(WB))
    assert "0.600 [0.50, 0.70] (0.30)" in wb_line and "0.300 [0.20, 0.40] (0.15)" in wb_line
    assert wb_line.index("0.600") < wb_line.index("0.300")  # columns: WhiteBox, then Pi
    assert (tmp_path / "comparison.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.harness
def test_compare_command(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "clawgym_cli",
            "compare",
            "--harness",
            "ClaudeCode",
            "--steps",
            "1",
            "--train-tasks",
            "1",
            "--eval-tasks",
            "2",
            "--max-new-tokens",
            "8",
            "--max-calls",
            "2",
            "--out",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "evaluated in ClaudeCode" in proc.stdout and "trained in ClaudeCode" in proc.stdout
    report = ComparisonReport.load(tmp_path / "comparison.json")
    assert all(report.cells[p]["ClaudeCode"].rollouts == 2 for p in report.policies)


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason=VLLM_MISSING)
@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_a_trained_policy_is_served_by_the_engine_it_was_trained_with(tmp_path: Path, sync: str) -> None:
    """`engine=vllm`: the evaluated policy is an in-process vLLM engine that serves the checkpoint's weights
    (an old full-state LoRA checkpoint sends its adapted layers merged; an adapter checkpoint, with
    `model.lora.sync=adapter`, the adapter alone), not a transformers copy; its logprobs equal a
    teacher-forced pass of the trained model within vLLM's float32 tolerance, and differ from the start's."""
    from clawgym_env.engines.vllm_engine import VLLMEngine
    from clawgym_env.interfaces import SamplingParams
    from trainers.main import compose
    from trainers.model import LoraSettings, apply_lora, load_model

    cfg = compose(
        [
            "model.name=tiny-qwen3-h64",
            "model.lora.enabled=true",
            f"model.lora.sync={sync}",
            "engine=vllm",
            "+engine.options.dtype=float32",
            "+engine.options.max_model_len=512",
            f"+engine.options.kv_cache_memory_bytes={32 * 2**20}",
            f"run_dir={tmp_path / 'run'}",
        ]
    )
    trained = apply_lora(load_model("tiny-qwen3-h64")[0], LoraSettings(enabled=True))
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    checkpoint = tmp_path / "latest.pt"
    if sync == "merged":  # the format of checkpoints written before adapter checkpoints
        torch.save({"model": trained.state_dict(), "step": 3}, checkpoint)
    else:  # what the trainer writes for a LoRA policy now: the adapter and the base's identity
        adapter = {k: v for k, v in trained.state_dict().items() if "lora_" in k}
        base = {"name": "tiny-qwen3-h64", "dtype": "float32", "seed": 0}
        torch.save({"model": adapter, "model_format": "adapter", "base_model": base, "step": 3}, checkpoint)
    merged = trained.merge_and_unload().eval()

    policy = build_policy(cfg, checkpoint)
    try:
        assert isinstance(policy.engine, VLLMEngine) and policy.engine.policy_version == 3
        assert policy.engine.supports_adapters == (sync == "adapter")
        prompt = policy.renderer.tokenizer.encode("<|im_start|>user\nlist the files<|im_end|>\n<|im_start|>assistant\n")
        gen = asyncio.run(policy.engine.generate(prompt, SamplingParams(max_tokens=12, seed=0, ignore_eos=True)))
        with torch.no_grad():
            logits = merged(torch.tensor([prompt + gen.token_ids])).logits[0].float()
            start_logits = load_model("tiny-qwen3-h64")[0](torch.tensor([prompt + gen.token_ids])).logits[0].float()
        at = slice(len(prompt) - 1, len(prompt) - 1 + len(gen.token_ids))
        ids = torch.tensor(gen.token_ids)
        want = torch.log_softmax(logits[at], -1)[torch.arange(len(ids)), ids]
        start = torch.log_softmax(start_logits[at], -1)[torch.arange(len(ids)), ids]
        got = torch.tensor(gen.logprobs)
        assert (got - want).abs().max() < 1e-4  # tests/engines/test_vllm_engine.py's float32 tolerance
        assert (got - start).abs().max() > 1e-2  # and the checkpoint really changed what it serves
    finally:
        policy.engine.close()
