"""Data-parallel training with PyTorch FSDP2 under `torchrun` (no home-made distribution layer).

Every rank receives the same step batch (rank 0's rollouts, broadcast); each rank trains on its share of
the packed micro-batches. The loss is normalised by the number of trained tokens in the whole batch,
and FSDP averages gradients over ranks, so each rank scales its loss by the world size: the update is
the one a single process would make on the whole batch.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def init_from_env(backend: str | None = None) -> bool:
    """Join the process group that `torchrun` describes (RANK, WORLD_SIZE, ...); False when not launched by it."""
    if is_distributed():
        return True
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return False
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend)
    return True


def shard_model(model: nn.Module) -> nn.Module:
    """FSDP2: each transformer block is its own unit, then the root (embeddings, norm, head)."""
    from torch.distributed.fsdp import fully_shard

    layers = _decoder_layers(model)
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return list(layers)
    return []


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s object on every rank (pickled)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def shutdown(timeout_s: float = 60.0) -> None:
    """Leave the process group once every rank is done with it.

    A gloo collective can return on one rank while the other is still finishing it, so a rank that tore the
    group down right after a barrier could abort its peer ("terminate called without an active exception",
    seen twice in CI). Each rank therefore first says through the rendezvous store (its own TCP connection,
    not gloo's) that it has left its last collective, waits until all have, and only then destroys the group.
    """
    if not is_distributed():
        return
    store = dist.distributed_c10d._get_default_store()  # no public accessor; the one torchrun's rendezvous made
    store.add("clawgym/left_collectives", 1)
    deadline = time.monotonic() + timeout_s
    while store.add("clawgym/left_collectives", 0) < world_size():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank()}: not every rank reached shutdown within {timeout_s:.0f} s")
        time.sleep(0.05)
    dist.destroy_process_group()
