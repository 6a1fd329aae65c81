"""Weights from the trainer to vLLM workers over a process group: NCCL between GPUs, gloo on CPU.

The disk path (a safetensors file every server reads) costs a write and a read of the whole model per step;
vLLM's RLHF examples instead broadcast the tensors from the trainer to the inference workers. Here the
trainer is rank 0 and every worker of every server takes a rank after it. The group is a standalone
`ProcessGroupGloo` / `ProcessGroupNCCL` built from a TCPStore the trainer hosts, not torch.distributed's
default group (vLLM's workers and a torchrun trainer already own theirs), so the same code runs on CPU
(gloo, tested here against real vLLM servers) and between GPUs (NCCL).

Tensors go one at a time in the order of a manifest (names, dtypes, shapes) that the receivers get first
through the server's `/collective_rpc`; a receiver allocates each tensor as it comes and hands it straight
to vLLM's loader, so at most one tensor is in flight on top of the model.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import json
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel

Backend = Literal["gloo", "nccl"]


class TensorSpec(BaseModel):
    name: str
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "bfloat16"
    shape: list[int]


def default_backend() -> Backend:
    """NCCL when this process has a GPU, gloo otherwise."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def manifest(tensors: Mapping[str, torch.Tensor]) -> str:
    """The JSON manifest receivers allocate from (a string: `/collective_rpc` passes strings)."""
    specs = [
        TensorSpec(name=n, dtype=str(t.dtype).removeprefix("torch."), shape=list(t.shape)) for n, t in tensors.items()
    ]
    return json.dumps([s.model_dump() for s in specs])


def read_manifest(text: str) -> list[TensorSpec]:
    return [TensorSpec.model_validate(item) for item in json.loads(text)]


class WeightGroup:
    """One broadcast group: rank 0 (the trainer) sends, every other rank receives.

    Rank 0 hosts the TCPStore on `port`; the others connect to `host:port` (they retry until it is up, so
    the trainer and the workers may start joining in any order). Joining blocks until all `world_size`
    ranks have joined, and a broadcast blocks until every rank takes part; `timeout_s` bounds both.
    """

    def __init__(
        self, host: str, port: int, rank: int, world_size: int, backend: Backend = "gloo", timeout_s: float = 300.0
    ) -> None:
        if world_size < 2:
            raise ValueError(f"a weight group needs the trainer and at least one worker, got world_size={world_size}")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"unknown weight-group backend {backend!r}; use 'gloo' (CPU) or 'nccl' (GPU)")
        if backend == "nccl" and not (torch.cuda.is_available() and hasattr(dist, "ProcessGroupNCCL")):
            raise RuntimeError("weight-group backend 'nccl' needs a GPU and a CUDA build of torch; use 'gloo' on CPU")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.store = dist.TCPStore(host, port, world_size, rank == 0, timeout, wait_for_workers=False)
        if backend == "gloo":
            self.group: Any = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)
            self.device = torch.device("cpu")
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(self.store, rank, world_size, options)
            self.device = torch.device("cuda", torch.cuda.current_device())
        atexit.register(self.close)  # the group before its store: the other order aborts the process at exit

    def broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.group.broadcast([tensor], options).wait()

    def send(self, tensors: Mapping[str, torch.Tensor]) -> int:
        """Rank 0: broadcast every tensor in manifest order; returns the bytes sent."""
        sent = 0
        for tensor in tensors.values():
            tensor = tensor.detach().to(self.device).contiguous()
            self.broadcast(tensor)
            sent += tensor.numel() * tensor.element_size()
        return sent

    def close(self) -> None:
        """Leave the group (its sockets close with the objects), the group first, then its store."""
        atexit.unregister(self.close)  # a pool regroups many times: no handler (and no object) kept per group
        self.group = None
        gc.collect()
        self.store = None

    def receive(self, specs: list[TensorSpec]) -> Iterator[tuple[str, torch.Tensor]]:
        """A receiving rank: each tensor of the manifest as it arrives (consume them all, in order)."""
        for spec in specs:
            tensor = torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device=self.device)
            self.broadcast(tensor)
            yield spec.name, tensor
