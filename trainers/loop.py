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
import copy
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainers import distributed as D
from trainers.config import TrainConfig, algorithm_config
from trainers.core import Trainer
from trainers.grpo import GRPO
from trainers.metrics_log import MetricsLogger, console
from trainers.model import _plain, apply_lora, enable_gradient_checkpointing, frozen_copy, load_model
from trainers.plots import plot_metrics
from trainers.ppo import PPO, PPOConfig
from trainers.rollouts import RolloutBatch
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
def build_envs(cfg: TrainConfig, runtime: Any, split: str, temperature: float | None = None) -> list[Any]:
    """One env per id, all on one runtime (one proxy, one sandbox backend)."""
    import clawgym_env
    from clawgym_env.env import ClawGymEnv

    envs = []
    for env_id in cfg.env.ids:
        overrides = dict(cfg.env.options)
        overrides.update(split=split, backend=cfg.sandbox.backend, backend_options=cfg.sandbox.options)
        if temperature is not None:
            overrides["temperature"] = temperature
        template = clawgym_env.make(env_id, **overrides)
        envs.append(ClawGymEnv(template.env_spec, template.suite, template.harness, template.options, runtime=runtime))
    return envs


def load_tasks(env: Any, cfg: TrainConfig, count: int | None) -> list[Any]:
    from evaluation import select_tasks

    return select_tasks(env, level=cfg.env.level, count=count, seed=cfg.env.suite_seed)


def build_engine(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any) -> Any:
    """The inference engine the rollouts use; the trainer pushes weights into it after each update."""
    if cfg.engine.kind == "transformers":
        from clawgym_env.engines.transformers_engine import TransformersEngine

        engine_model = copy.deepcopy(_plain(model))
        return TransformersEngine(engine_model, tokenizer, seed=cfg.seed, **cfg.engine.options)
    from clawgym_env.engines import make_engine

    return make_engine(cfg.engine.kind, model=cfg.model.name, **cfg.engine.options)


