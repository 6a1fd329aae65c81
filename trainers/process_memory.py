"""Resident memory (and CPU time) of a process tree: the trainer, its engine's processes, harness CLIs and
sandboxes. One sampler for the main job's report and the benchmarks.

The kernel's figure for children (RUSAGE_CHILDREN) is no use here: a child forked from a large trainer
inherits its high-water mark, so every harness CLI would report the trainer's size. So the tree is sampled.
"""

from __future__ import annotations

import threading

import psutil


def tree_rss_bytes(pid: int | None = None, include_root: bool = True) -> tuple[int, dict[int, float]]:
    """Summed RSS of a process (default: this one) and all its descendants, and each one's CPU seconds
    (user + system) by pid. A process that exits while it is read is left out."""
    root = psutil.Process(pid)
    total, cpu = 0, {}
    for proc in (root, *root.children(recursive=True)) if include_root else root.children(recursive=True):
        try:
            total += proc.memory_info().rss
            times = proc.cpu_times()
            cpu[proc.pid] = times.user + times.system
        except psutil.Error:
            pass
    return total, cpu


def tree_rss_mb(pid: int | None = None) -> float:
    return tree_rss_bytes(pid)[0] / 2**20


class TreeSampler:
    """Peak summed RSS of this process's tree while the block runs, sampled every `every_s` (a peak shorter
    than that can be missed), and the last CPU seconds seen per process (`include_root=False`: only the
    descendants, e.g. the sandboxes of one rollout)."""

    def __init__(self, every_s: float = 1.0, include_root: bool = True) -> None:
        self.every_s, self.include_root = every_s, include_root
        self.peak_bytes = 0
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="tree-rss", daemon=True)

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 2**20

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            total, cpu = tree_rss_bytes(include_root=self.include_root)
            self.peak_bytes = max(self.peak_bytes, total)
            self.cpu.update(cpu)
            if self._stop.wait(self.every_s):
                return


def main_process_peak_mb() -> float:
    """This process's own high-water mark (the kernel's, so no peak is missed)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
