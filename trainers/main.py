"""Train from a Hydra config: `python -m trainers.main algorithm=ppo env=clawgym_mixed steps=50`.

`clawgym train <overrides>` calls `main()` with the same overrides. Configs live in trainers/conf/;
`--cfg job` prints the composed config without training. Under `torchrun --nproc_per_node N -m
trainers.main ...` the trainer shards the model with FSDP2 across the N processes.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from trainers.config import TrainConfig


def to_train_config(cfg: DictConfig | dict[str, Any]) -> TrainConfig:
    """Hydra's composed config -> the validated TrainConfig (unknown keys and bad values are refused)."""
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    data.pop("hydra", None)  # type: ignore[union-attr]
    return TrainConfig.model_validate(data)


def compose(overrides: list[str] | None = None) -> TrainConfig:
    """The config `main` would train from, without Hydra taking over the process (for scripts and tests)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module(config_module="trainers.conf", version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides or []))
        return to_train_config(cfg)


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    from trainers.loop import train

    train(to_train_config(cfg))


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    """Entry point of `python -m trainers.main` and `clawgym train` (reads the overrides from sys.argv).

    SIGTERM (what torchrun sends the other ranks when one fails) exits through the finally-blocks, so the
    vLLM servers and sandboxes rank 0 started are stopped rather than left running."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _hydra_main()


if __name__ == "__main__":
    main()
