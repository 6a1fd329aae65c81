"""The README's main command, in its quick form: `clawgym main --quick` trains end to end and reports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import main_job_runs
from benchmarks.experiment_report import main_job_block
from evaluation.evidence import read_rows
from trainers.main import compose
from trainers.main_job import main_job_overrides


def test_presets_compose_to_valid_configs(tmp_path):
    default = compose(main_job_overrides(run_dir=tmp_path))
    assert default.model.name == "qwen2.5-coder-0.5b" and default.env.ids == ["ClawGymBench-Pi"]
    assert default.algorithm.name == "grpo"
    assert default.eval.concurrency == default.env.max_concurrency == 8  # evaluates as many at once as it trains
    mixed = compose(main_job_overrides(mix=True, run_dir=tmp_path))
    assert mixed.env.ids == ["ClawGymBench-Pi", "ClawGymBench-ClaudeCode"]
    assert compose(main_job_overrides(whitebox=True, run_dir=tmp_path)).env.ids == ["ClawGymBench-WhiteBox"]


def run_quick_main(run_dir, *options: str) -> tuple[str, dict]:
    """`clawgym main --quick [options]` as a subprocess: its stdout and its report.json."""
    out = subprocess.run(
        [sys.executable, "-m", "clawgym_cli", "main", "--quick", *options, "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout, json.loads((run_dir / "report.json").read_text())


def test_main_job_quick_runs_and_writes_its_report(tmp_path):
    run_dir = tmp_path / "main"
    stdout, report = run_quick_main(run_dir)
    assert "main job summary" in stdout and str(run_dir) in stdout
    assert report["steps"] == 2 and report["rollouts"] == 4  # 2 steps x 1 task x 2 rollouts
    assert set(report["held_out"]) == {"Pi"} and report["held_out"]["Pi"]["before"] is not None
    assert report["tree"]["calls"] >= 4  # every rollout made at least one real model call through pi
    assert (run_dir / "metrics.png").stat().st_size > 0
    assert (run_dir / "rollouts" / "calls.jsonl").is_file()
    assert report["weight_sync"]["seconds"] > 0 and 0 < report["weight_sync"]["share_of_step_time"] < 1
    rss = report["peak_rss_mb"]
    assert rss["process_tree"] > 100 and rss["main_process"] > 100  # torch and a model are loaded
    assert rss["main_process_reached_by"] in {"eval start", "step 1", "step 2", "eval end"}
    assert 0 < rss["main_process_file_backed"] < rss["main_process"]  # libraries and weights are mapped files
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    peaks = [r["memory/peak_mb"] for r in logged]  # every step and evaluation logs the process's memory
    assert len(peaks) == 4 and peaks == sorted(peaks) and all(r["memory/rss_mb"] > 100 for r in logged)
    assert "weight sync to the engine" in stdout and "peak RSS" in stdout
    assert report["engine"]["kind"] == "transformers" and "--quick" in report["engine"]["reason"]
    assert report["update"] == {"autocast": None, "reason": "--quick: the tiny model's plumbing check"}
    assert "update precision (why)" in stdout
    assert "cores)" in report["machine"]["cpu"] and report["machine"]["load_end"] >= 0  # where figures came from
    t = report["time_s"]  # evaluations and set-up, split into what the run measured
    evals = [r["eval_s"] for r in logged if r["kind"] == "eval"]
    assert len(evals) == 2 and all(s > 0 for s in evals) and t["evaluations"] == pytest.approx(sum(evals))
    assert 0 < t["setup"] < t["total"] and t["other"] >= 0
    assert t["setup"] + t["evaluations"] + t["other"] == pytest.approx(t["evaluation_and_setup"])
    assert "time: setup" in stdout and "time: evaluations" in stdout

    # publishing the run stores its report and rollouts; the README's block is recomputed from them
    results = tmp_path / "results"
    (run,) = main_job_runs.main([str(run_dir), "--publish", str(results)])
    rows = read_rows(results / main_job_runs.ROWS)
    assert {r.experiment for r in rows} == {"main"} and len([r for r in rows if r.phase == "train"]) == 4
    before = [r.reward for r in rows if r.phase == "before"]
    assert run.held_out["Pi"]["before"] == pytest.approx(sum(before) / len(before))  # the report is its rows
    block = main_job_block(results)
    assert block.startswith("| run (date) |") and f"| main ({run.date}) | transformers, float32; float32 |" in block
    assert f"s (set-up {run.setup_s:.0f}, evaluations {run.evaluations_s:.0f}) |" in block
    assert f"| {run.peak_rss_main_mb / 1024:.1f} ({run.file_backed_main_mb / 1024:.1f} mapped files) / " in block
    main_job_runs.main([str(run_dir), "--publish", str(results)])  # published again: replaced, not doubled
    assert len(main_job_runs.read_runs(results / main_job_runs.RUNS)) == 1
    assert read_rows(results / main_job_runs.ROWS) == rows
    with pytest.raises(FileNotFoundError, match="did not finish"):
        main_job_runs.read_run(tmp_path, "x")


@pytest.mark.parametrize(
    ("option", "harnesses"), [("--mix", {"Pi", "ClaudeCode"}), ("--whitebox", {"WhiteBox"})], ids=["mix", "whitebox"]
)
def test_main_job_options_train_mixed_harnesses_and_the_whitebox_baseline(tmp_path, option, harnesses):
    """`clawgym main --mix` trains pi and Claude Code in one batch; `--whitebox` the white-box loop (quick form)."""
    run_dir = tmp_path / "main"
    _, report = run_quick_main(run_dir, option)
    assert set(report["held_out"]) == harnesses and all(v["before"] is not None for v in report["held_out"].values())
    assert report["rollouts"] == 4 * len(harnesses)  # 2 steps x 1 task x 2 rollouts, per harness
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r.get("kind") == "train"]
    assert all(f"reward/{h}" in r for r in trained for h in harnesses)  # per-harness reward curves
    calls = [json.loads(line) for line in (run_dir / "rollouts" / "calls.jsonl").read_text().splitlines()]
    assert calls and all(c["generated_ids"] or c.get("error") for c in calls)


def test_report_lists_failure_reasons(tmp_path):
    """A run whose rollouts fail says why in its summary table, not only how many."""
    from rich.console import Console

    from trainers.main_job import build_report, render_report

    rows = [{"kind": "train", "rollouts": 2, "rollouts_failed": 2}]
    summary = {"steps": 1, "failures": {"sandbox": {"SandboxError: did not start": 2}}}
    report = build_report(tmp_path, rows, summary, 1.0)
    assert report["failures"] == {"sandbox": {"SandboxError: did not start": 2}}
    console = Console(record=True, width=200)
    console.print(render_report(report))
    assert "failure: sandbox: SandboxError: did not start" in console.export_text()


def test_main_job_quick_through_a_sharded_proxy(tmp_path):
    """`sandbox.proxy_shards=2`: pi's calls go to two proxy processes, each writing its own log, while the
    engine (and its weight updates) stays in the trainer's process."""
    run_dir = tmp_path / "main"
    _, report = run_quick_main(run_dir, "sandbox.proxy_shards=2")
    assert report["rollouts"] == 4 and report["tree"]["calls"] >= 4
    logs = sorted((run_dir / "rollouts").glob("shard-*/calls.jsonl"))
    assert len(logs) == 2 and all(log.read_text().count('"rollout_id"') >= 2 for log in logs)
    assert not (run_dir / "rollouts" / "calls.jsonl").exists()  # no call went through a proxy of its own
    proxy = json.loads((run_dir / "summary.json").read_text())["proxy"]
    assert len(proxy["shards"]) == 2 and proxy["shard_failures"] == {} and proxy["closed_rollouts"] >= 4


