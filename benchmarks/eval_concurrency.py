"""The main job's held-out evaluation at different concurrencies, side by side in one run.

    .venv/bin/python -m benchmarks.eval_concurrency                       # 4 vs 8 rollouts at once, A B A B
    .venv/bin/python -m benchmarks.eval_concurrency --concurrency 4 8 16 --rounds 1
    .venv/bin/python -m benchmarks.eval_concurrency --concurrency 8 --omp-bind auto 0-1   # vLLM on 1 core vs 2
    .venv/bin/python -m benchmarks.eval_concurrency --quick               # tiny model, 2 tasks (plumbing)

The main job spends as long in its two held-out evaluations as in its six training steps' rollouts, yet
evaluates fewer rollouts at once than it trains with: `evaluation.default_concurrency()` allows two per
core (4 here) while a training step runs `env.max_concurrency` (8). This runs the main job's own evaluation
(`trainers.loop.held_out_reward` on its config: engine, tasks, harness, limits, temperature) with the
untrained policy at each concurrency, the concurrencies alternating for `--rounds`, and prints the median
seconds per evaluation, rollouts per second and the ratio against the first concurrency. Rewards are printed
too: a concurrency that starves rollouts into timeouts would score lower, and faster would not be better.

`--omp-bind` adds a second axis, for in-process vLLM on CPU: where its OpenMP threads run. vLLM's automatic
binding keeps one core for its scheduler process, so on a 2-core machine the model runs on one core while the
other serves the scheduler, the proxy and the harnesses; `0-1` gives the model both (and makes it share them).
Each binding starts its own engine each round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.headline import emit
from trainers.engine_choice import cpu_summary


def measure(
    concurrencies: list[int],
    rounds: int,
    out: Path,
    *,
    quick: bool = False,
    extra: list[str] | None = None,
    binds: list[str] | None = None,
) -> list[dict[str, Any]]:
    """One evaluation per setting (vLLM thread binding x concurrency) per round, alternating; a row per
    evaluation (seconds, reward, load). Each round and binding starts its own engine (the binding is fixed
    when vLLM starts its processes), so every setting starts from an empty prefix cache."""
    rows: list[dict[str, Any]] = []
    for round_ in range(rounds):
        for bind in binds or ["auto"]:
            rows += measure_one_engine(concurrencies, round_, bind, out, quick, list(extra or []))
    return rows


def measure_one_engine(
    concurrencies: list[int], round_: int, bind: str, out: Path, quick: bool, extra: list[str]
) -> list[dict[str, Any]]:
    from clawgym_env.interfaces import ClosableEngine
    from trainers.loop import build_rollout_side, held_out_reward
    from trainers.main import compose
    from trainers.main_job import main_job_overrides, pick_engine
    from trainers.model import load_model

    engine_choice, engine_overrides = pick_engine(quick, extra)
    if engine_choice.kind == "vllm":  # `++`: replaces a binding the main job's engine choice may have set
        extra = extra + [f"++engine.options.cpu_omp_bind={'null' if bind == 'auto' else bind}"]
    elif bind != "auto":
        raise ValueError(f"--omp-bind {bind} needs the vLLM engine; this run uses {engine_choice.kind}")
    cfg = compose(main_job_overrides(quick=quick, run_dir=out, extra=engine_overrides + extra))
    model, tokenizer = load_model(cfg.model.name, seed=cfg.model.seed)
    side = build_rollout_side(cfg, model, tokenizer, out)  # the main job's engine, proxy, envs and tasks
    del model
    envs, tasks, policy = side["eval_envs"], side["eval_tasks"], side["policy"]
    rows: list[dict[str, Any]] = []
    try:
        for concurrency in concurrencies:
            load = os.getloadavg()[0]
            started = time.perf_counter()
            metrics, outcomes = held_out_reward(envs, tasks, policy, cfg.eval.repeats, concurrency)
            rows.append(
                {
                    "round": round_,
                    "bind": bind,
                    "concurrency": concurrency,
                    "seconds": time.perf_counter() - started,
                    "rollouts": len(outcomes),
                    "reward": metrics["eval_reward_mean"],
                    "failed": sum(o["status"] != "ok" for o in outcomes),
                    "load": load,
                    "engine": f"{engine_choice.kind}, {engine_choice.dtype}",
                }
            )
    finally:
        side["runtime"].close()
        if isinstance(side["engine"], ClosableEngine):
            side["engine"].close()
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median seconds, rollouts per second and reward per setting (binding, concurrency), in the order first
    measured; the speed-up is the first setting's median seconds over this one's."""
    order = list(dict.fromkeys((r["bind"], r["concurrency"]) for r in rows))
    out = []
    for bind, c in order:
        mine = [r for r in rows if (r["bind"], r["concurrency"]) == (bind, c)]
        seconds = statistics.median(r["seconds"] for r in mine)
        out.append(
            {
                "bind": bind,
                "concurrency": c,
                "evaluations": len(mine),
                "median_s": seconds,
                "rollouts_per_s": statistics.median(r["rollouts"] / r["seconds"] for r in mine),
                "reward": statistics.mean(r["reward"] for r in mine),
                "failed": sum(r["failed"] for r in mine),
            }
        )
    base = out[0]["median_s"]
    for row in out:
        row["speedup"] = base / row["median_s"]
    return out


