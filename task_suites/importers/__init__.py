"""Importers: task formats written by others, loaded as registered suites in one call.

    suite = load_clawgym_folder("path/to/tasks")      # or load_pinchbench_folder(...)
    print(suite.report())                              # broken task folders, one by one
    clawgym_env.register(suite)                        # then make("<suite>-<Harness>")

Command line: `python -m task_suites.importers {clawgym,pinchbench} PATH`.
"""

from task_suites.importers.clawgym import ClawGymDataEntry, load_clawgym_folder, load_clawgym_task
from task_suites.importers.common import BrokenTask, ImportedSuite
from task_suites.importers.pinchbench import PinchBenchGradeVerifier, load_pinchbench_folder, parse_pinchbench_task

__all__ = [
    "BrokenTask",
    "ClawGymDataEntry",
    "ImportedSuite",
    "PinchBenchGradeVerifier",
    "load_clawgym_folder",
    "load_clawgym_task",
    "load_pinchbench_folder",
    "parse_pinchbench_task",
]