AVX512 = "model name\t: Intel(R) Xeon(R) Platinum\nflags\t\t: fpu sse2 avx avx2 avx512f avx512bw amx_tile\n"
AVX2 = "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma\n"


def test_the_engine_follows_the_cpu_and_a_users_choice_wins(tmp_path):
    from trainers.engine_choice import choose_engine, cpu_facts
    from trainers.main_job import pick_engine

    assert cpu_facts(AVX2) == ("AMD EPYC 7B13", {"fpu", "sse2", "avx", "avx2", "fma"})
    fast = choose_engine(AVX512, vllm_installed=True, gpu=False, cores=2)
    assert (fast.kind, fast.dtype, fast.avx512) == ("vllm", "bfloat16", True) and "AVX-512" in fast.reason
    cfg = compose(main_job_overrides(run_dir=tmp_path, extra=fast.overrides()))
    assert cfg.engine.kind == "vllm" and cfg.engine.options["dtype"] == "bfloat16"
    assert cfg.engine.options["max_batch_size"] == 16  # the preset's options survive the group switch
    # 2 cores: vLLM's threads on both (its own binding keeps one for its scheduler), 16 held-out rollouts at once
    assert (cfg.engine.options["cpu_omp_bind"], cfg.eval.concurrency) == ("0-1", 16)
    wide = compose(main_job_overrides(run_dir=tmp_path, extra=choose_engine(AVX512, cores=8, gpu=False).overrides()))
    assert "cpu_omp_bind" not in wide.engine.options and wide.eval.concurrency == 8  # not measured there
    # no AVX-512: vLLM's bfloat16 is slow there, its float32 is not (engine_bench --vllm-dtype bfloat16 float32)
    plain = choose_engine(AVX2, vllm_installed=True, gpu=False, cores=2)
    assert (plain.kind, plain.dtype, plain.avx512) == ("vllm", "float32", False) and "no AVX-512" in plain.reason
    cfg = compose(main_job_overrides(run_dir=tmp_path, extra=plain.overrides()))
    assert (cfg.engine.kind, cfg.engine.options["dtype"], cfg.engine.options["cpu_omp_bind"]) == (
        "vllm",
        "float32",
        "0-1",
    )
    assert choose_engine(AVX512, vllm_installed=False, gpu=False).kind == "transformers"
    assert choose_engine(AVX2, vllm_installed=True, gpu=True).kind == "vllm"
    given, extra = pick_engine(False, ["engine=vllm_server", "optim.lr=1e-5"])
    assert (given.kind, given.reason, extra) == ("vllm_server", "given on the command line", [])
    quick, extra = pick_engine(True, [])
    assert quick.kind == "transformers" and extra == []
    here, extra = pick_engine(False, [])  # this machine: whatever it has, the choice composes
    assert compose(main_job_overrides(run_dir=tmp_path, extra=extra)).engine.kind == here.kind