def setting(summary: dict[str, Any]) -> str:
    binding = "" if summary["bind"] == "auto" else f", vLLM threads on cores {summary['bind']}"
    return f"{summary['concurrency']} rollouts at once{binding}"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[4, 8], help="the first is the baseline")
    parser.add_argument("--rounds", type=int, default=2, help="each setting once per round, alternating")
    parser.add_argument(
        "--omp-bind",
        nargs="+",
        default=["auto"],
        help="vLLM's CPU thread binding per setting: auto (vLLM keeps a core for its scheduler) or cores such as 0-1",
    )
    parser.add_argument("--out", type=Path, default=Path("runs") / "eval-concurrency")
    parser.add_argument("--quick", action="store_true", help="tiny random model, 2 tasks (plumbing check)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the main job's config (after --)")
    args = parser.parse_args(argv)
    if any(c < 1 for c in args.concurrency) or args.rounds < 1:
        parser.error("--concurrency values and --rounds must be >= 1")
    if args.quick and args.omp_bind != ["auto"]:
        parser.error("--omp-bind needs the vLLM engine; --quick runs the transformers engine")
    rows = measure(args.concurrency, args.rounds, args.out, quick=args.quick, extra=args.overrides, binds=args.omp_bind)
    summary = summarize(rows)
    console = Console()
    table = Table(title=f"held-out evaluation of the main job by concurrency: {cpu_summary()}, {rows[0]['engine']}")
    for column in (
        "vLLM threads bound",
        "rollouts at once",
        "evaluations",
        "median s",
        "rollouts/s",
        "speed-up",
        "reward",
        "failed",
    ):
        table.add_column(column)
    for s in summary:
        table.add_row(
            s["bind"],
            str(s["concurrency"]),
            str(s["evaluations"]),
            f"{s['median_s']:.1f}",
            f"{s['rollouts_per_s']:.3f}",
            f"{s['speedup']:.2f}x",
            f"{s['reward']:.3f}",
            str(s["failed"]),
        )
    console.print(table)
    console.print(
        "each evaluation: "
        + ", ".join(f"{r['bind']} c={r['concurrency']} {r['seconds']:.0f} s (load {r['load']:.1f})" for r in rows)
    )
    base, best = summary[0], max(summary, key=lambda s: s["speedup"])
    emit(
        "eval_concurrency",
        best["speedup"],
        f"{setting(best)}: {best['speedup']:.2f}x the speed of {setting(base)} "
        f"({best['failed']} and {base['failed']} rollouts failed)",
    )
    return summary


if __name__ == "__main__":
    main()
