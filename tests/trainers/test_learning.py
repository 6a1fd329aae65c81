"""Learning tests that can fail: held-out reward must rise by more than the noise over seeds (slow, CPU).

Both run the real stack: Qwen2.5-Coder-0.5B (LoRA) through the pi CLI in local sandboxes behind the
serving proxy, with a warm start from reference demonstrations recorded through the same harness.
They take hours on a 2-core machine; `benchmarks/learning_curve.py` is the same run with a table.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = [
    "env=clawgym_pi", "model=qwen2.5-coder-0.5b", "model.lora.enabled=true", "steps=8",
    "env.group_size=4", "env.tasks_per_step=2", "env.eval_tasks=4", "eval.repeats=2", "eval.every=0",
    "optim.lr=5e-5", "threads=2", "checkpoint.every=0",
    "warm_start.enabled=true", "warm_start.tasks=8", "warm_start.epochs=12", "warm_start.lr=3e-4",
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_training_raises_held_out_reward_above_noise(tmp_path: Path, algorithm: str) -> None:
    from benchmarks.learning_curve import main

    report = main(["--algorithms", algorithm, "--seeds", "0", "1", "--out", str(tmp_path), "--", *OVERRIDES])
    result = report["algorithms"][algorithm]
    assert result["learned"], result


@pytest.mark.slow
def test_custom_training_loop_example_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "examples/custom_training_loop.py", "--steps", "1", "--group-size", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 0: rewards" in proc.stdout
