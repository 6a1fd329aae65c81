"""The `clawgym` command: list environments, run/evaluate a policy, train, inspect, calls, compare, health.

Each subcommand is a thin layer over the Python API, so anything the CLI does a user's script can do. This
module is the composition root: it imports every layer, and no layer imports it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from clawgym_env.layers import LAYERS

app = typer.Typer(
    name="clawgym",
    help="Black-box RL of LLM agents through real, unmodified agent harnesses.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
PIPE_WIDTH = 160
"""Console width when the output is piped or captured: rich would fall back to 80 and squash table columns."""


def make_console() -> Console:
    """The command's console: the terminal's width, or PIPE_WIDTH when not a terminal (unless COLUMNS is set)."""
    console = Console()
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(width=PIPE_WIDTH)
    return console


console = make_console()


def load(module: str, attr: str, feature: str) -> Any:
    """Import a command's implementation on first use (so `clawgym list` does not load torch).

    A third-party package that is not installed is named, with how to install it, and the command exits 2;
    any other import error (one of ClawGym's own modules, a broken install) is raised as it is, never hidden.
    """
    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if not missing or missing in LAYERS:
            raise
        console.print(
            f"[red]{feature} needs the Python package {missing!r}, which is not installed ({exc}).[/red] "
            "Install ClawGym's dependencies with `bash scripts/setup.sh` (or `pip install -e '.[dev]'`)."
        )
        raise typer.Exit(code=2) from exc


@app.command("list")
def list_envs(
    suite: Annotated[str | None, typer.Option(help="only this suite")] = None,
    harness: Annotated[str | None, typer.Option(help="only this harness")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """List the registered environments (<Suite>-<Harness>)."""
    import clawgym_env

    reg = clawgym_env.registry
    specs = [reg.envs[i] for i in reg.list()]
    specs = [s for s in specs if (suite is None or s.suite == suite) and (harness is None or s.harness == harness)]
    if as_json:
        print(json.dumps([{"id": s.id, "suite": s.suite, "harness": s.harness} for s in specs], indent=1))
        return
    table = Table(title=f"{len(specs)} environments")
    for col in ("id", "suite", "harness", "api style", "harness version"):
        table.add_column(col)
    for s in specs:
        h = reg.harnesses[s.harness]
        table.add_row(s.id, s.suite, s.harness, h.api_style.value, h.version or "-")
    console.print(table)


@app.command()
def run(
    env_id: Annotated[str, typer.Argument(help="environment id, e.g. ClawGymBench-ClaudeCode")],
    model: Annotated[
        str, typer.Option(help="policy model: tiny-qwen3, smollm2-135m, qwen2.5-coder-0.5b or a path")
    ] = "tiny-qwen3",
    seed: Annotated[int, typer.Option(help="picks the task instance")] = 0,
    task_id: Annotated[str | None, typer.Option(help="run this task instead of a seeded pick")] = None,
    split: Annotated[str, typer.Option(help="train or test")] = "train",
    run_dir: Annotated[Path | None, typer.Option(help="where calls, forests and artifacts go")] = None,
) -> None:
    """Run one rollout of a policy on an environment and print its reward and tree statistics."""
    import clawgym_env
    from clawgym_env.policies import make_policy

    overrides: dict = {"split": split}
    if run_dir:
        overrides["run_dir"] = run_dir
    env = clawgym_env.make(env_id, **overrides)
    policy = make_policy(model)
    env.reset(seed=seed, options={"task_id": task_id} if task_id else None)
    forest, reward, _, truncated, info = env.step(policy)
    console.print(forest)
    console.print({k: info[k] for k in ("status", "failure", "subscores", "num_calls", "forest_stats", "timings")})
    console.print(f"reward [bold]{reward:.3f}[/bold]; run directory: {env.run_dir}")
    env.close()
    raise typer.Exit(code=1 if truncated else 0)


@app.command()
def evaluate(
    env_ids: Annotated[list[str], typer.Argument(help="one or more environment ids")],
    model: Annotated[
        str, typer.Option(help="zoo name, local path, or scripted:reference|wrong|idle (test doubles)")
    ] = "tiny-qwen3",
    repeats: Annotated[int, typer.Option(help="rollouts per task instance")] = 1,
    split: Annotated[str, typer.Option(help="train or test (held out)")] = "test",
    level: Annotated[int | None, typer.Option(help="difficulty level (default: all levels)")] = None,
    count: Annotated[int | None, typer.Option(help="task instances per env (default: the whole split)")] = None,
    concurrency: Annotated[int, typer.Option(help="rollouts at a time")] = 2,
    out: Annotated[Path | None, typer.Option(help="run directory for results.json, table.txt, eval.png")] = None,
    seed: Annotated[int, typer.Option(help="suite generation seed")] = 0,
    threshold: Annotated[float, typer.Option(help="success = reward >= threshold")] = 1.0,
    engine: Annotated[str, typer.Option(help="transformers, vllm or remote")] = "transformers",
    temperature: Annotated[float | None, typer.Option(help="sampling temperature (default: the env's)")] = None,
    proxy_shards: Annotated[int, typer.Option(help="proxy processes (above 1: a ShardedProxy)")] = 1,
) -> None:
    """Evaluate a policy on environments and write a results table (JSON, text, PNG plot)."""
    make_eval_policy = load("evaluation", "make_eval_policy", "evaluation")
    run_evaluation = load("evaluation", "evaluate", "evaluation")
    report = run_evaluation(
        make_eval_policy(model, engine=engine),
        list(env_ids),
        split=split,
        repeats=repeats,
        concurrency=concurrency,
        level=level,
        count=count,
        seed=seed,
        run_dir=out,
        success_threshold=threshold,
        temperature=temperature,
        model_name=model,
        proxy_shards=proxy_shards,
    )
    report.console_print(console)
    for stage, reasons in report.failure_reasons.items():
        for reason, n in list(reasons.items())[:3]:
            console.print(f"[yellow]failed at {stage} x{n}:[/yellow] {reason}")
    console.print(f"results: {report.results_path}\ntable: {report.table_path}\nplot: {report.plot_path}")
    # every rollout failing is a broken set-up (harness, sandbox), not a score
    raise typer.Exit(code=1 if all(r.status != "ok" for r in report.rows) else 0)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def main(
    ctx: typer.Context,
    mix: Annotated[bool, typer.Option("--mix", help="two harnesses (pi + Claude Code) in one batch")] = False,
    whitebox: Annotated[
        bool, typer.Option("--whitebox", help="the white-box baseline instead of a CLI harness")
    ] = False,
    quick: Annotated[bool, typer.Option("--quick", help="tiny random model, few rollouts: a plumbing check")] = False,
    steps: Annotated[int | None, typer.Option(help="training steps (default: the preset's)")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="default: runs/main-<time>")] = None,
) -> None:
    """The main job: GRPO through a real black-box harness on the embedded defaults, then a summary.

    Extra Hydra overrides may follow, e.g. `clawgym main optim.lr=1e-5 env.group_size=8`.
    """
    run_main_job = load("trainers.main_job", "run_main_job", "the main job")
    run_main_job(console, mix=mix, whitebox=whitebox, quick=quick, steps=steps, run_dir=run_dir, extra=list(ctx.args))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def train(ctx: typer.Context) -> None:
    """Train with the bundled GRPO/PPO trainers (Hydra overrides follow, e.g. algorithm=ppo; --help lists them)."""
    if {"--help", "-h"} & set(ctx.args):
        from trainers.config_help import help_text

        print(help_text())
        return
    train_main = load("trainers.main", "main", "training")
    sys.argv = ["clawgym-train", *ctx.args]
    train_main()


@app.command()
def inspect(
    run_dir: Annotated[Path, typer.Argument(help="a run directory or its calls.jsonl")],
    rollout: Annotated[str | None, typer.Option(help="rollout id (default: the first)")] = None,
) -> None:
    """Show a recorded rollout's prefix tree in the terminal and write an HTML page."""
    inspect_run = load("clawgym_env.trajectory.inspect", "inspect_run", "the tree inspector")
    text, html_path = inspect_run(run_dir, rollout)
    console.print(text)
    console.print(f"HTML: {html_path}")


@app.command()
def calls(
    run_dir: Annotated[Path, typer.Argument(help="a run directory or its calls.jsonl")],
    rollout: Annotated[str | None, typer.Option(help="only this rollout's calls")] = None,
) -> None:
    """Print the recorded calls whole, one JSON line each (for jq and your own scripts).

    A log line holds only what its call adds to its rollout's earlier lines; this puts each call back together.
    """
    find_calls_file = load("clawgym_env.trajectory.inspect", "find_calls_file", "the call log reader")
    read_calls = load("clawgym_env.records", "read_calls", "the call log reader")
    record_line = load("clawgym_env.records", "record_line", "the call log reader")
    reader = read_calls(find_calls_file(run_dir, rollout), rollout)
    out = sys.stdout.buffer
    for call in reader:
        out.write(record_line(call))
    out.flush()
    if reader.torn_lines:
        print(f"{reader.torn_lines} torn line(s) skipped (a writer was killed mid-line)", file=sys.stderr)


@app.command()
def compare(
    suite: Annotated[str, typer.Option(help="task suite")] = "ClawGymBench",
    harness: Annotated[str, typer.Option(help="the black-box harness: Pi, ClaudeCode, Codex or OpenClaw")] = "Pi",
    model: Annotated[
        str, typer.Option(help="starting policy: tiny-qwen3, smollm2-135m, qwen2.5-coder-0.5b or a path")
    ] = "tiny-qwen3",
    algorithm: Annotated[str, typer.Option(help="grpo or ppo")] = "grpo",
    steps: Annotated[int, typer.Option(help="training steps of each run")] = 2,
    group_size: Annotated[int, typer.Option(help="rollouts per task per step")] = 2,
    tasks_per_step: Annotated[int, typer.Option(help="training tasks per step")] = 1,
    train_tasks: Annotated[int | None, typer.Option(help="training task instances (default 2)")] = 2,
    eval_tasks: Annotated[int | None, typer.Option(help="held-out task instances per harness")] = 2,
    level: Annotated[int | None, typer.Option(help="difficulty level")] = 0,
    repeats: Annotated[int, typer.Option(help="evaluation rollouts per held-out task")] = 1,
    concurrency: Annotated[int, typer.Option(help="rollouts at a time")] = 2,
    lr: Annotated[float, typer.Option(help="learning rate")] = 1e-5,
    max_new_tokens: Annotated[int, typer.Option(help="per-call cap on generated tokens")] = 64,
    max_calls: Annotated[int, typer.Option(help="per-rollout cap on model calls")] = 4,
    warm_start: Annotated[bool, typer.Option(help="SFT on reference demonstrations before RL")] = False,
    seed: Annotated[int, typer.Option(help="training and suite seed")] = 0,
    override: Annotated[
        list[str] | None, typer.Option(help="extra Hydra override for both trainings (repeatable)")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="output folder (default runs/compare-<time>)")] = None,
) -> None:
    """Train white-box and black-box, evaluate both under both, print the 2x2 table."""
    compare_cli = load("clawgym_cli.compare", "compare_cli", "the white-box vs black-box comparison")
    compare_cli(
        console=console,
        suite=suite,
        harness=harness,
        model=model,
        algorithm=algorithm,
        steps=steps,
        group_size=group_size,
        tasks_per_step=tasks_per_step,
        train_tasks=train_tasks,
        eval_tasks=eval_tasks,
        level=level,
        repeats=repeats,
        concurrency=concurrency,
        lr=lr,
        max_new_tokens=max_new_tokens,
        max_calls=max_calls,
        warm_start=warm_start,
        seed=seed,
        train_overrides=list(override or []),
        out=out,
    )


@app.command()
def health() -> None:
    """Check each installed harness end to end and print a table."""
    health_cli = load("harness_adapters.health", "health_cli", "the harness health check")
    health_cli(console=console)


if __name__ == "__main__":  # pragma: no cover
    app()
