"""The experiments' tables in the docs are what the committed evidence files give (benchmarks.experiment_report)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from benchmarks.experiment_report import DOCS, MARKER, blocks, main, rewrite
from evaluation.evidence import EvidenceRow, write_rows


def test_the_docs_say_what_the_stored_rows_say() -> None:
    assert main(["--check"]) == 0, "run `python -m benchmarks.experiment_report` and commit the docs"
    names = {m["name"] for doc in DOCS for m in MARKER.finditer(doc.read_text())}
    assert {"starting-rewards", "transfer-matrix", "transfer-claims", "readme-summary"} <= names


def _matrix_rows(gains: dict[str, float]) -> list[EvidenceRow]:
    """4 seeds x 4 tasks x 2 rollouts: untrained scores 0.25 everywhere, each arm adds its gain in its own harness."""
    rows = []
    for seed in range(4):
        for task in range(4):
            for rep in range(2):
                base = 0.5 if (seed + task + rep) % 2 else 0.0
                common = {"experiment": "transfer_matrix", "seed": seed, "suite": "ClawGymBench", "task_id": f"t{task}"}
                unseen = common | {"suite": "PinchBench"}  # no arm moves there
                for arm in ("untrained", *gains):
                    phase = "before" if arm == "untrained" else "after"
                    rows.append(EvidenceRow(**unseen, arm=arm, phase=phase, eval_harness="WhiteBox", reward=base))
                for h in ("WhiteBox", "OpenClaw"):
                    rows.append(EvidenceRow(**common, arm="untrained", phase="before", eval_harness=h, reward=base))
                    for arm, g in gains.items():
                        reward = min(1.0, base + (g if arm == h else 0.0))
                        rows.append(
                            EvidenceRow(**common, arm=arm, phase="after", eval_harness=h, reward=reward, repeat=rep)
                        )
                for arm, g in gains.items():  # an arm that gains nothing had no signal in training either
                    reward = base if g else 0.0
                    rows.append(EvidenceRow(**common, arm=arm, phase="train", step=1, eval_harness=arm, reward=reward))
    return rows


def test_a_number_that_differs_from_the_files_fails_the_check(tmp_path: Path) -> None:
    write_rows(tmp_path / "transfer_matrix.jsonl.gz", _matrix_rows({"WhiteBox": 0.5, "OpenClaw": 0.0}))
    generated = blocks(tmp_path)
    table = generated["transfer-matrix"]
    assert "| WhiteBox | 0.750: +0.500 [" in table and "**shown**, holds for 4 comparisons (n=4)" in table
    assert "| OpenClaw | 0.250: +0.000 [-0.125, +0.125], no change detectable (n=4)" in table
    assert "| untrained | 0.250 (4 seeds) | 0.250 (4 seeds) |" in table
    # budgets: seeds, steps, training rollouts per seed, degenerate groups (a group: seed, step, harness, task)
    assert "| OpenClaw | 4 | 1/1/1/1 | 8 | 16/16 (100%) | 0 (0) | 0.000 |" in table
    assert "| WhiteBox | 4 | 1/1/1/1 | 8 | 0/16 (0%) | 0 (0) | 0.250 |" in table
    assert "ClawGymBench" not in generated["transfer-unseen"]
    unseen = generated["transfer-unseen"]
    assert unseen.startswith("PinchBench (level 0, never trained on; 2 cells):")
    assert "| WhiteBox | 0.250: +0.000 [" in unseen and "**shown**" not in unseen
    claims = generated["transfer-claims"]
    assert claims.startswith("Read off one table of 4 cells") and "the largest gain in the white-box column" in claims
    doc = "intro\n<!-- generated: transfer-matrix -->\nstale 0.999\n<!-- end generated: transfer-matrix -->\nend\n"
    fresh = rewrite(doc, generated)
    assert "stale" not in fresh and fresh.startswith("intro\n") and fresh.endswith("end\n") and table in fresh
    assert rewrite(fresh, generated) == fresh
    with pytest.raises(KeyError, match="unknown generated block"):
        rewrite("<!-- generated: nope -->\nx<!-- end generated: nope -->", generated)


def test_an_arm_still_training_shows_its_signal_but_no_cell(tmp_path: Path) -> None:
    """An unfinished run's training rows (`transfer_matrix --plan --publish`) enter the signal table, not the matrix."""
    rows = _matrix_rows({"WhiteBox": 0.5})
    common = {"experiment": "transfer_matrix", "arm": "ClaudeCode", "phase": "train", "eval_harness": "ClaudeCode"}
    common |= {"suite": "ClawGymBench"}
    rows += [
        EvidenceRow(**common, seed=0, step=s, task_id=f"t{s}", reward=float(s == 2 and i == 0))
        for s in (1, 2, 3)
        for i in range(4)
    ]
    table = blocks_from(tmp_path, rows)["transfer-matrix"]
    assert "| ClaudeCode (not evaluated yet) | 1 | 3 | 12 | 2/3 (67%) | 0 (0) | 0.083 | 92% / 0% / 8% |" in table
    assert "| ClaudeCode |" not in table.split("Training budgets")[0]  # no matrix row without an evaluation