def test_the_update_precision_follows_the_cpu_and_a_users_choice_wins(tmp_path):
    from trainers.engine_choice import choose_update
    from trainers.main_job import pick_update

    amx = choose_update(AVX512.replace("amx_tile", "amx_tile amx_bf16"), gpu=False)
    assert amx.autocast == "bfloat16" and "AMX" in amx.reason
    assert compose(main_job_overrides(run_dir=tmp_path, extra=amx.overrides())).optim.autocast == "bfloat16"
    bf16 = choose_update(AVX512.replace("avx512bw", "avx512bw avx512_bf16"), gpu=False)  # AMD EPYC: no AMX
    assert bf16.autocast == "bfloat16" and "AVX512_BF16" in bf16.reason
    for plain in (choose_update(AVX2, gpu=False), choose_update(AVX512, gpu=False), choose_update(AVX2, gpu=True)):
        assert plain.autocast is None
        assert compose(main_job_overrides(run_dir=tmp_path, extra=plain.overrides())).optim.autocast is None
    given, extra = pick_update(False, ["optim.autocast=null"])
    assert (given.autocast, given.reason, extra) == (None, "given on the command line", [])
    assert pick_update(True, [])[0].autocast is None
    here, extra = pick_update(False, [])  # this machine: whatever it has, the choice composes
    assert compose(main_job_overrides(run_dir=tmp_path, extra=extra)).optim.autocast == here.autocast


def test_eval_concurrency_benchmark_times_the_main_jobs_own_evaluation(tmp_path):
    """`benchmarks.eval_concurrency --quick`: the main job's held-out evaluation (real pi rollouts on the tiny
    model) at two concurrencies, alternating; each evaluation runs every held-out rollout once."""
    from benchmarks.eval_concurrency import main as eval_concurrency

    summary = eval_concurrency(["--quick", "--concurrency", "1", "2", "--rounds", "1", "--out", str(tmp_path)])
    assert [s["concurrency"] for s in summary] == [1, 2] and all(s["evaluations"] == 1 for s in summary)
    assert summary[0]["speedup"] == 1.0 and summary[1]["speedup"] > 0
    assert all(s["median_s"] > 0 and 0 <= s["reward"] <= 1 and s["rollouts_per_s"] > 0 for s in summary)
    calls = (tmp_path / "rollouts" / "calls.jsonl").read_text().count('"rollout_id"')
    assert calls >= 2 * 4  # 2 evaluations x (2 tasks x 2 repeats), each rollout at least one model call


def test_eval_concurrency_benchmark_refuses_bad_input():
    from benchmarks.eval_concurrency import main as eval_concurrency

    with pytest.raises(SystemExit):
        eval_concurrency(["--concurrency", "0"])
    with pytest.raises(SystemExit):  # the binding is vLLM's; the quick check runs the transformers engine
        eval_concurrency(["--quick", "--omp-bind", "0-1"])


def test_eval_concurrency_summary_keeps_each_binding_apart():
    """A setting is (vLLM binding, concurrency): the medians and the speed-up never mix two bindings."""
    from benchmarks.eval_concurrency import setting, summarize

    def row(bind: str, seconds: float) -> dict:
        return {"bind": bind, "concurrency": 8, "seconds": seconds, "rollouts": 32, "reward": 0.5, "failed": 0}

    summary = summarize([row("auto", 90), row("0-1", 60), row("auto", 100), row("0-1", 70)])
    assert [(s["bind"], s["median_s"]) for s in summary] == [("auto", 95), ("0-1", 65)]
    assert summary[1]["speedup"] == pytest.approx(95 / 65)
    assert setting(summary[1]) == "8 rollouts at once, vLLM threads on cores 0-1"
