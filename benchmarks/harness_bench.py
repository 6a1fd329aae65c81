"""Per-harness overhead, side by side: one short scripted rollout per harness (write a file, then answer).

    .venv/bin/python benchmarks/harness_bench.py [--repeats 1] [--openclaw-variants]

For each harness: wall time of the rollout, harness start-up (launch -> first model call, from the proxy's
record), model time (the proxy's per-call time, engine included), harness overhead (wall - model time),
peak RSS of everything in the sandbox (sampled every 50 ms), CPU seconds of the sandbox's processes, and how
many such rollouts fit at once on this machine: an ESTIMATE, min(available memory / peak RSS,
cores x wall / CPU seconds), not a measured concurrent run. The engine is the scripted test double, so model
time is near zero and the numbers are the harness's own cost. `--openclaw-variants` also times OpenClaw with
and without its pre-built compile cache, `--repeats` runs each, interleaved (load swings hit both alike).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.headline import emit  # noqa: E402
from clawgym_env.chat import ChatMLRenderer  # noqa: E402
from clawgym_env.engines import ScriptedTestEngine, load_qwen_tokenizer  # noqa: E402
from clawgym_env.interfaces import Policy  # noqa: E402
from clawgym_env.rollout import run_rollout  # noqa: E402
from clawgym_env.serving_stack import serving_stack  # noqa: E402
from clawgym_env.specs import EnvOptions, TaskSpec  # noqa: E402
from harness_adapters.health import health_verifier, health_write_call, make_adapter  # noqa: E402
from trainers.process_memory import TreeSampler  # noqa: E402

HARNESSES = ("ClaudeCode", "OpenClaw", "Codex", "Pi", "WhiteBox")
# Earlier tries without gain (docs/harnesses.md): --local-model-lean; OPENCLAW_SKIP_CHANNELS and friends.
OPENCLAW_VARIANTS = {
    "default (read-only pre-built compile cache)": {},
    "no pre-built cache (OpenClaw's own, cold in the private /tmp)": {"compile_cache": False},
}


async def one(harness: str, adapter, proxy, backend, tokenizer, renderer) -> dict:
    engine = ScriptedTestEngine(tokenizer, [health_write_call(harness), "Done."])
    task = TaskSpec(
        id=f"bench-{harness}", instruction="Write ok into health.txt.", verifier=health_verifier, timeout_s=180
    )
    with TreeSampler(every_s=0.05, include_root=False) as rss:
        t0 = time.perf_counter()
        result = await run_rollout(
            task=task,
            adapter=adapter,
            policy=Policy(engine=engine, renderer=renderer),
            backend=backend,
            proxy=proxy,
            options=EnvOptions(max_calls=8),
        )
        wall = time.perf_counter() - t0
    cpu = sum(rss.cpu.values())  # sampled: a process's last <50 ms slice before it exits is missed
    model_s = sum(c.timings.total_s for c in result.calls)
    hr = result.harness_result
    return {
        "harness": harness,
        "ok": result.status == "ok" and result.reward == 1.0,
        "calls": len(result.calls),
        "wall_s": wall,
        "harness_s": hr.wall_s if hr else 0.0,
        "startup_s": hr.startup_s if hr else None,
        "model_s": model_s,
        "overhead_s": wall - model_s,
        "peak_rss_mb": rss.peak_mb,
        "cpu_s": cpu,
        "failure": result.failure.reason[:100] if result.failure else "",
    }


def fit(row: dict) -> tuple[int, int]:
    mem = psutil.virtual_memory().available / 2**20
    by_mem = int(mem * 0.8 // max(row["peak_rss_mb"], 1))
    by_cpu = int((os.cpu_count() or 1) * row["wall_s"] // max(row["cpu_s"], 1e-3))
    return by_mem, max(by_cpu, 1)


async def main(repeats: int, openclaw_variants: bool) -> None:
    tokenizer = load_qwen_tokenizer()
    renderer = ChatMLRenderer(tokenizer)
    rows = []
    variant_rows = []
    async with serving_stack() as stack:
        proxy, backend = stack.proxy, stack.backend
        for harness in HARNESSES:
            for _ in range(repeats):
                rows.append(await one(harness, make_adapter(harness), proxy, backend, tokenizer, renderer))
        if openclaw_variants:
            from harness_adapters.openclaw import OpenClawAdapter

            if OpenClawAdapter().compile_cache_dir() is None:
                print(
                    "note: no pre-built OpenClaw compile cache (python -m harness_adapters.openclaw --build-compile-cache)"
                )
            for _ in range(repeats):
                for label, options in OPENCLAW_VARIANTS.items():
                    row = await one("OpenClaw", OpenClawAdapter(**options), proxy, backend, tokenizer, renderer)
                    variant_rows.append((label, row))

    print(
        f"machine: {os.cpu_count()} cores, {psutil.virtual_memory().available / 2**30:.1f} GiB available, "
        f"load avg {os.getloadavg()[0]:.1f}"
    )
    head = (
        f"{'harness':<11}{'ok':>4}{'calls':>6}{'wall s':>8}{'start-up s':>11}{'model s':>9}{'overhead s':>11}"
        f"{'peak RSS MB':>12}{'CPU s':>7}{'fit(mem)':>9}{'fit(cpu)':>9}"
    )
    print(head)
    base = next((r for r in rows if r["harness"] == "WhiteBox"), None)
    for r in rows:
        by_mem, by_cpu = fit(r)
        start = f"{r['startup_s']:.2f}" if r["startup_s"] is not None else "-"
        print(
            f"{r['harness']:<11}{'yes' if r['ok'] else 'NO':>4}{r['calls']:>6}{r['wall_s']:>8.2f}{start:>11}"
            f"{r['model_s']:>9.3f}{r['overhead_s']:>11.2f}{r['peak_rss_mb']:>12.0f}{r['cpu_s']:>7.2f}{by_mem:>9}{by_cpu:>9}"
            + (f"  {r['failure']}" if r["failure"] else "")
        )
    walls = {h: statistics.median(r["wall_s"] for r in rows if r["harness"] == h) for h in HARNESSES}
    emit(
        "harness",
        walls["OpenClaw"],
        "wall " + ", ".join(f"{walls[h]:.1f} s {h}" for h in HARNESSES) + f" (median of {repeats})",
    )
    if base:
        print(
            "wall time relative to the white-box loop: "
            + ", ".join(f"{r['harness']} {r['wall_s'] / max(base['wall_s'], 1e-3):.1f}x" for r in rows if r is not base)
        )
    for label, r in variant_rows:
        start = f"{r['startup_s']:.1f}" if r["startup_s"] is not None else "-"
        print(
            f"OpenClaw [{label}]: ok={r['ok']} wall {r['wall_s']:.1f} s, start-up {start} s, CPU {r['cpu_s']:.1f} s, "
            f"peak RSS {r['peak_rss_mb']:.0f} MB"
        )
    for label in OPENCLAW_VARIANTS if variant_rows else []:
        mine = [r for name, r in variant_rows if name == label]
        mean = {k: sum(r[k] or 0.0 for r in mine) / len(mine) for k in ("wall_s", "startup_s", "cpu_s")}
        print(
            f"OpenClaw mean of {len(mine)} [{label}]: wall {mean['wall_s']:.1f} s, start-up {mean['startup_s']:.1f} s, "
            f"CPU {mean['cpu_s']:.1f} s"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--openclaw-variants", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.repeats, args.openclaw_variants))
