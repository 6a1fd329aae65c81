"""Evaluate a policy on environments (suite x harness): every held-out task, `repeats` times, in parallel.

    from evaluation import evaluate
    report = evaluate(policy, ["ClawGymBench-WhiteBox", "ClawGymBench-Pi"], split="test", level=0, count=8)
    report.console_print()                      # rich tables: per env, per category, per harness
    report.results_path, report.plot_path       # results.json (rows + aggregates) and eval.png

Command line: `clawgym evaluate ClawGymBench-WhiteBox --model qwen2.5-coder-0.5b --level 0 --count 8`.

The statistics are in `evaluation.report`, the tables and plot in `evaluation.tables`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from clawgym_env.interfaces import Policy
from clawgym_env.specs import TaskSpec
from evaluation.cache import EvalCache, EvalKey, default_concurrency
from evaluation.evidence import current_commit
from evaluation.report import EvalConfig, EvalReport, EvalRow, build_report
from evaluation.task_selection import select_tasks

PolicySource = Policy | Callable[[TaskSpec], Policy]
"""One policy for every rollout, or a factory giving each rollout its own (e.g. per-task scripted doubles)."""


def _policy_for(source: PolicySource, task: TaskSpec) -> Policy:
    return source if isinstance(source, Policy) else source(task)


def _row(env: Any, task: TaskSpec, repeat: int, result: Any, threshold: float, wall_s: float) -> EvalRow:
    failure = result.failure
    verdict = result.verifier
    return EvalRow(
        env_id=env.env_spec.id,
        suite=env.suite.name,
        harness=env.harness.name,
        task_id=task.id,
        category=str(task.metadata.get("category", "-")),
        level=task.metadata.get("level"),
        repeat=repeat,
        reward=float(result.reward),
        success=result.status == "ok" and float(result.reward) >= threshold,
        status=result.status,
        failure_stage=failure.stage if failure else None,
        failure_reason=failure.reason if failure else None,
        subscores={k: float(v) for k, v in (verdict.subscores if verdict else {}).items()},
        num_calls=len(result.calls),
        generated_tokens=int(result.forest.stats.generated_tokens),
        wall_s=float(result.timings.get("total_s", wall_s)),
        rollout_id=result.rollout_id,
    )


async def _run_jobs(
    jobs: list[tuple[Any, TaskSpec, int]],
    source: PolicySource,
    concurrency: int,
    threshold: float,
    on_done: Callable[[EvalRow], None],
) -> list[EvalRow]:
    """All rollouts, at most `concurrency` at a time; a crash or hang becomes a failed row, never an exception."""
    from clawgym_env.rollout import RolloutFailure, RolloutResult, new_rollout_id
    from clawgym_env.trajectory import TrajectoryForest

    gate = asyncio.Semaphore(concurrency)

    async def one(env: Any, task: TaskSpec, repeat: int) -> EvalRow:
        rollout_id = new_rollout_id()
        async with gate:
            start = time.perf_counter()
            limit = (env.options.rollout_timeout_s or task.timeout_s) + 120  # the last guard; run_rollout has its own
            try:
                policy = _policy_for(source, task)
                result = await asyncio.wait_for(env.arollout(policy, task, rollout_id), timeout=limit)
            except Exception as exc:  # noqa: BLE001 - reported as the row's failure
                reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
                env.runtime.failures.add("rollout", reason)
                result = RolloutResult(
                    rollout_id=rollout_id,
                    task_id=task.id,
                    harness=env.harness.name,
                    status="failed",
                    failure=RolloutFailure(stage="rollout", reason=reason),
                    forest=TrajectoryForest.failed(rollout_id, reason, task_id=task.id),
                )
            row = _row(env, task, repeat, result, threshold, time.perf_counter() - start)
        on_done(row)
        return row

    return list(await asyncio.gather(*(one(env, task, r) for env, task, r in jobs)))


def evaluate(
    policy: PolicySource,
    env_ids: Sequence[str],
    *,
    split: str = "test",
    repeats: int = 1,
    concurrency: int | None = None,
    level: int | None = None,
    count: int | None = None,
    seed: int = 0,
    run_dir: str | Path | None = None,
    success_threshold: float = 1.0,
    failed_as_zero: bool = True,
    temperature: float | None = None,
    env_overrides: dict[str, Any] | None = None,
    model_name: str | None = None,
    save: bool = True,
    progress: bool = True,
    cache: EvalCache | None = None,
    policy_key: dict[str, Any] | None = None,
    proxy_shards: int = 1,
) -> EvalReport:
    """Run every task instance of `split` (or `count` of them) under each env, `repeats` times.

    `policy` is one Policy or a function task -> Policy. `seed` is the suites' generation seed (for
    loaders that take one). `temperature` and `env_overrides` (any EnvOptions field: backend,
    max_calls, rollout_timeout_s, ...) apply to every env. Results go to `run_dir` (default
    `runs/eval-<time>`): results.json, table.txt, eval.png, and the proxy's call log.
    `concurrency` is how many rollouts run at once (default: `default_concurrency()`, what the machine
    holds). With a `cache` and a `policy_key` (what the policy is: model, weights seed, checkpoint), an
    evaluation whose key (policy, tasks, seeds, sampling, harness) was measured before is read back
    instead of run again (`report.cached_from` names the entry). `proxy_shards` > 1: the proxy is a
    `ShardedProxy` of that many processes (for many rollouts at once; each shard logs under `run_dir/shard-K`).
    """
    import clawgym_env
    from clawgym_env.runtime import Runtime

    if not env_ids:
        raise ValueError("evaluate needs at least one environment id, e.g. ClawGymBench-WhiteBox")
    if concurrency is None:
        concurrency = default_concurrency()
    if repeats < 1 or concurrency < 1:
        raise ValueError(f"repeats and concurrency must be >= 1 (got repeats={repeats}, concurrency={concurrency})")
    if count is not None and count < 1:
        raise ValueError(f"count must be >= 1 or None for the whole split (got {count})")
    if not 0.0 <= success_threshold <= 1.0:
        raise ValueError(f"success_threshold must be in [0, 1] (got {success_threshold})")
    for env_id in env_ids:
        clawgym_env.registry.spec(env_id)  # UnknownEnvironmentError with close matches, before any work

    run_dir = Path(run_dir) if run_dir else Path.cwd() / "runs" / time.strftime("eval-%Y%m%d-%H%M%S")
    overrides: dict[str, Any] = {"split": split, **(env_overrides or {})}
    if temperature is not None:
        overrides["temperature"] = temperature
    runtime = Runtime(run_dir, proxy_shards=proxy_shards)
    commit = current_commit()  # the code the rollouts ran with (the checkout may change while they run)
    start = time.perf_counter()
    try:
        jobs: list[tuple[Any, TaskSpec, int]] = []
        envs, env_tasks = [], []
        for env_id in env_ids:
            env = clawgym_env.make(env_id, runtime=runtime, **overrides)
            tasks = select_tasks(env, level=level, count=count, seed=seed)
            envs.append(env)
            env_tasks.append(tasks)
            jobs += [(env, task, r) for task in tasks for r in range(repeats)]
        key = None
        if cache is not None and policy_key is not None:
            key = _cache_key(envs, env_tasks, policy_key, repeats, seed, temperature, success_threshold, failed_as_zero)
            cached = _read_back(cache, key)
            if cached is not None:
                return cached
        # Start the shared proxy once, before the rollouts race to start it (Runtime.proxy is not locked).
        runtime.run(runtime.proxy())
        rows = _run_with_progress(runtime, jobs, policy, concurrency, success_threshold, progress)
    finally:
        runtime.close()
    name = model_name or (policy.name if isinstance(policy, Policy) else getattr(policy, "name", "policy"))
    config = EvalConfig(
        model=name,
        env_ids=list(env_ids),
        split=split,
        repeats=repeats,
        concurrency=concurrency,
        level=level,
        count=count,
        seed=seed,
        success_threshold=success_threshold,
        failed_as_zero=failed_as_zero,
    )
    report = build_report(rows, config)
    report.commit = commit
    report.wall_s = time.perf_counter() - start
    report.run_dir = str(run_dir)
    report.evaluation = key.digest() if key is not None else None
    if save:
        report.save(run_dir)
    if key is not None and cache is not None:
        cache.put(key, report.model_dump(mode="json"), env_ids=list(env_ids))
    return report


def _cache_key(
    envs: list[Any],
    tasks: list[list[TaskSpec]],
    policy_key: dict[str, Any],
    repeats: int,
    seed: int,
    temperature: float | None,
    threshold: float,
    failed_as_zero: bool,
) -> EvalKey:
    return EvalKey.for_envs(
        "evaluate",
        policy=policy_key,
        envs=envs,
        tasks=tasks,
        repeats=repeats,
        sampling_seed=seed,
        temperature=temperature,
        extra={"threshold": threshold, "failed_as_zero": failed_as_zero},
    )


def cached_evaluation(
    env_ids: Sequence[str],
    *,
    cache: EvalCache,
    policy_key: dict[str, Any],
    split: str = "test",
    repeats: int = 1,
    level: int | None = None,
    count: int | None = None,
    seed: int = 0,
    success_threshold: float = 1.0,
    failed_as_zero: bool = True,
    temperature: float | None = None,
    env_overrides: dict[str, Any] | None = None,
) -> EvalReport | None:
    """What `evaluate` with these arguments would read back from `cache`, or None; runs nothing (for plans)."""
    import clawgym_env

    overrides: dict[str, Any] = {"split": split, **(env_overrides or {})}
    if temperature is not None:
        overrides["temperature"] = temperature
    envs = [clawgym_env.make(env_id, **overrides) for env_id in env_ids]
    tasks = [select_tasks(env, level=level, count=count, seed=seed) for env in envs]
    key = _cache_key(envs, tasks, policy_key, repeats, seed, temperature, success_threshold, failed_as_zero)
    return _read_back(cache, key)


def _read_back(cache: EvalCache, key: EvalKey) -> EvalReport | None:
    """The report stored under `key`, saying where it was read from and which measurement it is; or None."""
    stored = cache.get(key)
    if stored is None:
        return None
    report = EvalReport.model_validate(stored)
    report.cached_from = str(cache.path(key))
    report.evaluation = key.digest()
    return report


def _run_with_progress(
    runtime: Any, jobs: list, policy: PolicySource, concurrency: int, threshold: float, show: bool
) -> list[EvalRow]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not show:
        return runtime.run(_run_jobs(jobs, policy, concurrency, threshold, lambda _: None))
    with Progress(
        TextColumn("evaluating"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[last]}"),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task("rollouts", total=len(jobs), last="")

        def done(row: EvalRow) -> None:
            bar.update(task, advance=1, last=f"{row.env_id} {row.task_id}: {row.reward:.2f} {row.status}")

        return runtime.run(_run_jobs(jobs, policy, concurrency, threshold, done))
