"""The main job (`clawgym main`, the README's first command): GRPO through a real black-box harness.

On the embedded defaults it trains the offline Qwen2.5-Coder-0.5B policy with GRPO through the real pi
CLI on ClawGymBench's easy level, in local bubblewrap sandboxes, measures held-out reward before and
after, and ends with a summary table, a plot and the run directory. `--mix` trains through two harnesses
in one batch (pi and Claude Code); `--whitebox` runs the white-box baseline; `--quick` swaps in the
random tiny model and a few rollouts (a plumbing check, not a learning run).

It is a preset of `trainers.main`'s Hydra config plus a report: every number printed comes from the run's
own metrics.jsonl and summary.json.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from trainers.engine_choice import EngineChoice, UpdateChoice, choose_engine, choose_update, cpu_summary
from trainers.process_memory import TreeSampler, main_process_peak_mb, peak_row, phase_of_peak

# The learning recipe measured on 2 CPU cores (docs/trainers.md, "Learning test"): LoRA at a high rate so a
# few GRPO steps move the policy; one task x 8 rollouts per step, so the group's 1.4k-token pi prompt is
# prefilled once by the engine and packed once by the trainer; 2 calls per rollout (enough to read a file
# and write the answer; the 0.5B model otherwise writes the file again and again), capped rollouts
# verified rather than failed; held-out reward on 16 tasks x 2 rollouts (32, so its noise is small), 8 at
# once as a training step runs them (the machine's default allows 4 here; side by side 8 evaluated faster with
# no failures: `benchmarks.eval_concurrency`, results log), 16 where the engine choice gives vLLM both cores of
# a 2-core machine (trainers/engine_choice.py).
MAIN_OVERRIDES = [
    "algorithm=grpo",
    "model=qwen2.5-coder-0.5b",
    "model.lora.enabled=true",
    "env=clawgym_pi",
    "steps=6",
    "env.group_size=8",
    "env.tasks_per_step=1",
    "env.eval_tasks=16",
    "env.max_concurrency=8",
    "env.options.max_new_tokens=96",
    "env.options.max_calls=2",
    "+env.options.score_capped=true",
    "engine.options.max_batch_size=16",
    "eval.repeats=2",
    "eval.concurrency=8",
    "eval.every=0",
    "checkpoint.every=2",
    "optim.lr=2.0e-4",
]
QUICK_OVERRIDES = [
    "model=tiny-qwen3",
    "steps=2",
    "env.group_size=2",
    "env.tasks_per_step=1",
    "env.eval_tasks=2",
    "checkpoint.every=1",
    "optim.lr=1.0e-4",
]


def main_job_overrides(
    *,
    mix: bool = False,
    whitebox: bool = False,
    quick: bool = False,
    steps: int | None = None,
    run_dir: Path | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """The Hydra overrides of the main job's preset (later entries win)."""
    if mix and whitebox:
        raise ValueError("--mix and --whitebox exclude each other: the white-box baseline is one harness")
    overrides = list(MAIN_OVERRIDES)
    if mix:
        overrides += ["env=clawgym_mixed", "env.ids=[ClawGymBench-Pi,ClawGymBench-ClaudeCode]", "env.tasks_per_step=1"]
    if whitebox:
        overrides += ["env=clawgym_whitebox", "env.tasks_per_step=1"]
    if quick:
        overrides += QUICK_OVERRIDES
        if any(o.startswith("engine=vllm") for o in extra or []):  # vLLM's CPU attention needs head_dim 64
            overrides.append("model=tiny-qwen3-h64")
    if steps is not None:
        overrides.append(f"steps={steps}")
    if run_dir is not None:
        overrides.append(f"run_dir={run_dir}")
    else:
        overrides.append(f"run_dir=runs/main-{time.strftime('%Y%m%d-%H%M%S')}")
    return overrides + list(extra or [])


def pick_engine(quick: bool, extra: list[str]) -> tuple[EngineChoice, list[str]]:
    """The engine for this run and the overrides that select it: the user's `engine=...` wins, the quick
    check keeps the transformers engine (its tiny model), otherwise the machine decides (trainers.engine_choice)."""
    given = [o for o in extra if o.startswith(("engine=", "engine.options.dtype=", "+engine.options.dtype="))]
    if given:
        kind = next((o.split("=", 1)[1] for o in given if o.startswith("engine=")), "transformers")
        dtype = next((o.split("=", 1)[1] for o in given if "dtype=" in o), "the engine's default")
        return EngineChoice(kind=kind, dtype=dtype, reason="given on the command line"), []
    if quick:
        return EngineChoice(kind="transformers", dtype="float32", reason="--quick: the tiny model's plumbing check"), []
    choice = choose_engine()
    return choice, choice.overrides()


