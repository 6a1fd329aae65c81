"""Starting rewards: what the untrained policy scores in each harness before any training.

A harness that starts at 0 gives GRPO no signal (every group is degenerate), so the transfer matrix
(docs/experiments.md) is only worth running where each harness starts above 0. This runs the untrained
policy greedily (T=0, one rollout per task) on the same held-out tasks through each harness, with the
learning recipe's per-call limits (`trainers.main_job.MAIN_OVERRIDES`) and the matrix's adapter options
(`benchmarks.transfer_matrix.HARNESS_OPTIONS`: OpenClaw through the chat API), and prints one row per harness:

    .venv/bin/python -m benchmarks.starting_rewards                     # 0.5B policy, 8 tasks, 4 harnesses
    .venv/bin/python -m benchmarks.starting_rewards --harnesses OpenClaw --publish docs/results   # one harness
    .venv/bin/python -m benchmarks.starting_rewards --samples 8 --engine vllm --harnesses ClaudeCode --suite JobBench
    .venv/bin/python -m benchmarks.starting_rewards --model tiny-qwen3 --count 1 --harnesses Pi   # plumbing

A greedy start ranks harnesses only roughly; whether GRPO can learn depends on the groups it will sample.
`--samples K` draws K rollouts per task at the training temperature (`algorithm.temperature`, 1.0), a GRPO
group each, and counts the groups whose rewards differ (the others teach nothing).

Every rollout is an `evaluation.evidence.EvidenceRow` (arm "untrained", phase "before") in
<out>/evidence.jsonl.gz; `--publish DIR` merges them into DIR/starting_rewards.jsonl.gz (greedy) or
DIR/starting_signal.jsonl.gz (sampled groups), replacing the rows of the harnesses measured again, so the
docs' tables (`benchmarks.experiment_report`) are rebuilt from them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.transfer_matrix import HARNESS_OPTIONS
from clawgym_env.interfaces import ClosableEngine
from evaluation import evaluate, make_eval_policy
from evaluation.evidence import (
    UNTRAINED,
    EvidenceRow,
    groups_with_signal,
    publish_rows,
    rows_from_report,
    write_rows,
)
from evaluation.report import EvalReport

# The learning recipe's limits (trainers/main_job.py, MAIN_OVERRIDES), as env options.
RECIPE_LIMITS = {"max_new_tokens": 96, "max_calls": 2, "score_capped": True}
HARNESSES = ["WhiteBox", "Pi", "ClaudeCode", "OpenClaw"]
EXPERIMENT = "starting_rewards"  # greedy, one rollout per task
SIGNAL_EXPERIMENT = "starting_signal"  # sampled groups, K rollouts per task
TRAINING_TEMPERATURE = 1.0  # trainers/conf/algorithm/grpo.yaml: the temperature a GRPO group is sampled at


def experiment_for(samples: int) -> str:
    """Where a run's rows are stored: greedy starts and sampled groups are separate experiments."""
    return EXPERIMENT if samples == 1 else SIGNAL_EXPERIMENT


def summary_row(harness: str, report: EvalReport) -> dict[str, object]:
    """One harness's evaluation as a table row: its stats, full successes, groups with signal, failures, time."""
    (stats,) = report.by_env.values()
    rewards_by_task: dict[str, list[float]] = {}
    for row in report.rows:
        rewards_by_task.setdefault(row.task_id, []).append(row.reward)
    reasons = {f"{stage}: {reason}": n for stage, by in report.failure_reasons.items() for reason, n in by.items()}
    return {
        "harness": harness,
        **stats.model_dump(mode="json"),
        "successes": sum(row.success for row in report.rows),
        "groups_with_signal": groups_with_signal(rewards_by_task),
        "failure_reasons": reasons,
        "wall_s": report.wall_s,
    }


