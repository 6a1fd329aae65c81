"""Bundled task suites, generated deterministically from a seed (no download).

Each module has `load(split="train", level=None, seed=0, count=None) -> list[TaskSpec]`:
OfficeQA, JobBench, ClawGymBench, PinchBench. Levels: 0 (easy, one small file, one step), 1, 2.
They are registered (by import string, loaded lazily) in `clawgym_env.builtin.BUILTIN_SUITES`. The
importers of task formats written by others are in `task_suites.importers`.
"""

from task_suites.reference import apply_reference, reference_files

__all__ = ["apply_reference", "reference_files"]
