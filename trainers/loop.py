"""The bundled training loop: environments -> rollouts -> GRPO/PPO update -> weight sync, with evaluation,
checkpoints, metrics and progress. `trainers.main` builds a TrainConfig from Hydra and calls `train`.

Per step: each env (one per harness of a mixed run) draws `tasks_per_step` training tasks; each task
runs `group_size` rollouts of the current policy; all rollouts of the step form one RolloutBatch whose
GRPO groups are the Task–Harness pairs; one `Trainer.update` trains on it and pushes the new weights
into the inference engine. Held-out reward (the `eval_split` tasks) is measured per harness at the
start, every `eval.every` steps, and at the end.

Under torchrun, rank 0 runs the environments and broadcasts each step's rollouts; every rank trains
on its share of the packed micro-batches (trainers.distributed).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clawgym_env.interfaces import ClosableEngine, ReportingEngine
from evaluation.evidence import (
    UNTRAINED,
    EvidenceLog,
    EvidenceRow,
    current_commit,
    read_rows,
    rows_from_batch,
    write_rows,
)
from trainers import distributed as D
from trainers.config import TrainConfig
from trainers.core import Trainer
from trainers.grpo import GRPO
from trainers.metrics_log import MetricsLogger, console
from trainers.model import apply_lora, enable_gradient_checkpointing, frozen_copy, load_model, plain_copy
from trainers.plots import plot_metrics
from trainers.ppo import PPO, PPOConfig
from trainers.process_memory import map_large_allocations, memory_metrics
from trainers.rollout_batch import RolloutBatch
from trainers.rollout_producer import RolloutProducer
from trainers.staleness import apply_staleness
from trainers.tree_forward import Critic, unwrap


class TaskSampler:
    """Draws training tasks epoch by epoch (a shuffled order, no repeats within an epoch); resumable."""

    def __init__(self, num_tasks: int, seed: int) -> None:
        if num_tasks < 1:
            raise ValueError("TaskSampler needs at least one task")
        self.num_tasks = num_tasks
        self.rng = np.random.default_rng(seed)
        self.order = self.rng.permutation(num_tasks).tolist()
        self.pos = 0

    def draw(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            if self.pos >= len(self.order):
                self.order = self.rng.permutation(self.num_tasks).tolist()
                self.pos = 0
            out.append(self.order[self.pos])
            self.pos += 1
        return out

    def state(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "order": self.order, "pos": self.pos}

    def set_state(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.order, self.pos = list(state["order"]), int(state["pos"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------------- building
def build_envs(cfg: TrainConfig, runtime: Any, split: str, *, evaluation: bool = False) -> list[Any]:
    """One env per id, all on one runtime (one proxy, one sandbox backend).

    Training envs sample at algorithm.temperature, the temperature of the trainer's log-probs (one knob:
    sampling at one temperature and training at another would bias every ratio); evaluation envs at
    eval.temperature when it is set."""
    temperature = cfg.algorithm.temperature
    if evaluation and cfg.eval.temperature is not None:
        temperature = cfg.eval.temperature
    import clawgym_env

    envs = []
    for env_id in cfg.env.ids:
        overrides = cfg.env.options_for(env_id)
        overrides.update(
            split=split, backend=cfg.sandbox.backend, backend_options=cfg.sandbox.options, temperature=temperature
        )
        envs.append(clawgym_env.make(env_id, runtime=runtime, **overrides))
    return envs


def load_tasks(env: Any, cfg: TrainConfig, count: int | None) -> list[Any]:
    from evaluation import select_tasks

    return select_tasks(env, level=cfg.env.level, count=count, seed=cfg.env.suite_seed)


def build_engine(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any) -> Any:
    """The inference engine the rollouts use; the trainer pushes weights into it after each update."""
    if cfg.engine.kind == "transformers":
        from clawgym_env.engines.transformers_engine import TransformersEngine

        return TransformersEngine(plain_copy(model, share_frozen=True), tokenizer, seed=cfg.seed, **cfg.engine.options)
    from clawgym_env.engines import make_engine

    options = dict(cfg.engine.options)
    if cfg.model.lora.enabled and cfg.model.lora.sync == "adapter":  # vLLM serves the adapter on the base weights
        options.setdefault("enable_lora", True)
        options.setdefault("max_lora_rank", min(r for r in (8, 16, 32, 64, 128, 256, 512) if r >= cfg.model.lora.r))
    return make_engine(cfg.engine.kind, model=cfg.model.name, **options)


# ------------------------------------------------------------------------------------------- rollouts
def collect(
    envs: list[Any], samplers: list[TaskSampler], tasks: list[list[Any]], policy: Any, cfg: TrainConfig
) -> RolloutBatch:
    """One step's rollouts: tasks_per_step tasks per env, group_size rollouts per task, concurrently.

    Dynamic sampling (`env.extra_groups` > 0): for each group whose usable rewards are all equal (it
    teaches GRPO nothing), a group on a newly drawn task of the same env runs, until the step's groups
    differ or `extra_groups` more groups have run. Every group stays in the batch; `infos` marks the
    extra ones, and the step's metrics count them (`groups_extra`, `groups_extra_useful`)."""
    from clawgym_env.vector_env import ClawGymVectorEnv

    groups = len(envs) * cfg.env.tasks_per_step
    per_group = max(1, cfg.env.max_concurrency // groups)
    venvs = [ClawGymVectorEnv(env, num_envs=cfg.env.group_size, max_concurrency=per_group) for env in envs]

    def run(which: list[int]) -> list[tuple[int, list[Any]]]:
        """One group per env index in `which`, each on the next task its sampler draws."""
        jobs = [venvs[i].arollouts(policy, [tasks[i][samplers[i].draw(1)[0]]] * cfg.env.group_size) for i in which]

        async def run_all() -> list[list[Any]]:
            return list(await asyncio.gather(*jobs))

        return list(zip(which, envs[0].runtime.run(run_all())))

    done = run([i for i in range(len(envs)) for _ in range(cfg.env.tasks_per_step)])
    extra: list[tuple[int, list[Any]]] = []
    budget = cfg.env.extra_groups
    pending = [i for i, group in done if _degenerate(group)]  # envs whose group taught nothing
    while budget > 0 and pending:
        new = run(pending[:budget])
        budget -= len(new)
        extra += new
        pending = [i for i, group in new if _degenerate(group)]
    forests, rewards, statuses, task_ids, harnesses, infos = [], [], [], [], [], []
    for n, (i, group) in enumerate(done + extra):
        for r in group:
            forests.append(r.forest)
            rewards.append(r.reward if r.status == "ok" else np.nan)
            statuses.append(r.status)
            task_ids.append(r.task_id)
            harnesses.append(envs[i].harness.name)
            info = {
                "rollout_id": r.rollout_id,
                "failure": r.failure.model_dump() if r.failure else None,
                "wall_s": r.timings.get("total_s"),
            }
            if n >= len(done):
                info |= {"extra_group": n - len(done), "extra_group_useful": not _degenerate(group)}
            infos.append(info)
    return RolloutBatch(forests, np.array(rewards, dtype=np.float64), statuses, task_ids, harnesses, infos)


def dynamic_sampling_metrics(batch: RolloutBatch) -> dict[str, float]:
    """Extra groups dynamic sampling drew this step, and how many of them had differing rewards."""
    extra = {info["extra_group"]: info["extra_group_useful"] for info in batch.infos if "extra_group" in info}
    return {"groups_extra": float(len(extra)), "groups_extra_useful": float(sum(extra.values()))}


def _degenerate(group: list[Any]) -> bool:
    """All usable rewards of a group equal (or none usable): zero advantage for every rollout."""
    usable = {float(r.reward) for r in group if r.status == "ok" and r.reward is not None and np.isfinite(r.reward)}
    return len(usable) <= 1


def newest_checkpoint(ckpt_dir: Path) -> str | None:
    """The checkpoint of the highest step: `latest.pt` can lag `step_N.pt` when a kill lands between the
    two saves, so the numbered ones are looked at too."""
    numbered = sorted(ckpt_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    if numbered:
        return str(numbered[-1])
    latest = ckpt_dir / "latest.pt"
    return str(latest) if latest.is_file() else None


def link_latest(saved: Path) -> None:
    """`latest.pt` as a hard link to the newest numbered checkpoint (no second copy on disk), swapped in
    atomically; a plain copy where the filesystem has no hard links."""
    tmp = saved.with_name("latest.pt.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(saved, tmp)
    except OSError:
        shutil.copyfile(saved, tmp)
    tmp.replace(saved.with_name("latest.pt"))


def prune_checkpoints(ckpt_dir: Path, keep: int) -> None:
    """Delete numbered checkpoints beyond the newest `keep` (latest.pt stays valid: it is its own link)."""
    numbered = sorted(ckpt_dir.glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    for old in numbered[:-keep]:
        old.unlink(missing_ok=True)


def tree_metrics(forests: list[Any]) -> dict[str, float]:
    """The step's reconstruction statistics summed over its rollouts (filter counts among them)."""
    from clawgym_env.trajectory import ForestStats

    total = sum((f.stats for f in forests), ForestStats())
    keep = (
        "calls",
        "leaves",
        "dead_leaves_removed",
        "compaction_calls_set_aside",
        "subagent_calls_set_aside",
        "dropped_overfork",
        "drift_events",
        "failed_calls",
    )
    return {f"tree/{k}": float(getattr(total, k)) for k in keep}


def held_out_reward(
    envs: list[Any], tasks: list[list[Any]], policy: Any, repeats: int, concurrency: int | None = None
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Mean held-out reward per harness (failed rollouts count 0) and overall, and one outcome per rollout
    (harness, suite, task, repeat, reward, status, calls, tokens); at most `concurrency` rollouts at once
    (default: what the machine holds, evaluation.default_concurrency)."""
    from evaluation import default_concurrency

    gate = asyncio.Semaphore(concurrency or default_concurrency())

    async def one(env: Any, task: Any) -> Any:
        async with gate:
            return await env.arollout(policy, task)

    async def run_all() -> list[Any]:
        return list(
            await asyncio.gather(*(one(env, t) for env, ts in zip(envs, tasks) for t in ts for _ in range(repeats)))
        )

    results = envs[0].runtime.run(run_all())
    by_harness: dict[str, list[float]] = {}
    outcomes: list[dict[str, Any]] = []
    i = 0
    for env, ts in zip(envs, tasks):
        for task in ts:
            for repeat in range(repeats):
                r = results[i]
                i += 1
                reward = float(r.reward) if r.status == "ok" else 0.0
                by_harness.setdefault(env.harness.name, []).append(reward)
                outcomes.append(
                    {
                        "eval_harness": env.harness.name,
                        "suite": env.suite.name,
                        "task_id": task.id,
                        "repeat": repeat,
                        "reward": reward,
                        "status": r.status,
                        "num_calls": int(r.forest.stats.calls),
                        "generated_tokens": int(r.forest.stats.generated_tokens),
                        "wall_s": r.timings.get("total_s"),
                    }
                )
    out = {f"eval_reward/{h}": float(np.mean(v)) for h, v in by_harness.items()}
    out["eval_reward_mean"] = float(np.mean([x for v in by_harness.values() for x in v]))
    out["eval_rollouts"] = float(i)
    return out, outcomes


def start_eval_key(cfg: TrainConfig, envs: list[Any], tasks: list[list[Any]]) -> Any:
    """What the untrained policy's held-out reward depends on; equal keys across runs share one measurement."""
    from evaluation import EvalKey

    policy = {
        "model": cfg.model.name,
        "weights_seed": cfg.model.seed,
        "dtype": cfg.model.dtype,
        "lora": cfg.model.lora.model_dump(),
        "engine": cfg.engine.model_dump(),
        "checkpoint": None,
    }
    temperature = cfg.eval.temperature if cfg.eval.temperature is not None else cfg.algorithm.temperature
    return EvalKey.for_envs(
        "held_out_reward",
        policy=policy,
        envs=envs,
        tasks=tasks,
        repeats=cfg.eval.repeats,
        sampling_seed=cfg.seed,
        temperature=temperature,
    )


# ------------------------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train from a validated config; returns a summary (also written to run_dir/summary.json)."""
    run = start_run(cfg)
    try:
        resume(run)
        if cfg.warm_start.enabled and run.trainer.step == 0:
            warm_start(run)
        start_eval = None
        if cfg.eval.at_start and run.trainer.step == 0:
            warm = run.summary["stages"].get("warm_start")
            start_eval = warm["after"] if warm else run.evaluate("start")
        last_eval = training_steps(run) or start_eval
        final_eval = run.evaluate("end") if cfg.steps > 0 or last_eval is None else last_eval
        run.summary.update({"steps": run.trainer.step, "eval_start": start_eval, "eval_end": final_eval})
        summary = finish(run)
        D.shutdown()  # on success only: a rank that failed cannot join it, and torchrun stops the others
        return summary
    finally:  # also on an error: vLLM servers the engine started run in their own sessions and would outlive us
        close(run)


@dataclass
class Run:
    """What one training run holds. The rollout side (engine, policy, envs, tasks) lives on rank 0 only."""

    cfg: TrainConfig
    run_dir: Path
    main_rank: bool
    trainer: Trainer
    tokenizer: Any
    logger: MetricsLogger
    summary: dict[str, Any]
    engine: Any = None
    policy: Any = None
    runtime: Any = None
    envs: list[Any] = field(default_factory=list)
    eval_envs: list[Any] = field(default_factory=list)
    train_tasks: list[list[Any]] = field(default_factory=list)
    eval_tasks: list[list[Any]] = field(default_factory=list)
    samplers: list[TaskSampler] = field(default_factory=list)
    row_fields: dict[str, Any] = field(default_factory=dict)  # experiment, arm, seed, suite, commit of its rows
    position: Any = None  # the task samplers' state after the last trained batch (rollouts run ahead of it)

    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def rollout_log(self) -> EvidenceLog:
        """Every training rollout, one JSON line each (`<run_dir>/rollouts.jsonl`)."""
        return EvidenceLog(self.run_dir / "rollouts.jsonl", enabled=self.main_rank)

    def evaluate(self, label: str) -> dict[str, float]:
        """Held-out reward per harness (rank 0 runs it, every rank gets it), logged under `label`. The start
        evaluation of an untrained policy is read from eval.cache_dir when an equal one was measured before."""
        started = time.perf_counter()
        metrics = self._measure(label) if self.main_rank else {}
        metrics = D.broadcast_object(metrics)
        eval_s = time.perf_counter() - started
        self.logger.log(
            {**metrics, **memory_metrics(), "eval_s": eval_s, "label": label}, self.trainer.step, kind="eval"
        )
        if self.main_rank:
            console.print(
                f"[bold]eval ({label}, step {self.trainer.step})[/bold] "
                + ", ".join(f"{k}={v:.3f}" for k, v in metrics.items() if k.startswith("eval_reward"))
            )
        return metrics

    def _measure(self, label: str) -> dict[str, float]:
        cache = key = None
        if label == "start" and self.cfg.eval.cache_dir and self.trainer.step == 0:
            from evaluation import EvalCache

            cache = EvalCache(self.cfg.eval.cache_dir)
            key = start_eval_key(self.cfg, self.eval_envs, self.eval_tasks)
            cached = cache.get(key)
            if cached is not None:
                console.print(f"eval (start): reusing {cache.path(key)}")
                outcomes = cached.pop("rollouts", [])
                self._store_eval_rows(label, outcomes, cached.pop("commit", "unknown"))
                return {**cached, "eval_cached": 1.0}
        metrics, outcomes = held_out_reward(
            self.eval_envs, self.eval_tasks, self.policy, self.cfg.eval.repeats, self.cfg.eval.concurrency
        )
        commit = self._store_eval_rows(label, outcomes)
        if cache is not None and key is not None:
            cache.put(key, {**metrics, "rollouts": outcomes, "commit": commit}, run_dir=str(self.run_dir))
        return metrics

    def _store_eval_rows(self, label: str, outcomes: list[dict[str, Any]], commit: str | None = None) -> str:
        """The start and end evaluations' rollouts as evidence (`<run_dir>/eval_rollouts.jsonl`: phase
        "before" with arm "untrained", and "after"); a rerun of a phase (a resume) replaces its rows."""
        fields = training_row_fields(self)
        commit = commit or fields["commit"]
        phase = {"start": "before", "end": "after"}.get(label)
        if phase is None:
            return commit
        log = self.eval_log
        kept = [r for r in read_rows(log.path) if r.phase != phase] if log.path.is_file() else []
        arm = UNTRAINED if phase == "before" else fields["arm"]
        new = [
            EvidenceRow(**o, experiment=fields["experiment"], arm=arm, phase=phase, seed=self.cfg.seed, commit=commit)
            for o in outcomes
        ]
        if phase == "after":
            new = [r.model_copy(update={"checkpoint": f"step {self.trainer.step}"}) for r in new]
        write_rows(log.path, kept + new)
        return commit

    @property
    def eval_log(self) -> EvidenceLog:
        """The start and end held-out evaluations, one JSON line per rollout (`<run_dir>/eval_rollouts.jsonl`)."""
        return EvidenceLog(self.run_dir / "eval_rollouts.jsonl", enabled=self.main_rank)


ALGORITHMS: dict[str, type[GRPO] | type[PPO]] = {"grpo": GRPO, "ppo": PPO}


def start_run(cfg: TrainConfig) -> Run:
    """Process group, seeds and run directory; the models, the algorithm and its trainer; on rank 0 the
    engine, the policy, the environments and their tasks."""
    D.init_from_env()
    main_rank = D.rank() == 0
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    map_large_allocations(cfg.mmap_threshold_mb)
    seed_everything(cfg.seed)
    run_dir = Path(D.broadcast_object(str(cfg.run_dir)))  # rank 0's: each rank's Hydra resolves ${now:...} itself
    run_dir.mkdir(parents=True, exist_ok=True)
    if main_rank:
        (run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
    started = time.perf_counter()
    model, tokenizer, critic, ref_model = build_models(cfg)
    algorithm = ALGORITHMS[cfg.algorithm.name](cfg.algorithm)  # type: ignore[arg-type]
    rollout_side = build_rollout_side(cfg, model, tokenizer, run_dir) if main_rank else {}
    trainer = Trainer(
        model,
        algorithm,
        cfg.optim,
        engine=rollout_side.get("engine"),
        critic=critic,
        ref_model=ref_model,
        device=cfg.device,
        base_model={"name": cfg.model.name, "dtype": cfg.model.dtype, "seed": cfg.model.seed},
        adapter_sync=cfg.model.lora.enabled and cfg.model.lora.sync == "adapter",
    )
    samplers = [TaskSampler(len(ts), cfg.seed + i) for i, ts in enumerate(rollout_side.get("train_tasks", []))]
    logger = MetricsLogger(run_dir, tensorboard=cfg.logging.tensorboard, enabled=main_rank)
    summary = {
        "run_dir": str(run_dir),
        "algorithm": algorithm.name,
        "env_ids": cfg.env.ids,
        "max_staleness": cfg.trainer.max_staleness,
        "setup_s": time.perf_counter() - started,  # models, engine, proxy, envs and tasks: what a run pays first
        "stages": {},
    }
    return Run(cfg, run_dir, main_rank, trainer, tokenizer, logger, summary, samplers=samplers, **rollout_side)


def build_models(cfg: TrainConfig) -> tuple[torch.nn.Module, Any, Critic | None, torch.nn.Module | None]:
    """The policy (with LoRA when asked), its tokenizer, PPO's critic and the KL reference; sharded under torchrun."""
    model, tokenizer = load_model(cfg.model.name, dtype=getattr(torch, cfg.model.dtype), seed=cfg.model.seed)
    model = apply_lora(model, cfg.model.lora)
    if cfg.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    ref_model = frozen_copy(model) if cfg.algorithm.kl_coef else None
    critic = None
    if isinstance(cfg.algorithm, PPOConfig):  # the critic starts from the base model, without the LoRA layers
        backbone = plain_copy(unwrap(model) if not cfg.model.lora.enabled else model)
        critic = Critic(backbone, train_trunk=cfg.algorithm.train_critic_trunk)
    model.to(cfg.device)
    if critic is not None:
        critic.to(cfg.device)
    if D.is_distributed():
        D.shard_model(model)
        if critic is not None:
            D.shard_model(critic)
    return model, tokenizer, critic, ref_model


def build_rollout_side(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any, run_dir: Path) -> dict[str, Any]:
    """Rank 0: the inference engine, the policy over it, and the training and held-out envs and tasks."""
    from clawgym_env.chat import ChatMLRenderer
    from clawgym_env.interfaces import Policy
    from clawgym_env.runtime import Runtime

    engine = build_engine(cfg, model, tokenizer)
    runtime = Runtime(
        run_dir / "rollouts",
        proxy_port=cfg.sandbox.proxy_port,
        proxy_public_url=cfg.sandbox.proxy_public_url,
        proxy_shards=cfg.sandbox.proxy_shards,
    )
    try:
        envs = build_envs(cfg, runtime, cfg.env.split)
        eval_envs = build_envs(cfg, runtime, cfg.env.eval_split, evaluation=True)
        return {
            "engine": engine,
            "policy": Policy(engine=engine, renderer=ChatMLRenderer(tokenizer), name=cfg.model.name),
            "runtime": runtime,
            "envs": envs,
            "eval_envs": eval_envs,
            "train_tasks": [load_tasks(e, cfg, cfg.env.train_tasks) for e in envs],
            "eval_tasks": [load_tasks(e, cfg, cfg.env.eval_tasks) for e in eval_envs],
        }
    except BaseException:
        runtime.close()
        if isinstance(engine, ClosableEngine):
            engine.close()
        raise


def resume(run: Run) -> None:
    """Restore a checkpoint (checkpoint.resume: a path, or "auto" for the run's newest) and the data position."""
    path = run.cfg.checkpoint.resume
    if path == "auto":
        path = newest_checkpoint(run.ckpt_dir)
    if not path:
        return
    trainer = run.trainer
    extra = trainer.load_checkpoint(path)
    dropped = run.logger.truncate_after(trainer.step)  # steps past the checkpoint run again
    run.rollout_log.truncate_after(trainer.step)
    if dropped and run.main_rank:
        console.print(f"dropped {dropped} metric records past step {trainer.step}: those steps run again")
    for sampler, state in zip(run.samplers, extra.get("samplers", [])):
        sampler.set_state(state)
    trainer.sync_weights()
    console.print(f"resumed from {path} at step {trainer.step}")


def warm_start(run: Run) -> None:
    """SFT on reference demonstrations, its own stage with held-out reward before and after."""
    from trainers.warm_start import collect_demonstrations, sft

    cfg = run.cfg.warm_start
    before = run.evaluate("before_warm_start")
    demos = None
    if run.main_rank:
        demo_tasks = [ts[: cfg.tasks] if cfg.tasks else ts for ts in run.train_tasks]
        demos = collect_demonstrations(run.envs, demo_tasks, cfg.demos_per_task, run.tokenizer)
    demos = D.broadcast_object(demos)
    report = sft(run.trainer.model, demos, epochs=cfg.epochs, lr=cfg.lr, token_budget=cfg.token_budget)
    run.trainer.sync_weights()
    after = run.evaluate("after_warm_start")
    run.summary["stages"]["warm_start"] = {"report": report.model_dump(), "before": before, "after": after}
    run.logger.log(
        {
            "sft_loss_first": report.loss_per_epoch[0] if report.loss_per_epoch else None,
            "sft_loss_last": report.loss_per_epoch[-1] if report.loss_per_epoch else None,
            "demonstrations": report.demonstrations,
            "successful": report.successful,
        },
        0,
        kind="warm_start",
    )


def training_steps(run: Run) -> dict[str, float] | None:
    """Steps until cfg.steps, with progress, periodic evaluation, checkpoints and plots; the last periodic eval.

    Rank 0's rollouts come from a RolloutProducer thread, up to `trainer.max_staleness` versions ahead (0:
    each step's rollouts start once the previous step's update, evaluation and checkpoint are done)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    cfg, trainer = run.cfg, run.trainer
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        disable=not (run.main_rank and cfg.logging.progress),
    )
    producer = start_producer(run) if run.main_rank and trainer.step < cfg.steps else None
    last_eval = None
    try:
        with progress:
            bar = progress.add_task(
                f"{trainer.algorithm.name} training", total=cfg.steps, completed=trainer.step, info=""
            )
            while trainer.step < cfg.steps:
                progress.update(bar, info="rollouts ...")
                metrics = training_step(run, producer, lambda: progress.update(bar, info="update ..."))
                progress.update(
                    bar,
                    completed=trainer.step,
                    info=(
                        f"reward {metrics.get('reward_mean', 0):.3f}  loss {metrics.get('loss', 0):.4f}  "
                        f"degenerate {int(metrics.get('groups_degenerate', 0))}/{int(metrics.get('groups', 0))}  "
                        f"failed {int(metrics.get('rollouts_failed', 0))}"
                    ),
                )
                if cfg.eval.every and trainer.step % cfg.eval.every == 0 and trainer.step < cfg.steps:
                    last_eval = run.evaluate("periodic")
                if cfg.checkpoint.every and trainer.step % cfg.checkpoint.every == 0:
                    save_checkpoint(run)
                if run.main_rank and cfg.logging.plot_every and trainer.step % cfg.logging.plot_every == 0:
                    plot_metrics(run.logger.path, run.run_dir / "metrics.png")
                if producer is not None:
                    producer.release(trainer.step)
    finally:
        if producer is not None:
            producer.stop()
    return last_eval


def start_producer(run: Run) -> RolloutProducer:
    """The rollout side of the remaining steps on its own thread (trainers.rollout_producer)."""

    def collect_batch() -> tuple[RolloutBatch, Any]:
        batch = collect(run.envs, run.samplers, run.train_tasks, run.policy, run.cfg)
        return batch, [s.state() for s in run.samplers]

    return RolloutProducer(
        collect_batch,
        start_version=run.trainer.step,
        batches=run.cfg.steps - run.trainer.step,
        max_staleness=run.cfg.trainer.max_staleness,
    )


def training_step(
    run: Run, producer: RolloutProducer | None, on_update: Callable[[], None] | None = None
) -> dict[str, float]:
    """One step: rank 0 takes the next batch from the producer, leaves out groups past the staleness bound
    and broadcasts the rest; every rank trains on it; logged.

    Time per step: `rollout_s` (the batch's collection), `wait_s` (the trainer waiting for it: all of the
    collection when synchronous), `producer_wait_s` (the rollout side waiting for the staleness bound),
    `update_s` (the update, weight push included) and `step_s` (the trainer's wall time for the step)."""
    t0 = time.perf_counter()
    item = None
    if run.main_rank and producer is not None:
        produced, wait_s = producer.next()
        batch, stale = apply_staleness(
            produced.batch, run.trainer.step, run.cfg.trainer.max_staleness, run.cfg.trainer.stale_groups
        )
        timing = {"rollout_s": produced.collect_s, "wait_s": wait_s, "producer_wait_s": produced.bound_wait_s}
        item = (batch, stale, timing, produced.position)
        run.rollout_log.append(rows_from_batch(produced.batch, run.trainer.step + 1, **training_row_fields(run)))
    batch, stale, timing, run.position = D.broadcast_object(item)
    if on_update is not None:
        on_update()
    metrics = run.trainer.update(batch)
    metrics.update(tree_metrics(batch.forests))
    metrics.update(dynamic_sampling_metrics(batch))
    metrics.update(stale)
    metrics.update(timing)
    metrics["policy_version"] = float(run.trainer.step)
    metrics["step_s"] = time.perf_counter() - t0
    metrics.update(memory_metrics())
    run.logger.log(metrics, run.trainer.step)
    return metrics


def training_row_fields(run: Run) -> dict[str, Any]:
    """What every training rollout row of this run says about the policy (see evaluation.evidence)."""
    if not run.row_fields:
        run.row_fields = {
            "experiment": run.run_dir.name,
            "arm": "+".join(env.harness.name for env in run.envs),
            "seed": run.cfg.seed,
            "suite": "+".join(dict.fromkeys(env.suite.name for env in run.envs)),
            "commit": current_commit(),
        }
    return run.row_fields


def save_checkpoint(run: Run) -> None:
    """step_N.pt with the task samplers' positions; latest.pt linked to it; older ones pruned."""
    extra = {"samplers": run.position if run.position is not None else [s.state() for s in run.samplers]}
    saved = run.trainer.save_checkpoint(run.ckpt_dir / f"step_{run.trainer.step:06d}.pt", extra)
    if run.main_rank:
        link_latest(saved)
        prune_checkpoints(run.ckpt_dir, run.cfg.checkpoint.keep)


def finish(run: Run) -> dict[str, Any]:
    """Failure counts (and the proxy's and the server pool's counts) into the summary; final plot and summary.json."""
    run.summary["failures"] = run.runtime.failures.as_dict() if run.runtime is not None else {}
    run.summary["proxy"] = run.runtime.proxy_report() if run.runtime is not None else None  # shards, guards
    if isinstance(run.engine, ReportingEngine):  # the vLLM server pool: calls per server, lost servers, weight updates
        run.summary["engine"] = run.engine.report()
    if run.main_rank:
        if run.logger.path.is_file():
            plot_metrics(run.logger.path, run.run_dir / "metrics.png")
        (run.run_dir / "summary.json").write_text(json.dumps(run.summary, indent=2, default=str))
        console.print(
            f"metrics: {run.logger.path}  plot: {run.run_dir / 'metrics.png'}  summary: {run.run_dir / 'summary.json'}"
        )
    return run.summary


def close(run: Run) -> None:
    """Close the logger, the engine (servers it started stop) and the runtime (proxy, sandboxes); idempotent."""
    run.logger.close()
    engine, run.engine = run.engine, None
    if isinstance(engine, ClosableEngine):
        engine.close()
    runtime, run.runtime = run.runtime, None
    if runtime is not None:
        runtime.close()
