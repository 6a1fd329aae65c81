"""The shared training core: optimizer and schedule, gradient accumulation over packed micro-batches,
checkpoints that resume exactly, and weight sync into the inference engine.

An algorithm (trainers.grpo.GRPO, trainers.ppo.PPO) supplies two things: `prepare(trainer, rollouts)`
turns a step's rollouts into packed micro-batches with per-token advantages, and
`micro_batch_loss(trainer, mb, normalizer)` gives one micro-batch's share of the loss. `Trainer.update`
does the rest:

    micro-batches <- algorithm.prepare(rollouts)              (each <= token_budget unique tokens)
    N <- trained tokens in the whole batch                     (the unique-token-mean normaliser)
    for each epoch, for each minibatch of micro-batches:
        zero grads; for each micro-batch of this rank: backward(loss_mb * world)   (sum_mb loss_mb = L)
        clip grad norm; optimizer step
    scheduler step; step += 1; engine.update_weights(weights, version=step)
"""

from __future__ import annotations

import contextlib
import math
import random
import time
import warnings
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
from pydantic import BaseModel, Field
from torch import nn

from clawgym_env.trajectory.packing import tree_logprobs
from trainers import distributed as D
from trainers.losses import LossParts, MetricSums, PolicyLossConfig
from trainers.model import export_adapter, export_weights, load_trainable_state
from trainers.rollout_batch import RolloutBatch
from trainers.tree_batch import TreeBatch
from trainers.tree_forward import Critic


class OptimConfig(BaseModel):
    """AdamW with linear warm-up, then constant, linear or cosine decay."""

    lr: float = Field(default=1e-5, gt=0)
    critic_lr: float = Field(default=1e-5, gt=0, description="PPO critic learning rate")
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0)
    warmup_steps: int = Field(default=0, ge=0)
    schedule: str = Field(default="constant", pattern="^(constant|linear|cosine)$")
    total_steps: int = Field(default=100, ge=1, description="for the decay schedules")
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    token_budget: int = Field(default=4096, ge=1, description="unique tokens per packed micro-batch")
    share_prompts: bool = Field(
        default=True,
        description="compute a group's common leading prompt once per micro-batch (exact; off = each rollout alone)",
    )
    epochs: int = Field(default=1, ge=1, description="passes over each step's batch")
    minibatches: int = Field(default=1, ge=1, description="optimizer steps per pass")
    autocast: Literal["bfloat16"] | None = Field(
        default=None,
        description="run the forward and backward passes under torch.autocast in this dtype (weights, adapters "
        "and optimizer stay float32; log-softmax stays float32): an update was 2.2x faster on a CPU with AMX "
        "(benchmarks.autocast_bench); null = float32 throughout",
    )


def lr_lambda(config: OptimConfig):
    def factor(step: int) -> float:
        if config.warmup_steps and step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.schedule == "constant":
            return 1.0
        span = max(1, config.total_steps - config.warmup_steps)
        progress = min(1.0, (step - config.warmup_steps) / span)
        decay = 1.0 - progress if config.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * decay

    return factor


class Algorithm(Protocol):
    name: str
    config: PolicyLossConfig

    def prepare(self, trainer: Trainer, rollouts: RolloutBatch) -> tuple[list[TreeBatch], dict[str, float]]: ...

    def micro_batch_loss(self, trainer: Trainer, mb: TreeBatch, normalizer: float) -> LossParts: ...


