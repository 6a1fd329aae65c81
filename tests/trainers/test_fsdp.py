"""FSDP2 data parallelism: 2 CPU processes on gloo make the same update as 1 process on the same batch."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("fsdp_worker.py")
LORA_WORKER = Path(__file__).with_name("fsdp_lora_worker.py")
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_alone_and_on_two(worker_path: Path, tmp_path: Path) -> tuple[dict, dict]:
    """The worker's result in this process and under torchrun with 2 gloo processes."""
    spec = importlib.util.spec_from_file_location(worker_path.stem, worker_path)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    worker.main(str(tmp_path / "one.json"))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = str(REPO)
    for _attempt in range(2):  # a second try only if the rendezvous port was taken meanwhile
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            str(worker_path),
            str(tmp_path / "two.json"),
        ]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
        if proc.returncode == 0 or "address already in use" not in proc.stderr.lower():
            break
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "one.json").read_text()), json.loads((tmp_path / "two.json").read_text())


def test_two_gloo_processes_match_one(tmp_path: Path) -> None:
    one, two = run_alone_and_on_two(WORKER, tmp_path)
    assert one["world"] == 1 and two["world"] == 2
    assert two["sharded"] and not one["sharded"]
    assert one["unwrap_ok"] and two["unwrap_ok"]  # unwrap and decoder_and_head work on an FSDP2-sharded model
    assert one["micro_batches"] >= 2  # each rank really trained on its own share
    assert one["tokens"] == two["tokens"]
    # rank 0's engine got the new weights: every rank joined the export (when rank 1 skipped it, gloo aborted)
    assert one["engine_version"] == two["engine_version"] == 1
    assert one["engine_has_weights"] and two["engine_has_weights"]
    # Tolerances. Each micro-batch's forward and loss are the same computation in both runs (same shapes, same
    # gathered weights); what differs is the order in which gradients are added: one process accumulates the
    # micro-batches in turn, two add their shares and then reduce (the x2 world scaling and FSDP's /2 are exact).
    # - loss: the micro-batch losses summed in float64 in another order: ~1e-16 relative; 1e-6 is ample.
    assert abs(one["loss"] - two["loss"]) <= 1e-6 * max(1.0, abs(one["loss"]))
    # - gradients: float32 sums of a few micro-batch terms reordered: a few 2**-24 of the sum of magnitudes;
    #   grad . v is compared against |grad| . |v| (its scale), and the norm relative to itself, at 1e-5
    assert abs(one["grad_dot"] - two["grad_dot"]) <= 1e-5 * one["grad_scale"]
    assert abs(one["grad_norm"] - two["grad_norm"]) <= 1e-5 * one["grad_norm"]
    # - weights after the step: w - lr * g / (|g| + 1e-3) (the worker's Adam eps) moves each entry by at most
    #   10 x its gradient's rounding (~1e-9 here), ~1e-8; a tensor's checksum adds <= 16k such independent
    #   roundings (~sqrt(16k) x 1e-8 ~ 1e-6) to float64 sums of float32 weights: 1e-4 (relative above 1) is ample
    assert one["weights"].keys() == two["weights"].keys()
    for key, value in one["weights"].items():
        assert abs(value - two["weights"][key]) <= 1e-4 * max(1.0, abs(value)), key


def test_a_sharded_lora_checkpoint_holds_the_same_adapter(tmp_path: Path) -> None:
    """Under FSDP2 a LoRA policy's checkpoint gathers only its adapter (frozen base weights are not copied)
    and holds the same tensors as one process's."""
    one, two = run_alone_and_on_two(LORA_WORKER, tmp_path)
    assert one["format"] == two["format"] == "adapter"
    assert one["model"] and one["model"].keys() == two["model"].keys()
    assert all("lora_" in k for k in one["model"])
    for key, value in one["model"].items():
        assert value > 0 and abs(value - two["model"][key]) <= 1e-6 * value, key
