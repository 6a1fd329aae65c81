"""The process-tree memory sampler of the main job's report and the benchmarks: a child's memory counts in
the tree (not in the parent's own figure), and `include_root=False` leaves this process out."""

from __future__ import annotations

import subprocess
import sys
import time

from trainers.process_memory import TreeSampler, tree_rss_bytes

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
