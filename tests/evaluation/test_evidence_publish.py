"""Publishing evidence: a group measured again replaces its rows, except that every draw of the same
evaluation is kept (an untrained policy re-measured with identical settings adds to its baseline)."""

from __future__ import annotations

from pathlib import Path

from evaluation.evidence import EvidenceRow, publish_rows, read_rows
from evaluation.gains import gain


def rows(rewards: list[float], *, evaluation: str | None, arm: str = "untrained", seed: int = 0) -> list[EvidenceRow]:
    phase = "before" if arm == "untrained" else "after"
    return [
        EvidenceRow(
            experiment="m",
            arm=arm,
            phase=phase,
            seed=seed,
            eval_harness="Pi",
            suite="S",
            task_id=f"t{i // 2}",
            repeat=i % 2,
            reward=r,
            evaluation=evaluation,
        )
        for i, r in enumerate(rewards)
    ]


def published(path: Path) -> list[tuple[str, int, float]]:
    return sorted((r.arm, r.draw, r.reward) for r in read_rows(path))


def test_a_second_draw_of_the_same_evaluation_is_added_and_republishing_a_draw_changes_nothing(tmp_path) -> None:
    path = tmp_path / "m.jsonl.gz"
    first, second = rows([1.0, 0.0, 0.5, 0.5], evaluation="abc"), rows([0.0, 0.0, 0.5, 1.0], evaluation="abc")
    publish_rows(path, first + rows([1.0, 1.0, 1.0, 1.0], evaluation="trained", arm="Pi"))
    publish_rows(path, second)
    assert published(path) == sorted(
        [("untrained", 0, r.reward) for r in first]
        + [("untrained", 1, r.reward) for r in second]
        + [("Pi", 0, 1.0)] * 4
    )
    once = read_rows(path)
    publish_rows(path, second)  # the same draw again (read back from a cache): nothing changes
    publish_rows(path, first)
    assert read_rows(path) == once
    # both draws pool into the baseline: before = mean over tasks of (1, 0, 0, 0) and (0.5, 0.5, 0.5, 1)
    pooled = gain(once, "Pi", "Pi", suite="S", n_resamples=10)
    assert pooled.value == 1.0 - (0.25 + 0.625) / 2 and pooled.rollouts_before == 8


def test_an_evaluation_under_other_settings_or_without_an_identity_replaces_the_earlier_rows(tmp_path) -> None:
    path = tmp_path / "m.jsonl.gz"
    publish_rows(path, rows([1.0, 1.0], evaluation="abc"))
    publish_rows(path, rows([0.0, 0.5], evaluation="changed-harness-code"))
    assert published(path) == [("untrained", 0, 0.0), ("untrained", 0, 0.5)]
    publish_rows(path, rows([0.25, 0.25], evaluation=None))  # rows that cannot say what they measured
    assert published(path) == [("untrained", 0, 0.25), ("untrained", 0, 0.25)]
    publish_rows(path, rows([1.0, 1.0], evaluation="abc"))
    publish_rows(path, rows([0.0, 0.0], evaluation="abc", seed=1))  # other groups are left alone
    assert published(path) == [
        ("untrained", 0, 0.0),
        ("untrained", 0, 0.0),
        ("untrained", 0, 1.0),
        ("untrained", 0, 1.0),
    ]