class Trainer:
    """Holds the model (and PPO's critic), optimizer, schedule and step; one `update` per training step."""

    def __init__(
        self,
        model: nn.Module,
        algorithm: Algorithm,
        optim: OptimConfig | None = None,
        *,
        engine: Any = None,
        critic: Critic | None = None,
        ref_model: nn.Module | None = None,
        device: torch.device | str = "cpu",
        base_model: dict[str, Any] | None = None,
        adapter_sync: bool = False,
    ) -> None:
        self.model = model
        self.base_model = base_model  # the base weights' identity (name, dtype, seed): an adapter checkpoint needs it
        if adapter_sync and (not hasattr(model, "peft_config") or D.is_distributed()):
            raise ValueError("adapter sync needs a LoRA policy (model.lora.enabled=true) in a single process")
        self.adapter_sync = adapter_sync
        self.algorithm = algorithm
        self.optim_config = optim or OptimConfig()
        self.engine = engine
        self.critic = critic
        self.ref_model = ref_model
        self.device = torch.device(device)
        groups = [{"params": [p for p in model.parameters() if p.requires_grad], "lr": self.optim_config.lr}]
        if critic is not None:
            groups.append(
                {"params": [p for p in critic.parameters() if p.requires_grad], "lr": self.optim_config.critic_lr}
            )
        self.optimizer = torch.optim.AdamW(
            groups,
            lr=self.optim_config.lr,
            betas=self.optim_config.betas,
            eps=self.optim_config.eps,
            weight_decay=self.optim_config.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(self.optim_config))
        self.step = 0

    # ------------------------------------------------------------------ one training step
    def update(self, rollouts: RolloutBatch) -> dict[str, float]:
        """Train on one step's rollouts; returns the step's metrics (same on every rank)."""
        start = time.perf_counter()
        self.model.train()
        micro_batches, metrics = self.algorithm.prepare(self, rollouts)
        total_tokens = sum(mb.num_loss_tokens for mb in micro_batches)
        metrics.update(
            {
                "micro_batches": float(len(micro_batches)),
                "unique_tokens": float(sum(mb.num_tokens for mb in micro_batches)),
                "branch_tokens": float(sum(mb.branch_tokens for mb in micro_batches)),
                "trained_tokens": float(total_tokens),
            }
        )
        sums = MetricSums()
        loss_total = 0.0
        grad_norm = 0.0
        if total_tokens == 0:
            metrics["update_skipped"] = 1.0  # no usable signal (all groups degenerate or failed)
        else:
            metrics["update_skipped"] = 0.0
            if self.optim_config.epochs * self.optim_config.minibatches > 1:
                self._record_old(micro_batches)
            for _ in range(self.optim_config.epochs):
                for chunk in _split(micro_batches, self.optim_config.minibatches):
                    normalizer = float(sum(mb.num_loss_tokens for mb in chunk))
                    if normalizer == 0:
                        continue
                    self.optimizer.zero_grad(set_to_none=True)
                    for mb, weight in self._share_of(chunk):
                        with self.autocast():
                            parts = self.algorithm.micro_batch_loss(self, mb, normalizer)
                        (parts.loss * (weight * D.world_size())).backward()
                        if weight:
                            sums.add(parts.sums)
                            loss_total += float(parts.loss.detach())
                    grad_norm = self._clip_and_step()
        with warnings.catch_warnings():  # a skipped update still advances the schedule with the step count
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()
        self.step += 1
        synced = time.perf_counter()
        metrics["weight_sync_bytes"] = float(self.sync_weights())
        metrics["weight_sync_s"] = time.perf_counter() - synced  # part of update_s
        metrics.update(self._reduce(sums, loss_total))
        metrics.update(
            {
                "step": float(self.step),
                "grad_norm": float(grad_norm),
                "lr": float(self.scheduler.get_last_lr()[0]),
                "update_s": time.perf_counter() - start,
            }
        )
        metrics["unique_tokens_per_s"] = metrics["unique_tokens"] / max(metrics["update_s"], 1e-9)
        return metrics

    def _share_of(self, chunk: list[TreeBatch]) -> list[tuple[TreeBatch, float]]:
        """This rank's micro-batches (round robin); ranks with fewer run a zero-weight copy so FSDP's
        collectives line up (every rank must run the same number of forward/backward passes)."""
        world, me = D.world_size(), D.rank()
        mine = [(mb, 1.0) for i, mb in enumerate(chunk) if i % world == me]
        rounds = math.ceil(len(chunk) / world)
        while len(mine) < rounds:
            mine.append((chunk[0], 0.0))
        return mine

    def _record_old(self, micro_batches: list[TreeBatch]) -> None:
        """Log-probs (and values) before any update, when the batch is used for more than one step."""
        with torch.no_grad(), self.autocast():
            for mb in micro_batches:
                temperature = self.algorithm.config.temperature  # the loss's log-probs are at this temperature too
                mb.old_logprobs = tree_logprobs(
                    self.model, mb.packed, temperature=temperature, with_entropy=False
                ).logprobs.detach()
                if self.critic is not None and mb.old_values is None:
                    mb.old_values = self.critic(mb).detach()

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The passes' autocast (`optim.autocast`), or nothing: backward runs in the dtypes its forward chose."""
        dtype = self.optim_config.autocast
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, dtype))

    def _clip_and_step(self) -> float:
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        norm = 0.0
        if self.optim_config.max_grad_norm is not None and params:
            total = torch.nn.utils.clip_grad_norm_(params, self.optim_config.max_grad_norm)
            norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
        self.optimizer.step()
        return norm

    def _reduce(self, sums: MetricSums, loss_total: float) -> dict[str, float]:
        if D.is_distributed():
            merged = MetricSums()
            parts = D.gather_objects((dict(sums.sums), loss_total))
            for s, _ in parts:
                merged.add(s)
            sums, loss_total = merged, sum(loss for _, loss in parts)
        out = sums.means()
        out["loss"] = loss_total
        return out

    # ------------------------------------------------------------------ weight sync
    def sync_weights(self) -> int:
        """Push the new weights into the inference engine, tagged with the new policy version (= step); returns
        the bytes sent (the trainer's tensors, before any cast to the engine's dtype).

        With `adapter_sync` (a LoRA policy, an engine that loads adapters) only the adapter goes; otherwise
        the weights training can change (a LoRA policy's adapted layers merged, trainers.model.export_weights)."""
        # under torchrun only rank 0 holds the engine, but gathering the weights is collective: every rank
        # joins when rank 0 has an engine (a rank skipping it would leave rank 0 waiting in the gather)
        if not D.broadcast_object(self.engine is not None):
            return 0
        if self.adapter_sync:
            adapter = export_adapter(self.model)
            self.engine.update_adapter(adapter, version=self.step)
            return adapter.num_bytes
        weights = export_weights(self.model)  # collective under FSDP (the full tensors land on rank 0)
        if D.rank() == 0:
            self.engine.update_weights(weights, version=self.step)
        return sum(t.numel() * t.element_size() for t in weights.values())

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        # a LoRA policy: its adapters are all that training changed (~1 % of the bytes); copying only them
        # keeps a checkpoint from holding a second copy of the frozen base weights while it is written
        adapter_only = hasattr(self.model, "peft_config")
        model_state = _module_state(self.model, trainable_only=adapter_only)
        state: dict[str, Any] = {
            "step": self.step,
            "model": model_state,
            "model_format": "adapter" if adapter_only else "full",
            "base_model": self.base_model,
            "optimizer": _optimizer_state(self.model, self.optimizer, self.critic),
            "scheduler": self.scheduler.state_dict(),
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            },
            "extra": extra or {},
        }
        if self.critic is not None:
            state["critic"] = _module_state(self.critic)
        return state

    def save_checkpoint(self, path: str | Path, extra: dict[str, Any] | None = None) -> Path:
        """Model, critic, optimizer, scheduler, step, RNG states and `extra` (e.g. the data position)."""
        path = Path(path)
        state = self.state_dict(extra)  # collective under FSDP
        if D.rank() == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            torch.save(state, tmp)
            tmp.replace(path)  # a crash mid-save never leaves a truncated checkpoint
        return path

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Restore everything `save_checkpoint` wrote; returns its `extra`."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint at {path}; pass the .pt file that save_checkpoint wrote")
        state = torch.load(path, map_location="cpu", weights_only=False)
        check_base_model(state, self.base_model, path)
        _load_module_state(self.model, state["model"], adapter_only=state.get("model_format") == "adapter")
        if self.critic is not None:
            if "critic" not in state:
                raise KeyError(f"{path} has no critic state: it was not written by a PPO run")
            _load_module_state(self.critic, state["critic"])
        _load_optimizer_state(self.model, self.optimizer, state["optimizer"], self.critic)
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        rng = state["rng"]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        return state["extra"]


