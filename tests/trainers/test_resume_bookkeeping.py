"""Resume bookkeeping: the newest checkpoint wins, and metrics past it are dropped (no step counted twice)."""

from __future__ import annotations

import json

from trainers.loop import newest_checkpoint
from trainers.metrics_log import MetricsLogger


def test_newest_checkpoint_prefers_the_highest_step(tmp_path):
    assert newest_checkpoint(tmp_path) is None
    (tmp_path / "latest.pt").write_bytes(b"x")
    assert newest_checkpoint(tmp_path).endswith("latest.pt")
    for step in (2, 10, 4):
        (tmp_path / f"step_{step:06d}.pt").write_bytes(b"x")
    (tmp_path / "step_000012.pt.tmp").write_bytes(b"half-written")  # an interrupted save is never picked
    assert newest_checkpoint(tmp_path).endswith("step_000010.pt")


def test_truncate_after_drops_the_steps_that_run_again(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        logger.log({"rollouts": 4.0}, step)
    logger.log({"eval_reward_mean": 0.5}, 3, kind="eval")
    assert logger.truncate_after(2) == 2
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]


def test_checkpoints_are_pruned_and_latest_is_a_link(tmp_path) -> None:
    import os

    from trainers.loop import link_latest, newest_checkpoint, prune_checkpoints

    for step in (2, 4, 6):
        saved = tmp_path / f"step_{step:06d}.pt"
        saved.write_bytes(str(step).encode() * 100)
        link_latest(saved)
        prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_000004.pt", "step_000006.pt"]
    latest = tmp_path / "latest.pt"
    assert latest.read_bytes() == b"6" * 100 and os.path.samefile(latest, tmp_path / "step_000006.pt")
    assert newest_checkpoint(tmp_path) == str(tmp_path / "step_000006.pt")
    assert not list(tmp_path.glob("*.tmp"))
