"""The line a benchmark ends with, `HEADLINE {json}`: the figure its row of the README's table shows.

A benchmark computes its headline from its own results (no table is parsed back) and prints it with `emit`;
`benchmarks.readme_table --run` runs each row's command, reads these lines from its output (`read`) and
stores them with the command, commit, CPU and load.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "HEADLINE "


def emit(key: str, value: float, figure: str) -> None:
    """Print this run's figure for README row `key`: `value` (the number the target is about) and `figure`,
    the words the table shows."""
    print(PREFIX + json.dumps({"key": key, "value": round(float(value), 4), "figure": figure}), flush=True)


def read(output: str) -> list[dict[str, Any]]:
    """The headlines a benchmark printed, in order."""
    return [json.loads(line[len(PREFIX) :]) for line in output.splitlines() if line.startswith(PREFIX)]
