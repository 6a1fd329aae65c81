"""White-box vs black-box training, the shape of the experiment: train one policy in the white-box loop,
another through a black-box harness, evaluate both (and the starting policy) under both, print the 2x2 table.

    from clawgym_cli.compare import compare
    report = compare(suite="ClawGymBench", harness="Pi", model="tiny-qwen3", steps=2)
    report.console_print()

                     evaluated in WhiteBox    evaluated in Pi
    baseline (start)        ...                    ...
    trained in WhiteBox     ...                    ...
    trained in Pi           ...                    ...

Command line: `clawgym compare --suite ClawGymBench --harness Pi --model qwen2.5-coder-0.5b --steps 20`.

Training goes through the bundled trainers (`trainers.loop.train` on a config composed like `clawgym
train`), each run saving its final checkpoint; the trained policies are rebuilt from those checkpoints.
Evaluation is `evaluation.evaluate` on the held-out split (bootstrap-over-tasks CIs). The
defaults are tiny so that the whole comparison finishes on a small CPU; they show the plumbing, not a
learning result: scale `model`, `steps`, `group_size` and the task counts up for that.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from clawgym_env.interfaces import ClosableEngine
from evaluation import EvalReport, GroupStats, SavedReport, evaluate, fmt_mean_ci

BASELINE = "baseline (start)"
TRAINED_IN = "trained in {harness}"
ZOO_CONFIGS = Path(__file__).resolve().parents[1] / "trainers" / "conf" / "model"

TrainFn = Callable[[Any], dict[str, Any]]
"""TrainConfig -> summary; trainers.loop.train by default (tests may pass their own)."""


class CompareConfig(BaseModel):
    suite: str = "ClawGymBench"
    harness: str = "Pi"
    whitebox: str = "WhiteBox"
    model: str = "tiny-qwen3"
    algorithm: str = "grpo"
    steps: int = Field(default=2, ge=1)
    group_size: int = Field(default=2, ge=1)
    tasks_per_step: int = Field(default=1, ge=1)
    train_tasks: int | None = Field(default=2, ge=1)
    eval_tasks: int | None = Field(default=2, ge=1)
    level: int | None = 0
    repeats: int = Field(default=1, ge=1)
    concurrency: int = Field(default=2, ge=1)
    lr: float = Field(default=1e-5, gt=0)
    max_new_tokens: int = Field(default=64, ge=1)
    max_calls: int = Field(default=4, ge=1)
    warm_start: bool = False
    success_threshold: float = Field(default=1.0, ge=0, le=1)
    eval_temperature: float | None = None
    seed: int = 0
    train_overrides: list[str] = Field(default_factory=list)  # extra Hydra overrides, as for `clawgym train`

    @property
    def whitebox_env(self) -> str:
        return f"{self.suite}-{self.whitebox}"

    @property
    def blackbox_env(self) -> str:
        return f"{self.suite}-{self.harness}"


class TrainingRun(BaseModel):
    env_id: str
    run_dir: str
    checkpoint: str
    wall_s: float
    summary: dict[str, Any] = Field(default_factory=dict)


class ComparisonReport(SavedReport):
    """cells[policy label][harness] = held-out stats of that policy evaluated through that harness."""

    FILES: ClassVar[tuple[str, str, str]] = ("comparison.json", "comparison.txt", "comparison.png")

    config: CompareConfig
    policies: list[str]
    harnesses: list[str]
    cells: dict[str, dict[str, GroupStats]]
    training: dict[str, TrainingRun] = Field(default_factory=dict)
    evaluations: dict[str, str] = Field(default_factory=dict)  # policy label -> its results.json
    wall_s: float = 0.0
    out_dir: str | None = None

    def table(self) -> Table:
        c = self.config
        title = (
            f"{c.suite}: {c.model}, {c.algorithm} {c.steps} step(s) x {c.tasks_per_step} task(s) x {c.group_size} "
            f"rollouts; held-out mean reward [95% CI] (success rate)"
        )
        table = Table(title=title)
        table.add_column("policy", no_wrap=True)
        for h in self.harnesses:
            table.add_column(f"evaluated in {h}", justify="right", no_wrap=True)
        for label in self.policies:
            cells = []
            for h in self.harnesses:
                s = self.cells[label].get(h)
                cells.append(f"{fmt_mean_ci(s.mean_reward, s.reward_ci)} ({s.success_rate:.2f})" if s else "-")
            table.add_row(label, *cells)
        return table

    def tables(self) -> list[Table]:
        return [self.table()]

    def _plot(self, path: Path) -> Path:
        return plot_comparison(self, path)


def plot_comparison(report: ComparisonReport, path: str | Path) -> Path:
    """Grouped bars: one group per evaluation harness, one bar (with its 95% CI) per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.5, 4))
    width = 0.8 / len(report.policies)
    x = np.arange(len(report.harnesses))
    for i, label in enumerate(report.policies):
        stats = [report.cells[label].get(h) for h in report.harnesses]
        means = [s.mean_reward if s else 0.0 for s in stats]
        err = np.array(
            [
                [s.mean_reward - s.reward_ci.low if s and s.reward_ci else 0.0 for s in stats],
                [s.reward_ci.high - s.mean_reward if s and s.reward_ci else 0.0 for s in stats],
            ]
        )
        ax.bar(
            x + (i - (len(report.policies) - 1) / 2) * width,
            means,
            width,
            yerr=np.clip(err, 0, None),
            capsize=4,
            label=label,
        )
    ax.set_xticks(x, [f"evaluated in {h}" for h in report.harnesses])
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("held-out mean reward (95% CI)")
    ax.set_title(f"{report.config.suite}: white-box vs black-box training ({report.config.model})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- training
def train_config(config: CompareConfig, env_id: str, run_dir: Path) -> Any:
    """The TrainConfig of one training run: `clawgym train`'s defaults with the comparison's knobs."""
    from trainers.config import TrainConfig
    from trainers.main import compose

    groups = [f"algorithm={config.algorithm}"]
    if (ZOO_CONFIGS / f"{config.model}.yaml").is_file():
        groups.append(f"model={config.model}")
    data = compose([*groups, *config.train_overrides]).model_dump()
    if not (ZOO_CONFIGS / f"{config.model}.yaml").is_file():
        data["model"]["name"] = config.model  # a local model path
    data.update(run_dir=run_dir, seed=config.seed, steps=config.steps)
    data["env"].update(
        ids=[env_id],
        group_size=config.group_size,
        tasks_per_step=config.tasks_per_step,
        level=config.level,
        train_tasks=config.train_tasks,
        eval_tasks=1,
        max_concurrency=config.concurrency,
        suite_seed=config.seed,
        options={**data["env"]["options"], "max_new_tokens": config.max_new_tokens, "max_calls": config.max_calls},
    )
    data["optim"]["lr"] = config.lr
    data["optim"]["total_steps"] = config.steps
    # the comparison evaluates separately (all policies, both harnesses); the trainer's own is one rollout
    data["eval"].update(every=0, at_start=False, repeats=1)
    data["checkpoint"].update(every=config.steps, resume=None)  # the final weights land in latest.pt
    data["logging"].update(tensorboard=False, progress=False, plot_every=0)
    data["warm_start"]["enabled"] = config.warm_start
    return TrainConfig.model_validate(data)


def train_one(config: CompareConfig, env_id: str, run_dir: Path, train_fn: TrainFn | None = None) -> TrainingRun:
    if train_fn is None:
        from trainers.loop import train as train_fn
    cfg = train_config(config, env_id, run_dir)
    start = time.perf_counter()
    summary = train_fn(cfg)
    checkpoint = run_dir / "checkpoints" / "latest.pt"
    if not checkpoint.is_file():
        raise RuntimeError(f"training on {env_id} wrote no checkpoint at {checkpoint}; see {run_dir}")
    return TrainingRun(
        env_id=env_id,
        run_dir=str(run_dir),
        checkpoint=str(checkpoint),
        wall_s=time.perf_counter() - start,
        summary=summary,
    )


def build_policy(cfg: Any, checkpoint: str | Path | None = None) -> Any:
    """The starting policy of a TrainConfig, or the trained one from a checkpoint the trainer saved.

    Served by the engine the config names (`cfg.engine`: transformers, vllm, vllm_server, remote), built as the
    trainer builds its rollout engine, so a policy is evaluated where it was trained and a vLLM run's held-out
    rollouts go as fast as its training rollouts. The trained weights go in as during training: through
    `engine.update_weights` (a LoRA policy's adapted layers, merged) or, with `model.lora.sync=adapter`,
    `engine.update_adapter`. A LoRA checkpoint holds the adapter alone; the base weights are loaded here.
    """
    import torch

    from clawgym_env.chat import ChatMLRenderer
    from clawgym_env.interfaces import Policy
    from trainers.core import check_base_model
    from trainers.loop import build_engine
    from trainers.model import apply_lora, export_adapter, export_weights, load_model, load_trainable_state

    dtype = getattr(torch, cfg.model.dtype)
    model, tokenizer = load_model(cfg.model.name, dtype=dtype, seed=cfg.model.seed)
    base: Any = model  # free for the checkpoint's weights unless the engine serves it
    if cfg.engine.kind == "transformers":  # serve the loaded model itself: nothing trains it here
        from clawgym_env.engines.transformers_engine import TransformersEngine

        engine: Any = TransformersEngine(
            model.eval().requires_grad_(False), tokenizer, seed=cfg.seed, **cfg.engine.options
        )
        base = None
    else:  # the engine loads its own copy of the weights
        engine = build_engine(cfg, model, tokenizer)
    if checkpoint is not None:
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        if base is None:
            base = load_model(cfg.model.name, dtype=dtype, seed=cfg.model.seed)[0]
        trained = apply_lora(base, cfg.model.lora)
        if state.get("model_format") == "adapter":  # a LoRA checkpoint: the adapter on the base just loaded
            check_base_model(
                state, {"name": cfg.model.name, "dtype": cfg.model.dtype, "seed": cfg.model.seed}, checkpoint
            )
            load_trainable_state(trained, state["model"])
        else:
            trained.load_state_dict(state["model"])
        if cfg.model.lora.enabled and cfg.model.lora.sync == "adapter":
            engine.update_adapter(export_adapter(trained), version=int(state["step"]))
        else:
            engine.update_weights(export_weights(trained), version=int(state["step"]))
    return Policy(engine=engine, renderer=ChatMLRenderer(tokenizer), name=cfg.model.name)


# ---------------------------------------------------------------------------------------------- the comparison
def compare(
    suite: str = "ClawGymBench",
    harness: str = "Pi",
    model: str = "tiny-qwen3",
    *,
    out: str | Path | None = None,
    train_fn: TrainFn | None = None,
    progress: bool = False,
    **knobs: Any,
) -> ComparisonReport:
    """Train in `<suite>-WhiteBox` and in `<suite>-<harness>`, evaluate baseline + both under both.

    `knobs` are CompareConfig fields (steps, group_size, tasks_per_step, train_tasks, eval_tasks, level,
    repeats, concurrency, lr, max_new_tokens, max_calls, warm_start, algorithm, train_overrides, ...).
    Everything goes under `out` (default runs/compare-<time>): train-<harness>/ (the trainer's run
    directories), eval-<policy>/ (results.json per policy), comparison.json / .txt / .png.
    """
    import clawgym_env

    config = CompareConfig(suite=suite, harness=harness, model=model, **knobs)
    if config.harness == config.whitebox:
        raise ValueError(
            f"harness must be a black-box harness (ClaudeCode, Codex, Pi, OpenClaw), not {config.whitebox}"
        )
    for env_id in (config.whitebox_env, config.blackbox_env):
        clawgym_env.registry.spec(env_id)  # a clear error with close matches, before any training
    out_dir = Path(out) if out else Path.cwd() / "runs" / time.strftime("compare-%Y%m%d-%H%M%S")
    start = time.perf_counter()

    training = {
        TRAINED_IN.format(harness=h): train_one(config, env_id, out_dir / f"train-{h}", train_fn)
        for h, env_id in ((config.whitebox, config.whitebox_env), (config.harness, config.blackbox_env))
    }
    base_cfg = train_config(config, config.whitebox_env, out_dir / "baseline")
    checkpoints: dict[str, str | None] = {BASELINE: None, **{k: v.checkpoint for k, v in training.items()}}

    harnesses = [config.whitebox, config.harness]
    cells: dict[str, dict[str, GroupStats]] = {}
    evaluations: dict[str, str] = {}
    for label, checkpoint in checkpoints.items():
        policy = build_policy(base_cfg, checkpoint)
        try:
            report: EvalReport = evaluate(
                policy,
                [config.whitebox_env, config.blackbox_env],
                split="test",
                repeats=config.repeats,
                concurrency=config.concurrency,
                level=config.level,
                count=config.eval_tasks,
                seed=config.seed,
                run_dir=out_dir / f"eval-{_slug(label)}",
                success_threshold=config.success_threshold,
                temperature=config.eval_temperature,
                model_name=f"{config.model}: {label}",
                progress=progress,
                env_overrides={"max_new_tokens": config.max_new_tokens, "max_calls": config.max_calls},
            )
        finally:
            if isinstance(policy.engine, ClosableEngine):
                policy.engine.close()
        cells[label] = dict(report.by_harness)
        evaluations[label] = str(report.results_path)

    comparison = ComparisonReport(
        config=config,
        policies=list(checkpoints),
        harnesses=harnesses,
        cells=cells,
        training=training,
        evaluations=evaluations,
        wall_s=time.perf_counter() - start,
        out_dir=str(out_dir),
    )
    comparison.save(out_dir)
    return comparison


def _slug(label: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in label).strip("-").lower().replace("--", "-")


def compare_cli(console: Console | None = None, **knobs: Any) -> ComparisonReport:
    """`clawgym compare`: run the comparison, print the table and where the files went."""
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=140)
    report = compare(progress=console.is_terminal, **knobs)
    report.console_print(console)
    for label, run in report.training.items():
        console.print(f"{label}: {run.wall_s:.0f} s, checkpoint {run.checkpoint}")
    console.print(f"comparison: {report.results_path}\ntable: {report.table_path}\nplot: {report.plot_path}")
    return report