def pick_update(quick: bool, extra: list[str]) -> tuple[UpdateChoice, list[str]]:
    """The update's precision and its overrides: the user's `optim.autocast=...` wins, the quick check keeps
    float32, otherwise the machine decides (trainers.engine_choice)."""
    given = next((o.split("=", 1)[1] for o in extra if o.startswith(("optim.autocast=", "+optim.autocast="))), None)
    if given is not None:
        return UpdateChoice(autocast=None if given == "null" else given, reason="given on the command line"), []
    if quick:
        return UpdateChoice(autocast=None, reason="--quick: the tiny model's plumbing check"), []
    choice = choose_update()
    return choice, choice.overrides()


def run_main_job(console: Console | None = None, **kwargs: Any) -> dict[str, Any]:
    """Train with the preset, then print and return the report."""
    from trainers.loop import train
    from trainers.main import compose

    console = console or Console()
    extra = list(kwargs.get("extra") or [])
    engine, engine_overrides = pick_engine(bool(kwargs.get("quick")), extra)
    update, update_overrides = pick_update(bool(kwargs.get("quick")), extra)
    kwargs["extra"] = engine_overrides + update_overrides + extra
    cfg = compose(main_job_overrides(**kwargs))
    console.print(f"engine: {engine.kind} ({engine.dtype}): {engine.reason}")
    console.print(f"update: {update.autocast or 'float32'}: {update.reason}")
    console.print(
        f"[bold]ClawGym main job[/bold]: {cfg.algorithm.name.upper()} on {', '.join(cfg.env.ids)} with "
        f"{cfg.model.name}, {cfg.steps} steps × {cfg.env.tasks_per_step} task(s) × {cfg.env.group_size} rollouts; "
        f"run directory {cfg.run_dir}"
    )
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    with TreeSampler(every_s=1.0) as tree:
        summary = train(cfg)
    wall_s = time.perf_counter() - started
    rows = metrics_rows(Path(cfg.run_dir))
    report = build_report(Path(cfg.run_dir), rows, summary, wall_s)
    at_peak = peak_row(rows) or {}
    report["peak_rss_mb"] = {
        "main_process": main_process_peak_mb(),
        "process_tree": tree.peak_mb,
        "main_process_reached_by": phase_of_peak(rows),
        "main_process_file_backed": at_peak.get("memory/file_mb"),  # of it, mapped files (at the peak's row)
    }
    report["engine"] = engine.model_dump()
    report["update"] = update.model_dump()
    # where the figures came from: machines of this kind differ in speed and CPU features
    report["machine"] = {
        "cpu": cpu_summary(),
        "load_start": round(load_start, 2),
        "load_end": round(os.getloadavg()[0], 2),
        "date": time.strftime("%Y-%m-%d"),
    }
    console.print(render_report(report))
    (Path(cfg.run_dir) / "report.json").write_text(json.dumps(report, indent=2))
    console.print(
        f"run directory: [bold]{cfg.run_dir}[/bold] (recorded calls in rollouts/calls.jsonl, "
        f"checkpoints/, metrics.jsonl, metrics.png, report.json; inspect a rollout with "
        f"`clawgym inspect {cfg.run_dir}/rollouts`)"
    )
    return report


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def build_report(run_dir: Path, rows: list[dict[str, Any]], summary: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """Aggregate the run's metrics rows (its metrics.jsonl) into the numbers the summary table shows."""
    train_rows = [r for r in rows if r.get("kind") == "train"]

    def total(key: str) -> float:
        return float(sum(r.get(key, 0.0) or 0.0 for r in train_rows))

    def mean(key: str) -> float | None:
        values = [r[key] for r in train_rows if r.get(key) is not None and not r.get("update_skipped")]
        return float(sum(values) / len(values)) if values else None

    start, end = summary.get("eval_start") or {}, summary.get("eval_end") or {}
    harnesses = sorted({k.split("/", 1)[1] for k in {**start, **end} if k.startswith("eval_reward/")})
    report: dict[str, Any] = {
        "run_dir": str(run_dir),
        "steps": summary.get("steps"),
        "held_out": {
            h: {"before": start.get(f"eval_reward/{h}"), "after": end.get(f"eval_reward/{h}")} for h in harnesses
        },
        "train_reward_by_step": [r.get("reward_mean") for r in train_rows],
        "rollouts": total("rollouts"),
        "rollouts_failed": total("rollouts_failed"),
        "groups_degenerate": total("groups_degenerate"),
        "groups": total("groups"),
        "groups_extra": total("groups_extra"),
        "groups_extra_useful": total("groups_extra_useful"),
        "updates_skipped": total("update_skipped"),
        "trained_tokens": total("trained_tokens"),
        "unique_tokens": total("unique_tokens"),
        "branch_tokens": total("branch_tokens"),
        "is_ratio_mean": mean("is_ratio_mean"),
        "is_kl_k3": mean("is_kl_k3"),
        "is_clipped_frac": mean("is_clipped_frac"),
        "tree": {k.split("/", 1)[1]: total(k) for k in (train_rows[-1] if train_rows else {}) if k.startswith("tree/")},
        # waited for rollouts: all of their time when synchronous, what the update did not hide when asynchronous
        "time_s": {"rollouts": total("wait_s"), "updates": total("update_s"), "total": wall_s},
        "max_staleness": summary.get("max_staleness", 0),
        "staleness_max": max((r.get("staleness_max", 0.0) for r in train_rows), default=0.0),
        "rollouts_stale_dropped": total("rollouts_stale_dropped"),
        "plot": str(run_dir / "metrics.png"),
        "failures": summary.get("failures") or {},
    }
    time_s = report["time_s"]
    time_s["evaluation_and_setup"] = max(0.0, wall_s - time_s["rollouts"] - time_s["updates"])
    # where that goes: the engine, models and envs built first; the held-out evaluations; the rest (checkpoints,
    # the plot, closing the engine and the sandboxes)
    time_s["setup"] = float(summary.get("setup_s") or 0.0)
    time_s["evaluations"] = float(sum(r.get("eval_s", 0.0) or 0.0 for r in rows if r.get("kind") == "eval"))
    time_s["other"] = max(0.0, time_s["evaluation_and_setup"] - time_s["setup"] - time_s["evaluations"])
    step_s = report["time_s"]["rollouts"] + report["time_s"]["updates"]
    sync_s = total("weight_sync_s")  # inside the updates' time
    report["weight_sync"] = {"seconds": sync_s, "share_of_step_time": sync_s / step_s if step_s else None}
    return report


def render_report(report: dict[str, Any]) -> Table:
    def fmt(value: Any, digits: int = 3) -> str:
        if value is None:
            return "-"
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    table = Table(title="main job summary", show_header=True)
    table.add_column("what")
    table.add_column("value", justify="right")
    for harness, r in report["held_out"].items():
        table.add_row(f"held-out reward, {harness}: before → after", f"{fmt(r['before'])} → {fmt(r['after'])}")
    table.add_row("training reward by step", " ".join(fmt(x, 2) for x in report["train_reward_by_step"]))
    table.add_row("rollouts (failed)", f"{report['rollouts']:.0f} ({report['rollouts_failed']:.0f})")
    reasons = sorted(
        ((n, f"{stage}: {why}") for stage, c in report.get("failures", {}).items() for why, n in c.items()),
        reverse=True,
    )
    for n, why in reasons[:5]:  # training and evaluation rollouts alike
        table.add_row(f"  failure: {why}", f"{n}")
    table.add_row(
        "GRPO groups (degenerate: all rewards equal)", f"{report['groups']:.0f} ({report['groups_degenerate']:.0f})"
    )
    if report.get("groups_extra"):
        table.add_row(
            "dynamic sampling: extra groups (with differing rewards)",
            f"{report['groups_extra']:.0f} ({report['groups_extra_useful']:.0f})",
        )
    table.add_row("updates skipped (no signal)", f"{report['updates_skipped']:.0f}")
    if report.get("max_staleness"):
        table.add_row(
            f"asynchronous (max_staleness {report['max_staleness']}): most versions behind / rollouts dropped",
            f"{report['staleness_max']:.0f} / {report['rollouts_stale_dropped']:.0f}",
        )
    table.add_row(
        "tokens trained (unique tree tokens / branch tokens)",
        f"{report['trained_tokens']:.0f} ({report['unique_tokens']:.0f} / {report['branch_tokens']:.0f})",
    )
    for key, value in report["tree"].items():
        table.add_row(f"tree: {key.replace('_', ' ')}", f"{value:.0f}")
    table.add_row(
        "IS ratio mean / KL (k3) / clipped fraction",
        f"{fmt(report['is_ratio_mean'])} / {fmt(report['is_kl_k3'], 5)} / {fmt(report['is_clipped_frac'])}",
    )
    if report.get("engine"):
        e = report["engine"]
        table.add_row("engine (why)", f"{e['kind']}, {e['dtype']} ({e['reason']})")
    if report.get("update"):
        u = report["update"]
        table.add_row("update precision (why)", f"{u['autocast'] or 'float32'} ({u['reason']})")
    for phase, seconds in report["time_s"].items():
        table.add_row(f"time: {phase.replace('_', ' ')}", f"{seconds:.0f} s")
    sync = report["weight_sync"]
    share = "-" if sync["share_of_step_time"] is None else f"{100 * sync['share_of_step_time']:.1f} %"
    table.add_row("weight sync to the engine (share of step time)", f"{sync['seconds']:.1f} s ({share})")
    rss = report.get("peak_rss_mb")
    if rss:
        notes = [f"main's reached by {rss['main_process_reached_by']}"] if rss.get("main_process_reached_by") else []
        if notes and rss.get("main_process_file_backed") is not None:
            notes.append(f"{rss['main_process_file_backed']:.0f} MB of it mapped files: the weights, libraries")
        when = f" ({'; '.join(notes)})" if notes else ""
        table.add_row(
            "peak RSS: main process / whole process tree",
            f"{rss['main_process']:.0f} / {rss['process_tree']:.0f} MB{when}",
        )
    table.add_row("reward curve", report["plot"])
    return table
