"""Resident memory (and CPU time) of a process tree: the trainer, its engine's processes, harness CLIs and
sandboxes. One sampler for the main job's report and the benchmarks.

The kernel's figure for children (RUSAGE_CHILDREN) is no use here: a child forked from a large trainer
inherits its high-water mark, so every harness CLI would report the trainer's size. So the tree is sampled.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

import psutil

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (glibc's malloc.h)


def map_large_allocations(threshold_mb: float) -> bool:
    """Have glibc's malloc map every allocation of at least `threshold_mb` on its own and unmap it when freed
    (and trim the heap's free top past the same size). Returns whether it was applied (glibc only).

    Why: a training step allocates and frees hundreds of activation tensors of 1-32 MiB. glibc serves those
    from its heap once its dynamic threshold has risen (up to 32 MiB), and a heap with a few live chunks
    cannot give the freed ones back, so a 0.5B model's step left the trainer's resident memory ~3 GB above
    what it holds (`benchmarks.step_memory --compare malloc`). `threshold_mb=0` leaves glibc's default.
    """
    if threshold_mb <= 0:
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    size = int(threshold_mb * 2**20)
    return bool(mallopt(M_MMAP_THRESHOLD, size)) and bool(mallopt(M_TRIM_THRESHOLD, size))


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


def file_backed_mb() -> float:
    """This process's resident pages that are mapped files (the model's safetensors weights, libraries): part
    of its RSS, but clean pages the kernel can drop and read again, unlike its own allocations."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) / 1024  # kB
    return 0.0


def memory_metrics() -> dict[str, float]:
    """This process's resident memory now, the part of it that is mapped files, and its high-water mark so
    far (MB), for a metrics row: logged after every step and evaluation, they show in which phase the peak
    was reached and how much of it the mapped weights were."""
    return {
        "memory/rss_mb": psutil.Process().memory_info().rss / 2**20,
        "memory/file_mb": file_backed_mb(),
        "memory/peak_mb": main_process_peak_mb(),
    }


def peak_row(rows: list[dict[str, object]]) -> dict[str, object] | None:
    """The first metrics row whose high-water mark is the run's: the main process's peak was reached at or
    before that row, after the row before it."""
    peaks = [(r, float(r["memory/peak_mb"])) for r in rows if isinstance(r.get("memory/peak_mb"), (int, float))]
    if not peaks:
        return None
    top = max(p for _, p in peaks)
    return next(r for r, p in peaks if p >= top)


def phase_of_peak(rows: list[dict[str, object]]) -> str | None:
    """Where the main process's peak was reached: "step 3", "eval start" (see `peak_row`)."""
    row = peak_row(rows)
    if row is None:
        return None
    return f"eval {row.get('label')}" if row.get("kind") == "eval" else f"step {row.get('step')}"
