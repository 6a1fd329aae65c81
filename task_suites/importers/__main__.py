"""`python -m task_suites.importers {clawgym,pinchbench} PATH [--json]`: load a folder, print the report.

Exit status 0 when every task loaded, 1 when some were broken, 2 when none loaded.
"""

from __future__ import annotations

import argparse
import json
import sys

from task_suites.importers import load_clawgym_folder, load_pinchbench_folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m task_suites.importers", description=__doc__)
    parser.add_argument("format", choices=["clawgym", "pinchbench"])
    parser.add_argument("path")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    loader = load_clawgym_folder if args.format == "clawgym" else load_pinchbench_folder
    try:
        suite = loader(args.path)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {
                    "suite": suite.name,
                    "tasks": [t.id for t in suite.tasks or []],
                    "broken": [{"path": str(p.path), "reason": p.reason} for p in suite.problems],
                },
                indent=2,
            )
        )
    else:
        print(suite.report())
        for task in suite.tasks or []:
            print(f"  ok {task.id}: {task.instruction[:70]!r}")
    return 1 if suite.problems else 0


if __name__ == "__main__":
    sys.exit(main())
