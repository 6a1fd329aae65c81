"""Worker for test_scale_out.py: the bundled training loop (`trainers.loop.train`) from Hydra overrides, under
torchrun, recording what each rank ends with.

    torchrun --nproc_per_node 2 tests/trainers/scale_out_worker.py OUT_DIR <overrides...>

It is `python -m trainers.main <overrides>` plus one thing: just before the run finishes (after the last
step, its weight sync and the final evaluation), every rank writes OUT_DIR/rank<R>.json with its rank, the
world size, its trainer's step and a digest of its full parameters (FSDP2's shards gathered on every rank).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch


def params_digest(named: dict[str, torch.Tensor]) -> str:
    """sha256 over the parameters' float32 bytes in name order (bit-exact: the same weights, the same digest)."""
    h = hashlib.sha256()
    for name in sorted(named):
        h.update(name.encode())
        h.update(named[name].detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole on this rank (`full_tensor` all-gathers an FSDP2 shard: collective)."""
    return {name: p.full_tensor() if hasattr(p, "full_tensor") else p.detach() for name, p in model.named_parameters()}


def main(out_dir: str, overrides: list[str]) -> None:
    from trainers import distributed as D
    from trainers import loop
    from trainers.main import compose

    real_finish = loop.finish

    def finish_and_record(run: Any) -> dict[str, Any]:
        record = {
            "rank": D.rank(),
            "world": D.world_size(),
            "step": run.trainer.step,
            "sharded": hasattr(next(run.trainer.model.parameters()), "full_tensor"),
            "params_sha256": params_digest(full_parameters(run.trainer.model)),
        }
        Path(out_dir, f"rank{D.rank()}.json").write_text(json.dumps(record))
        return real_finish(run)

    loop.finish = finish_and_record
    loop.train(compose(overrides))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