def starting_rewards(
    model: str,
    harnesses: list[str],
    *,
    suite: str,
    level: int,
    count: int,
    out: Path,
    concurrency: int | None,
    rollout_timeout_s: float,
    samples: int = 1,
    engine: str = "transformers",
    evidence: list[EvidenceRow] | None = None,
) -> list[dict[str, object]]:
    """One evaluation per harness (greedy, or `samples` rollouts per task at the training temperature); a row
    each with mean reward, successes, failures, groups whose rewards differ, and time.

    The rollout limit is generous on purpose: a timeout scores 0 and would measure the machine's load,
    not the policy (a CPU prefill of Claude Code's ~4k-token prompt takes minutes on a loaded 2-core box)."""
    policy = make_eval_policy(model, engine=engine)
    rows = []
    try:
        for harness in harnesses:
            adapter = {"harness_options": HARNESS_OPTIONS[harness]} if harness in HARNESS_OPTIONS else {}
            report = evaluate(
                policy,
                [f"{suite}-{harness}"],
                split="test",
                level=level,
                count=count,
                repeats=samples,
                temperature=0.0 if samples == 1 else TRAINING_TEMPERATURE,
                concurrency=concurrency,
                env_overrides={**RECIPE_LIMITS, "rollout_timeout_s": rollout_timeout_s, **adapter},
                run_dir=out / harness,
                model_name=model,
                progress=False,
            )
            if evidence is not None:
                fields = {"experiment": experiment_for(samples), "arm": UNTRAINED, "phase": "before", "seed": 0}
                evidence += rows_from_report(report, **fields, commit=report.commit or "unknown")
            rows.append(summary_row(harness, report))
    finally:
        served = getattr(policy, "engine", None)  # scripted policies have none
        if isinstance(served, ClosableEngine):  # an in-process vLLM engine stops its core process
            served.close()
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--harnesses", nargs="+", default=HARNESSES)
    parser.add_argument("--suite", default="ClawGymBench")
    parser.add_argument("--level", type=int, default=0)
    parser.add_argument("--count", type=int, default=8, help="held-out task instances per harness")
    parser.add_argument("--samples", type=int, default=1, help="rollouts per task: 1 greedy, K>1 a group at T=1")
    parser.add_argument(
        "--engine", choices=["transformers", "vllm"], default="transformers", help="vllm: as the matrix evaluates"
    )
    parser.add_argument("--concurrency", type=int, default=None, help="rollouts at once (default: machine's)")
    parser.add_argument("--rollout-timeout-s", type=float, default=1800.0, help="per rollout (timeouts score 0)")
    parser.add_argument("--out", type=Path, default=Path("runs") / "starting-rewards")
    parser.add_argument("--publish", type=Path, help="merge the rows into DIR/starting_rewards.jsonl.gz")
    args = parser.parse_args(argv)
    evidence: list[EvidenceRow] = []
    rows = starting_rewards(
        args.model,
        args.harnesses,
        suite=args.suite,
        level=args.level,
        count=args.count,
        out=args.out,
        concurrency=args.concurrency,
        rollout_timeout_s=args.rollout_timeout_s,
        samples=args.samples,
        engine=args.engine,
        evidence=evidence,
    )
    write_rows(args.out / "evidence.jsonl.gz", evidence)
    if args.publish is not None:
        publish_rows(args.publish / f"{experiment_for(args.samples)}.jsonl.gz", evidence)
    sampling = "greedy, 1 rollout/task" if args.samples == 1 else f"{args.samples} rollouts/task at T=1"
    table = Table(title=f"starting rewards: {args.model}, {args.suite} level {args.level}, {sampling}")
    for column in ("harness", "mean reward", "successes", "groups with signal", "failed", "wall s", "failure reasons"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            str(row["harness"]),
            f"{row['mean_reward']:.3f}",
            f"{row['successes']}/{row['rollouts']}",
            f"{row['groups_with_signal']}/{args.count}" if args.samples > 1 else "-",
            str(row["failed"]),
            f"{row['wall_s']:.0f}",
            ", ".join(f"{k} x{n}" for k, n in row["failure_reasons"].items()) or "-",
        )
    Console(width=160).print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "starting_rewards.json").write_text(json.dumps(rows, indent=2, default=str))
    return rows


if __name__ == "__main__":
    main()