def _split(items: list[TreeBatch], parts: int) -> list[list[TreeBatch]]:
    parts = max(1, min(parts, len(items)))
    size = math.ceil(len(items) / parts)
    return [items[i : i + size] for i in range(0, len(items), size)]


# FSDP-aware state helpers: full (unsharded) state on CPU, so a checkpoint loads into any world size.
def _module_state(module: nn.Module, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """A copy of the module's state, or of its trainable parameters only (nothing frozen is copied)."""
    if D.is_distributed():
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
        state = get_model_state_dict(module, options=options)
        if not trainable_only:
            return state
        # it keeps a frozen weight tied to another (the output head): keep only what trains, as one process does
        trainable = {name for name, p in module.named_parameters() if p.requires_grad}
        return {k: v for k, v in state.items() if k in trainable}
    if trainable_only:
        return {k: p.detach().clone() for k, p in module.named_parameters() if p.requires_grad}
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _load_module_state(module: nn.Module, state: dict[str, torch.Tensor], adapter_only: bool = False) -> None:
    """Load a full state, or an adapter checkpoint's trainable tensors onto the base weights already loaded."""
    if D.is_distributed():
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=not adapter_only))
        return
    if not adapter_only:
        module.load_state_dict(state)
        return
    load_trainable_state(module, state)


def check_base_model(state: dict[str, Any], expected: dict[str, Any] | None, path: str | Path) -> None:
    """An adapter checkpoint only makes sense on the base weights it was trained from."""
    saved = state.get("base_model")
    if state.get("model_format") == "adapter" and saved and expected and saved != expected:
        raise ValueError(f"{path} holds a LoRA adapter trained on {saved}, but this run's base model is {expected}")


def _optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, critic: nn.Module | None) -> dict[str, Any]:
    if D.is_distributed():
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        modules = model if critic is None else (model, critic)
        return get_optimizer_state_dict(
            modules, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
    return optimizer.state_dict()


def _load_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], critic: nn.Module | None
) -> None:
    if D.is_distributed():
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        modules = model if critic is None else (model, critic)
        set_optimizer_state_dict(modules, optimizer, state, options=StateDictOptions(full_state_dict=True))
        return
    optimizer.load_state_dict(state)
