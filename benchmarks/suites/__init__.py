"""Bundled task suites, generated deterministically from a seed (no download).

Each module has `load(split="train", level=None, seed=0, count=None) -> list[TaskSpec]`:
OfficeQA, JobBench, ClawGymBench, PinchBench. Levels: 0 (easy, one small file, one step), 1, 2.
"""

from benchmarks.suites.reference import apply_reference, reference_files, write_workspace

SUITE_LOADERS = {
    "OfficeQA": "benchmarks.suites.officeqa:load",
    "JobBench": "benchmarks.suites.jobbench:load",
    "ClawGymBench": "benchmarks.suites.clawgymbench:load",
    "PinchBench": "benchmarks.suites.pinchbench:load",
}

__all__ = ["SUITE_LOADERS", "apply_reference", "reference_files", "write_workspace"]