def blocks_from(folder: Path, rows: list[EvidenceRow]) -> dict[str, str]:
    write_rows(folder / "transfer_matrix.jsonl.gz", rows)
    return blocks(folder)


def test_without_stored_rows_a_block_says_how_to_make_them(tmp_path: Path) -> None:
    generated = blocks(tmp_path)
    assert generated["starting-rewards"].startswith("No stored run yet: `python -m benchmarks.starting_rewards")
    assert generated["transfer-matrix"].startswith("No stored run yet: `python -m benchmarks.transfer_matrix")


def test_an_arm_trained_on_another_suite_gets_its_own_table(tmp_path: Path) -> None:
    """`transfer_matrix --suite S` publishes transfer_matrix_S.jsonl.gz; its table is computed like the matrix's."""
    rows = [
        r.model_copy(update={"experiment": "transfer_matrix_OfficeQAEasy", "suite": "OfficeQAEasy"})
        for r in _matrix_rows({"WhiteBox": 0.5})
        if r.suite == "ClawGymBench"
    ]
    write_rows(tmp_path / "transfer_matrix_OfficeQAEasy.jsonl.gz", rows)
    block = blocks(tmp_path)["other-suites"]
    assert block.startswith("OfficeQAEasy (level 0; 2 cells), from `docs/results/transfer_matrix_OfficeQAEasy")
    assert "| WhiteBox | 0.750: +0.500 [" in block and "**shown**, holds for 2 comparisons (n=4)" in block
    assert "| WhiteBox | 4 | 1/1/1/1 | 8 | 0/16 (0%) | 0 (0) | 0.250 |" in block  # its training signal
    assert blocks(tmp_path)["transfer-matrix"].startswith("No stored run yet")  # the ClawGymBench matrix is apart
    assert blocks(tmp_path / "empty")["other-suites"].startswith("No stored run yet: `python -m benchmarks.transfer")
    # with a ClawGymBench matrix too, the README's summary lists the other suite's own-harness cell after its own
    write_rows(tmp_path / "transfer_matrix.jsonl.gz", _matrix_rows({"WhiteBox": 0.25}))
    summary = blocks(tmp_path)["readme-summary"]
    own = summary.index("- trained and evaluated in WhiteBox: +0.250 [")
    assert own < summary.index("- OfficeQAEasy level 0, trained and evaluated in WhiteBox: +0.500 [")


def test_sampled_starting_groups_count_those_whose_rewards_differ(tmp_path: Path) -> None:
    """Two tasks x 4 rollouts: one group all zero (no GRPO signal), one with a half and a full success."""
    fields = {"experiment": "starting_signal", "arm": "untrained", "phase": "before", "seed": 0}
    rewards = {"flat": [0.0, 0.0, 0.0, 0.0], "mixed": [0.0, 0.5, 1.0, 0.0]}
    rows = [
        EvidenceRow(**fields, eval_harness="OpenClaw", suite="ClawGymBench", task_id=task, repeat=i, reward=r)
        for task, rs in rewards.items()
        for i, r in enumerate(rs)
    ]
    write_rows(tmp_path / "starting_signal.jsonl.gz", rows)
    block = blocks(tmp_path)["starting-signal"]
    assert "| ClawGymBench | OpenClaw | 2 x 4 | 0.188 | 75% / 12% / 12% | 1/2 | 0 | unknown |" in block
    assert blocks(tmp_path / "empty")["starting-signal"].startswith("No stored run yet")


def test_published_files_are_readable_with_the_standard_library() -> None:
    for path in (Path(__file__).resolve().parents[2] / "docs" / "results").glob("*.jsonl.gz"):
        with gzip.open(path, "rt") as f:
            first = f.readline()
        if path.name.endswith("_steps.jsonl.gz"):  # a benchmark's per-step timings, not rollouts
            assert '"arm"' in first and '"step_s"' in first, path
            continue
        if path.name == "proxy_ab.jsonl.gz":  # a speed benchmark: one figure per checkout and round
            assert '"side"' in first and '"figure"' in first and '"value"' in first, path
            continue
        assert '"arm"' in first and '"reward"' in first, path


