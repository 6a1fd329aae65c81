"""benchmarks.starting_rewards end to end on the tiny model: one greedy rollout, a row per harness."""

import json

from benchmarks.starting_rewards import RECIPE_LIMITS, groups_with_signal, main
from evaluation.evidence import publish_rows, read_rows


def test_one_row_per_harness_with_the_recipe_limits(tmp_path) -> None:
    rows = main(["--model", "tiny-qwen3", "--count", "1", "--harnesses", "WhiteBox", "--out", str(tmp_path)])
    assert [row["harness"] for row in rows] == ["WhiteBox"]
    assert rows[0]["rollouts"] == 1 and rows[0]["failed"] == 0
    assert 0.0 <= rows[0]["mean_reward"] <= 1.0
    assert json.loads((tmp_path / "starting_rewards.json").read_text())[0]["harness"] == "WhiteBox"
    results = json.loads((tmp_path / "WhiteBox" / "results.json").read_text())
    assert results["rows"][0]["num_calls"] <= RECIPE_LIMITS["max_calls"]
    (row,) = read_rows(tmp_path / "evidence.jsonl.gz")
    assert (row.arm, row.phase, row.eval_harness, row.reward) == (
        "untrained",
        "before",
        "WhiteBox",
        rows[0]["mean_reward"],
    )


def test_sampled_groups_are_stored_apart_and_counted(tmp_path) -> None:
    """`--samples 3`: three rollouts of the task at T=1, one group, published to starting_signal, not the greedy file."""
    argv = ["--model", "tiny-qwen3", "--count", "1", "--samples", "3", "--harnesses", "WhiteBox"]
    rows = main([*argv, "--out", str(tmp_path / "out"), "--publish", str(tmp_path / "results")])
    assert rows[0]["rollouts"] == 3 and rows[0]["groups_with_signal"] in (0, 1)
    stored = read_rows(tmp_path / "results" / "starting_signal.jsonl.gz")
    assert sorted(r.repeat for r in stored) == [0, 1, 2] and {r.experiment for r in stored} == {"starting_signal"}
    assert len({r.task_id for r in stored}) == 1
    differ = max(r.reward for r in stored) != min(r.reward for r in stored)
    assert rows[0]["groups_with_signal"] == int(differ)
    assert not (tmp_path / "results" / "starting_rewards.jsonl.gz").exists()


def test_groups_with_signal_counts_only_groups_whose_rewards_differ() -> None:
    assert groups_with_signal({"a": [0.0, 0.0], "b": [0.0, 0.5], "c": [1.0], "d": [1.0, 1.0, 0.0]}) == 2


def test_published_rows_replace_only_the_harnesses_measured_again(tmp_path) -> None:
    from evaluation.evidence import EvidenceRow

    def rows(harness: str, reward: float) -> list[EvidenceRow]:
        fields = {"experiment": "starting_rewards", "arm": "untrained", "phase": "before", "seed": 0, "suite": "S"}
        return [EvidenceRow(**fields, eval_harness=harness, task_id="t", reward=reward)]

    path = tmp_path / "starting_rewards.jsonl.gz"
    publish_rows(path, rows("Pi", 0.5) + rows("OpenClaw", 0.0))
    publish_rows(path, rows("OpenClaw", 1.0))
    assert {(r.eval_harness, r.reward) for r in read_rows(path)} == {("Pi", 0.5), ("OpenClaw", 1.0)}
