"""Trainer faults: `python -m trainers.main` (tiny-qwen3, WhiteBox, a few steps) SIGKILLed between steps and
resumed from its checkpoint continues where it stopped, with the same data order, counting no rollout twice.
Compared with an uninterrupted run of the same config. Slow: each training process spends ~25 s starting up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from clawgym_env.records import read_calls

REPO = Path(__file__).resolve().parents[2]
STEPS, PER_STEP = 4, 4  # group_size 2 x tasks_per_step 2
TINY = [
    "threads=1",
    "env.group_size=2",
    "env.tasks_per_step=2",
    "env.eval_tasks=1",
    "env.max_concurrency=4",
    "eval.at_start=false",
    "eval.every=0",
    "eval.repeats=1",
    "logging.tensorboard=false",
    "logging.progress=false",
    "logging.plot_every=0",
    "env.options.max_new_tokens=8",
    "env.options.max_calls=2",
    "checkpoint.keep=10",  # every step's checkpoint is compared below: none pruned
]


def _argv(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "trainers.main", f"run_dir={run_dir}", f"steps={STEPS}", *TINY, *extra]


def _train_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"]


def _sampler_state(ckpt: Path) -> list:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["extra"]["samplers"]


def _sampler_state_or_none(ckpt: Path) -> list | None:
    try:
        return _sampler_state(ckpt)
    except Exception:  # noqa: BLE001 - being written (the save is a rename, but be safe)
        return None


def _rollout_tasks(run_dir: Path, since: float = 0.0, until: float = float("inf")) -> list[tuple[float, str]]:
    """(start time, prompt of the first call) of each rollout whose first call came in [since, until)."""
    from clawgym_env.engines import load_qwen_tokenizer

    tok = load_qwen_tokenizer()
    firsts = [c for c in read_calls(run_dir / "rollouts" / "calls.jsonl") if c.call_index == 0]
    out = [(c.timings.received_at, tok.decode(c.prompt_ids)) for c in firsts if since <= c.timings.received_at < until]
    return sorted(out)


def _per_step(rollouts: list[tuple[float, str]], steps: int) -> list[list[str]]:
    prompts = [p for _, p in rollouts[: steps * PER_STEP]]
    return [sorted(prompts[i * PER_STEP : (i + 1) * PER_STEP]) for i in range(steps)]


def _kill_when(proc: subprocess.Popen, ready) -> float:
    deadline = time.time() + 240
    while not ready():
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.time() < deadline, "training never reached the kill point"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return time.time()


@pytest.mark.slow
def test_sigkill_between_steps_then_resume_matches_an_uninterrupted_run(tmp_path):
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    subprocess.run(_argv(straight, "checkpoint.every=1"), cwd=REPO, check=True, capture_output=True, timeout=600)

    proc = subprocess.Popen(
        _argv(broken, "checkpoint.every=1"), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    ckpt2, latest = broken / "checkpoints" / "step_000002.pt", broken / "checkpoints" / "latest.pt"
    # between steps: after step 2's checkpoint *and* latest.pt are written (the loop saves step_N.pt first, then
    # latest.pt; a kill between those two saves must still resume from step N: newest_checkpoint)
    killed_at = _kill_when(
        proc,
        lambda: (
            ckpt2.exists()
            and latest.exists()
            and latest.stat().st_mtime >= ckpt2.stat().st_mtime
            and _sampler_state_or_none(latest) == _sampler_state_or_none(ckpt2)
        ),
    )
    assert proc.returncode == -signal.SIGKILL
    saved_at = ckpt2.stat().st_mtime
    rows_at_kill = len(_train_rows(broken))
    subprocess.run(
        _argv(broken, "checkpoint.every=1", "checkpoint.resume=auto"),
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=600,
    )

    # continues where it stopped: steps 1..4 each logged exactly once, the resumed part starting at step 3
    rows = _train_rows(broken)
    assert [r["step"] for r in rows] == [1, 2, 3, 4], f"{rows_at_kill} rows at the kill"
    assert sum(r["rollouts"] for r in rows) == sum(r["rollouts"] for r in _train_rows(straight)) == STEPS * PER_STEP
    # same data order: the task samplers are in the same state after every step
    for step in range(1, STEPS + 1):
        name = f"step_{step:06d}.pt"
        assert _sampler_state(broken / "checkpoints" / name) == _sampler_state(straight / "checkpoints" / name), name
    # and the rollouts themselves drew the same tasks step by step (from the recorded calls); the rollouts of
    # the step the kill interrupted are in the log but belong to no step
    before = _rollout_tasks(broken, until=saved_at)
    after = _rollout_tasks(broken, since=killed_at)
    assert len(before) == 2 * PER_STEP
    assert _per_step(before, 2) + _per_step(after, 2) == _per_step(_rollout_tasks(straight), STEPS)


@pytest.mark.slow
def test_resume_from_an_older_checkpoint_counts_no_step_twice(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        _argv(run_dir, "checkpoint.every=2"), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    metrics = run_dir / "metrics.jsonl"
    _kill_when(proc, lambda: metrics.exists() and any(r["step"] == 3 for r in _train_rows(run_dir)))
    subprocess.run(
        _argv(run_dir, "checkpoint.every=2", "checkpoint.resume=auto"),
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=600,
    )
    steps = [r["step"] for r in _train_rows(run_dir)]
    assert steps == [1, 2, 3, 4], steps