# ------------------------------------------------------------------------------------------- rollouts
def collect(envs: list[Any], samplers: list[TaskSampler], tasks: list[list[Any]], policy: Any, cfg: TrainConfig) -> RolloutBatch:
    """One step's rollouts: tasks_per_step tasks per env, group_size rollouts per task, concurrently."""
    from clawgym_env.vector_env import ClawGymVectorEnv

    jobs, harness_of_job = [], []
    groups = len(envs) * cfg.env.tasks_per_step
    per_group = max(1, cfg.env.max_concurrency // groups)
    for env, sampler, env_tasks in zip(envs, samplers, tasks):
        venv = ClawGymVectorEnv(env, num_envs=cfg.env.group_size, max_concurrency=per_group)
        for idx in sampler.draw(cfg.env.tasks_per_step):
            jobs.append(venv.arollouts(policy, [env_tasks[idx]] * cfg.env.group_size))
            harness_of_job.append(env.harness.name)

    async def run_all() -> list[list[Any]]:
        return list(await asyncio.gather(*jobs))

    results = envs[0].runtime.run(run_all())
    forests, rewards, statuses, task_ids, harnesses, infos = [], [], [], [], [], []
    for group, harness in zip(results, harness_of_job):
        for r in group:
            forests.append(r.forest)
            rewards.append(r.reward if r.status == "ok" else np.nan)
            statuses.append(r.status)
            task_ids.append(r.task_id)
            harnesses.append(harness)
            infos.append({"rollout_id": r.rollout_id, "failure": r.failure.model_dump() if r.failure else None})
    return RolloutBatch(forests, np.array(rewards, dtype=np.float64), statuses, task_ids, harnesses, infos)


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
    keep = ("calls", "leaves", "dead_leaves_removed", "compaction_calls_set_aside", "subagent_calls_set_aside",
            "dropped_overfork", "drift_events", "failed_calls")  # fmt: skip
    return {f"tree/{k}": float(getattr(total, k)) for k in keep}


def evaluate(envs: list[Any], tasks: list[list[Any]], policy: Any, repeats: int) -> dict[str, float]:
    """Mean held-out reward per harness (failed rollouts count 0) and overall."""
    async def run_all() -> list[list[Any]]:
        return list(await asyncio.gather(*(env.arollout(policy, t) for env, ts in zip(envs, tasks) for t in ts for _ in range(repeats))))

    results = envs[0].runtime.run(run_all())
    by_harness: dict[str, list[float]] = {}
    i = 0
    for env, ts in zip(envs, tasks):
        for _ in range(len(ts) * repeats):
            r = results[i]
            i += 1
            by_harness.setdefault(env.harness.name, []).append(float(r.reward) if r.status == "ok" else 0.0)
    out = {f"eval_reward/{h}": float(np.mean(v)) for h, v in by_harness.items()}
    out["eval_reward_mean"] = float(np.mean([x for v in by_harness.values() for x in v]))
    out["eval_rollouts"] = float(i)
    return out


# ------------------------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train from a validated config; returns a summary (also written to run_dir/summary.json)."""
    from clawgym_env.interfaces import Policy
    from clawgym_env.proxy import ChatMLRenderer
    from clawgym_env.runtime import Runtime

    D.init_from_env()
    main_rank = D.rank() == 0
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if main_rank:
        (run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))

    algo_cfg = algorithm_config(cfg.algorithm)
    dtype = getattr(torch, cfg.model.dtype)
    model, tokenizer = load_model(cfg.model.name, dtype=dtype, seed=cfg.model.seed)
    model = apply_lora(model, cfg.model.lora)
    if cfg.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    ref_model = frozen_copy(model) if algo_cfg.kl_coef else None
    critic = (
        Critic(copy.deepcopy(unwrap(model) if not cfg.model.lora.enabled else _plain(model)), train_trunk=algo_cfg.train_critic_trunk)
        if isinstance(algo_cfg, PPOConfig)
        else None
    )
    model.to(cfg.device)
    if critic is not None:
        critic.to(cfg.device)
    if D.is_distributed():
        D.shard_model(model)
        if critic is not None:
            D.shard_model(critic)
    algorithm = PPO(algo_cfg) if isinstance(algo_cfg, PPOConfig) else GRPO(algo_cfg)

    engine = policy = runtime = None
    envs: list[Any] = []
    eval_envs: list[Any] = []
    train_tasks: list[list[Any]] = []
    eval_tasks: list[list[Any]] = []
    if main_rank:
        engine = build_engine(cfg, model, tokenizer)
        policy = Policy(engine=engine, renderer=ChatMLRenderer(tokenizer), name=cfg.model.name)
        runtime = Runtime(run_dir / "rollouts")
        envs = build_envs(cfg, runtime, cfg.env.split)
        eval_envs = build_envs(cfg, runtime, cfg.env.eval_split, cfg.eval.temperature)
        train_tasks = [load_tasks(e, cfg, cfg.env.train_tasks) for e in envs]
        eval_tasks = [load_tasks(e, cfg, cfg.env.eval_tasks) for e in eval_envs]
    samplers = [TaskSampler(len(ts), cfg.seed + i) for i, ts in enumerate(train_tasks)]
    trainer = Trainer(model, algorithm, cfg.optim, engine=engine, critic=critic, ref_model=ref_model, device=cfg.device)
    logger = MetricsLogger(run_dir, tensorboard=cfg.logging.tensorboard, enabled=main_rank)
    summary: dict[str, Any] = {"run_dir": str(run_dir), "algorithm": algorithm.name, "env_ids": cfg.env.ids, "stages": {}}

    # ---- resume
    ckpt_dir = run_dir / "checkpoints"
    resume = cfg.checkpoint.resume
    if resume == "auto":
        resume = newest_checkpoint(ckpt_dir)
    if resume:
        extra = trainer.load_checkpoint(resume)
        dropped = logger.truncate_after(trainer.step)  # steps past the checkpoint run again
        if dropped and main_rank:
            console.print(f"dropped {dropped} metric records past step {trainer.step}: those steps run again")
        for sampler, state in zip(samplers, extra.get("samplers", [])):
            sampler.set_state(state)
        trainer.sync_weights()
        console.print(f"resumed from {resume} at step {trainer.step}")

    def eval_now(label: str) -> dict[str, float]:
        metrics = evaluate(eval_envs, eval_tasks, policy, cfg.eval.repeats) if main_rank else {}
        metrics = D.broadcast_object(metrics)
        logger.log({**metrics, "label": label}, trainer.step, kind="eval")
        if main_rank:
            console.print(f"[bold]eval ({label}, step {trainer.step})[/bold] " + ", ".join(f"{k}={v:.3f}" for k, v in metrics.items() if k.startswith("eval_reward")))
        return metrics

    # ---- warm start, its own stage with reward before and after
    if cfg.warm_start.enabled and trainer.step == 0:
        from trainers.warm_start import collect_demonstrations, sft

        before = eval_now("before_warm_start")
        demos = None
        if main_rank:
            demo_tasks = [ts[: cfg.warm_start.tasks] if cfg.warm_start.tasks else ts for ts in train_tasks]
            demos = collect_demonstrations(envs, demo_tasks, cfg.warm_start.demos_per_task, tokenizer)
        demos = D.broadcast_object(demos)
        report = sft(model, demos, epochs=cfg.warm_start.epochs, lr=cfg.warm_start.lr, token_budget=cfg.warm_start.token_budget)
        trainer.sync_weights()
        after = eval_now("after_warm_start")
        summary["stages"]["warm_start"] = {"report": report.model_dump(), "before": before, "after": after}
        logger.log({"sft_loss_first": report.loss_per_epoch[0] if report.loss_per_epoch else None,
                    "sft_loss_last": report.loss_per_epoch[-1] if report.loss_per_epoch else None,
                    "demonstrations": report.demonstrations, "successful": report.successful}, 0, kind="warm_start")  # fmt: skip

    start_eval = None
    if cfg.eval.at_start and trainer.step == 0:
        warm = summary["stages"].get("warm_start")
        start_eval = warm["after"] if warm else eval_now("start")
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console,
                        disable=not (main_rank and cfg.logging.progress))  # fmt: skip
    last_eval = start_eval
    with progress:
        bar = progress.add_task(f"{algorithm.name} training", total=cfg.steps, completed=trainer.step, info="")
        while trainer.step < cfg.steps:
            t0 = time.perf_counter()
            progress.update(bar, info="rollouts ...")
            batch = collect(envs, samplers, train_tasks, policy, cfg) if main_rank else None
            batch = D.broadcast_object(batch)
            rollout_s = time.perf_counter() - t0
            progress.update(bar, info="update ...")
            metrics = trainer.update(batch)
            metrics.update(tree_metrics(batch.forests))
            metrics["rollout_s"] = rollout_s
            metrics["policy_version"] = float(trainer.step)
            logger.log(metrics, trainer.step)
            progress.update(bar, completed=trainer.step, info=(
                f"reward {metrics.get('reward_mean', 0):.3f}  loss {metrics.get('loss', 0):.4f}  "
                f"degenerate {int(metrics.get('groups_degenerate', 0))}/{int(metrics.get('groups', 0))}  "
                f"failed {int(metrics.get('rollouts_failed', 0))}"))  # fmt: skip
            if cfg.eval.every and trainer.step % cfg.eval.every == 0 and trainer.step < cfg.steps:
                last_eval = eval_now("periodic")
            if cfg.checkpoint.every and trainer.step % cfg.checkpoint.every == 0:
                extra = {"samplers": [s.state() for s in samplers]}
                saved = trainer.save_checkpoint(ckpt_dir / f"step_{trainer.step:06d}.pt", extra)
                if main_rank:
                    link_latest(saved)
                    prune_checkpoints(ckpt_dir, cfg.checkpoint.keep)
            if main_rank and cfg.logging.plot_every and trainer.step % cfg.logging.plot_every == 0:
                plot_metrics(logger.path, run_dir / "metrics.png")

    final_eval = eval_now("end") if cfg.steps > 0 or last_eval is None else last_eval
    summary.update({"steps": trainer.step, "eval_start": start_eval, "eval_end": final_eval,
                    "failures": runtime.failures.as_dict() if runtime is not None else {}})  # fmt: skip
    if main_rank:
        if logger.path.is_file():
            plot_metrics(logger.path, run_dir / "metrics.png")
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        console.print(f"metrics: {logger.path}  plot: {run_dir / 'metrics.png'}  summary: {run_dir / 'summary.json'}")
    logger.close()
    if engine is not None and hasattr(engine, "close"):
        engine.close()
    if runtime is not None:
        runtime.close()
    return summary