def test_the_proxy_ab_table_gives_medians_and_ratios() -> None:
    from benchmarks.proxy_ab import ab_table

    rows = [
        {
            "side": side,
            "commit": side[:1],
            "round": r,
            "figure": "handler_us_4_calls",
            "value": v,
            "load": 1.0,
            "cpu": "x",
        }
        for side, values in (("before", [300, 310, 290]), ("after", [330, 320, 600]))
        for r, v in enumerate(values)
    ]
    table = ab_table(rows)
    assert "| handler CPU per call, 4-call rollouts (µs) | 300.00 | 330.00 | 1.10 |" in table
    assert "Medians of 3 alternated rounds" in table and "calls per proxy" not in table


def test_a_ppo_arm_is_compared_with_grpo_in_its_harness(tmp_path: Path) -> None:
    """The article's PPO against GRPO through Claude Code: claim 5 gives both gains and their difference."""
    rows = []
    for seed in range(4):
        for task in range(4):
            for rep in range(2):
                base = 0.5 if (seed + task + rep) % 2 else 0.0
                common = {"experiment": "transfer_matrix", "seed": seed, "suite": "ClawGymBench", "task_id": f"t{task}"}
                common |= {"eval_harness": "ClaudeCode", "repeat": rep}
                rows.append(EvidenceRow(**common, arm="untrained", phase="before", reward=base))
                for arm in ("ClaudeCode", "ClaudeCode-PPO"):
                    rows.append(EvidenceRow(**common, arm=arm, phase="after", reward=min(1.0, base + 0.5)))
    write_rows(tmp_path / "transfer_matrix.jsonl.gz", rows)
    claims = blocks(tmp_path)["transfer-claims"]
    line = next(x for x in claims.splitlines() if x.startswith("5. "))
    assert "*PPO and GRPO both train through ClaudeCode and end close*" in line
    assert "PPO minus GRPO +0.000" in line and "no difference detectable" in line


def test_dynamic_sampling_is_compared_with_its_plain_arm_and_its_extra_groups_counted(tmp_path: Path) -> None:
    """The DS variant's claim gives both gains and the difference; its extra groups show in the signal table."""
    rows = []
    for seed in range(4):
        for task in range(4):
            for rep in range(2):
                common = {"experiment": "transfer_matrix", "seed": seed, "suite": "ClawGymBench", "task_id": f"t{task}"}
                common |= {"eval_harness": "OpenClaw", "repeat": rep}
                rows.append(EvidenceRow(**common, arm="untrained", phase="before", reward=0.0))
                rows.append(EvidenceRow(**common, arm="OpenClaw", phase="after", reward=0.0))
                rows.append(EvidenceRow(**common, arm="OpenClaw-DS", phase="after", reward=0.5 * (task % 2)))
        train = {"experiment": "transfer_matrix", "seed": seed, "suite": "ClawGymBench", "eval_harness": "OpenClaw"}
        for i in range(2):  # one plain group scoring all 0, then one extra group with differing rewards
            rows.append(EvidenceRow(**train, arm="OpenClaw-DS", phase="train", step=1, task_id="a", reward=0.0))
            rows.append(
                EvidenceRow(
                    **train, arm="OpenClaw-DS", phase="train", step=1, task_id="b", reward=float(i), extra_group=True
                )
            )
    generated = blocks_from(tmp_path, rows)
    assert "| OpenClaw-DS | 4 | 1/1/1/1 | 4 | 4/8 (50%) | 4 (4) | 0.250 |" in generated["transfer-matrix"]
    line = next(x for x in generated["transfer-claims"].splitlines() if x.startswith("5. "))
    assert line.startswith("5. *Dynamic sampling gives OpenClaw more to learn from*: dynamic sampling +0.250 [")
    assert "dynamic sampling minus plain GRPO +0.250 [" in line
    # on another suite the same comparison follows that suite's tables
    other = [r.model_copy(update={"experiment": "transfer_matrix_JobBenchEasy", "suite": "JobBenchEasy"}) for r in rows]
    write_rows(tmp_path / "transfer_matrix_JobBenchEasy.jsonl.gz", other)
    block = blocks(tmp_path)["other-suites"]
    assert block.index("| OpenClaw-DS | 4 |") < block.index("- *Dynamic sampling gives OpenClaw more to learn from*")
    assert "dynamic sampling minus plain GRPO +0.250 [" in block


def test_proxy_ab_rows_are_kept_per_change() -> None:
    from benchmarks.proxy_ab import FIRST_CHANGE, by_change

    rows = [{"figure": "f", "side": "before"}, {"change": "records", "figure": "f", "side": "after"}]
    assert list(by_change(rows)) == [FIRST_CHANGE, "records"]  # rows stored before changes had names: the first
