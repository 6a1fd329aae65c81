"""The validated form of a training config (what Hydra composes from trainers/conf/).

Every field is documented in the YAML files of trainers/conf/ and in docs/trainers.md; pydantic
rejects unknown keys so that a typo in an override fails loudly instead of being ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainers.core import OptimConfig
from trainers.grpo import GRPOConfig
from trainers.model import LoraSettings
from trainers.ppo import PPOConfig

ADAPTER_ENGINES = ("vllm", "vllm_server")  # engines that load a LoRA adapter on their base weights


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvSettings(Strict):
    ids: list[str] = Field(min_length=1)
    group_size: int = Field(default=4, ge=1)
    tasks_per_step: int = Field(default=2, ge=1)
    extra_groups: int = Field(
        default=0,
        ge=0,
        description="dynamic sampling: per step, up to this many more groups (new tasks of the "
        "same env) drawn while a group's rewards are all equal; 0 = off",
    )
    split: str = "train"
    eval_split: str = "test"
    level: int | None = 0
    train_tasks: int | None = Field(default=None, ge=1)
    eval_tasks: int | None = Field(default=8, ge=1)
    max_concurrency: int = Field(default=4, ge=1)
    suite_seed: int = 0
    options: dict[str, Any] = Field(default_factory=dict)
    harness_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per harness (its registered name): adapter options for the envs through it, over "
        "options.harness_options; e.g. {OpenClaw: {api_style: openai-chat}} in an OpenClaw + Claude Code batch",
    )

    def options_for(self, env_id: str) -> dict[str, Any]:
        """The EnvOptions overrides of one env of `ids` (`<Suite>-<Harness>`): `options`, with its harness's
        `harness_options` over `options.harness_options`."""
        options = dict(self.options)
        mine = self.harness_options.get(env_id.rsplit("-", 1)[-1])
        if mine:
            options["harness_options"] = {**options.get("harness_options", {}), **mine}
        return options

    @model_validator(mode="after")
    def _harness_options_name_a_harness(self) -> EnvSettings:
        """Keys are registered harness names (not only those of `ids`: evaluations through other harnesses
        read them too, so every arm of an experiment can carry the same settings)."""
        if not self.harness_options:
            return self
        from clawgym_env import registry

        unknown = sorted(set(self.harness_options) - set(registry.harnesses))
        if unknown:
            raise ValueError(
                f"env.harness_options names {unknown}, which is no registered harness; "
                f"harnesses: {sorted(registry.harnesses)}"
            )
        return self

    @field_validator("options")
    @classmethod
    def _one_temperature(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "temperature" in value:
            raise ValueError(
                "env.options.temperature is not an option of a training run: the sampling temperature is "
                "algorithm.temperature (the engine samples with it and the trainer's log-probs use it), "
                "e.g. `algorithm.temperature=0.7`; eval.temperature sets evaluation's"
            )
        return value

    @field_validator("ids", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class ModelSettings(Strict):
    name: str
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    seed: int = 0
    gradient_checkpointing: bool = False
    lora: LoraSettings = Field(default_factory=LoraSettings)


class EngineSettings(Strict):
    kind: Literal["transformers", "vllm", "vllm_server", "remote"] = "transformers"
    options: dict[str, Any] = Field(default_factory=dict)


class SandboxSettings(Strict):
    backend: str = "local"
    options: dict[str, Any] = Field(default_factory=dict)
    proxy_port: int | None = Field(default=None, ge=0, description="serve the proxy on this TCP port too")
    proxy_public_url: str | None = Field(default=None, description="where remote sandboxes reach the proxy")
    proxy_shards: int = Field(default=1, ge=1, description="proxy processes (ShardedProxy above 1)")


class EvalSettings(Strict):
    every: int = Field(default=5, ge=0, description="0 = only at start and end")
    repeats: int = Field(default=2, ge=1)
    temperature: float | None = Field(default=None, ge=0, description="null = algorithm.temperature")
    at_start: bool = True
    concurrency: int | None = Field(default=None, ge=1, description="rollouts at once; null = what the machine holds")
    cache_dir: str | None = (
        None  # reuse the untrained policy's start evaluation across runs (same model/tasks/seeds/harness)
    )


class CheckpointSettings(Strict):
    every: int = Field(default=10, ge=0)
    keep: int = Field(default=2, ge=1)  # numbered checkpoints kept (older ones deleted: a 0.5B PPO one is ~4 GB)
    resume: str | None = None  # a .pt path, or "auto" (the run_dir's latest)


class TrainerSettings(Strict):
    """How rollouts and updates overlap (trainers.rollout_producer, trainers.staleness)."""

    max_staleness: int = Field(
        default=0,
        ge=0,
        description="0 = synchronous (each step's rollouts start after the previous update); k > 0 = rollouts "
        "run up to k policy versions ahead of the trainer while it updates",
    )
    stale_groups: Literal["drop", "keep"] = Field(
        default="drop",
        description="a group whose oldest call is more than max_staleness versions behind: drop it (counted), "
        "or keep it and let the rollout correction weigh its tokens",
    )


class WarmStartSettings(Strict):
    enabled: bool = False
    demos_per_task: int = Field(default=1, ge=1)
    tasks: int | None = Field(default=None, ge=1)
    epochs: int = Field(default=3, ge=1)
    lr: float = Field(default=1e-4, gt=0)
    token_budget: int = Field(default=4096, ge=1)


class LoggingSettings(Strict):
    tensorboard: bool = True
    progress: bool = True
    plot_every: int = Field(default=10, ge=0)


class TrainConfig(Strict):
    run_dir: Path
    seed: int = 0
    steps: int = Field(default=20, ge=0)
    threads: int | None = Field(default=None, ge=1)
    mmap_threshold_mb: float = Field(
        default=1.0,
        ge=0,
        description="glibc maps allocations of this size or more on their own (trainers.process_memory."
        "map_large_allocations), so a step's freed activations leave the resident memory; 0 = glibc's default",
    )
    device: str = "cpu"
    algorithm: Annotated[GRPOConfig | PPOConfig, Field(discriminator="name")]
    env: EnvSettings
    model: ModelSettings
    engine: EngineSettings = Field(default_factory=EngineSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    warm_start: WarmStartSettings = Field(default_factory=WarmStartSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)

    @model_validator(mode="after")
    def _adapter_sync_needs_vllm(self) -> TrainConfig:
        if self.model.lora.enabled and self.model.lora.sync == "adapter" and self.engine.kind not in ADAPTER_ENGINES:
            raise ValueError(
                f"model.lora.sync=adapter needs an engine that loads LoRA adapters ({' or '.join(ADAPTER_ENGINES)}), "
                f"not engine={self.engine.kind}; use model.lora.sync=merged there"
            )
        return self
