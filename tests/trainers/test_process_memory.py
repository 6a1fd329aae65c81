"""The process-tree memory sampler of the main job's report and the benchmarks: a child's memory counts in
the tree (not in the parent's own figure), and `include_root=False` leaves this process out."""

from __future__ import annotations

import subprocess
import sys
import time

from trainers.process_memory import TreeSampler, memory_metrics, peak_row, phase_of_peak, tree_rss_bytes

HOLD_MB = 200
CHILD = f"import time; b = bytearray({HOLD_MB} * 2**20); b[::4096] = b'x' * len(b[::4096]); print(1, flush=True); time.sleep(30)"


def test_a_childs_memory_counts_in_the_tree_and_only_there() -> None:
    own, _ = tree_rss_bytes()
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"1"  # its pages are touched
        with TreeSampler(every_s=0.05) as tree, TreeSampler(every_s=0.05, include_root=False) as children:
            time.sleep(0.3)
        assert tree.peak_bytes - own > HOLD_MB * 2**20 * 0.9
        assert HOLD_MB * 2**20 * 0.9 < children.peak_bytes < tree.peak_bytes - own * 0.5
        assert child.pid in children.cpu and children.cpu[child.pid] > 0
    finally:
        child.kill()
        child.wait()
    assert tree_rss_bytes(include_root=False)[0] < HOLD_MB * 2**20 * 0.5  # gone once it exits


# A training step in miniature: activations of 8 MiB allocated and freed in turn while a few small tensors
# stay alive between them (as autograd's saved inputs do); prints the RSS it leaves behind, in MiB.
FRAGMENT = """
import sys
from trainers.process_memory import map_large_allocations, tree_rss_bytes
applied = map_large_allocations(float(sys.argv[1]))
import torch
kept, big = [], []
for _ in range(3):
    for _ in range(60):
        big.append(torch.ones(2 * 2**20))  # 8 MiB
        kept.append(torch.ones(64))        # small, stays
    big.clear()
print(applied, tree_rss_bytes()[0] // 2**20)
"""


def _rss_left(threshold_mb: float) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", FRAGMENT, str(threshold_mb)], capture_output=True, text=True, check=True
    )
    applied, left = out.stdout.split()
    return applied == "True", int(left)


def test_mapping_large_allocations_returns_a_steps_freed_activations() -> None:
    """With glibc's default the freed 8 MiB blocks stay in the heap behind the small live ones (its threshold
    has risen past 8 MiB after the first free); mapped on their own they go back to the OS when freed."""
    applied_default, left_default = _rss_left(0.0)
    applied, left_mapped = _rss_left(1.0)
    assert not applied_default and applied  # 0 leaves glibc alone; this machine runs glibc
    assert left_default - left_mapped > 300, (left_default, left_mapped)  # ~480 MiB held back by default


def test_the_phase_of_the_peak_is_the_first_row_that_reached_it() -> None:
    rows = [
        {"kind": "eval", "label": "start", "step": 0, "memory/peak_mb": 900.0},
        {"kind": "train", "step": 1, "memory/peak_mb": 2500.0},
        {"kind": "train", "step": 2, "memory/peak_mb": 2500.0},  # no higher: the peak was in step 1
        {"kind": "eval", "label": "end", "step": 2, "memory/peak_mb": 2500.0},
    ]
    assert phase_of_peak(rows) == "step 1"
    assert phase_of_peak([*rows, {"kind": "eval", "label": "end", "step": 2, "memory/peak_mb": 3000.0}]) == "eval end"
    assert phase_of_peak([{"kind": "train", "step": 1}]) is None  # rows from before memory was logged
    assert peak_row(rows) is rows[1] and peak_row([{"kind": "train", "step": 1}]) is None
    now = memory_metrics()
    assert 0 < now["memory/rss_mb"] <= now["memory/peak_mb"] * 1.01
    assert 0 < now["memory/file_mb"] < now["memory/rss_mb"]  # the interpreter and torch's libraries are mapped files
