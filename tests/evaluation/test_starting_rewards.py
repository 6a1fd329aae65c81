"""benchmarks.starting_rewards end to end on the tiny model: one greedy rollout, a row per harness."""

import json

from benchmarks.starting_rewards import RECIPE_LIMITS, main


def test_one_row_per_harness_with_the_recipe_limits(tmp_path) -> None:
    rows = main(["--model", "tiny-qwen3", "--count", "1", "--harnesses", "WhiteBox", "--out", str(tmp_path)])
    assert [row["harness"] for row in rows] == ["WhiteBox"]
    assert rows[0]["rollouts"] == 1 and rows[0]["failed"] == 0
    assert 0.0 <= rows[0]["mean_reward"] <= 1.0
    assert json.loads((tmp_path / "starting_rewards.json").read_text())[0]["harness"] == "WhiteBox"
    results = json.loads((tmp_path / "WhiteBox" / "results.json").read_text())
    assert results["rows"][0]["num_calls"] <= RECIPE_LIMITS["max_calls"]
