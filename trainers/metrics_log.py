"""Where a run's numbers go: a JSONL file (one object per step or evaluation), TensorBoard, the terminal."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


class MetricsLogger:
    """Appends each record to `<run_dir>/metrics.jsonl` and writes its numbers to TensorBoard.

    Only rank 0 writes (pass `enabled=False` elsewhere).
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, enabled: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.path = self.run_dir / "metrics.jsonl"
        self.writer = None
        if enabled:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))

    def truncate_after(self, step: int) -> int:
        """Drop records of steps after `step` (a resume from that step's checkpoint runs them again, so
        keeping them would count their rollouts twice). Returns how many were dropped."""
        if not self.enabled or not self.path.is_file():
            return 0
        lines = self.path.read_text().splitlines()
        kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)
        return len(lines) - len(kept)

    def log(self, record: dict[str, Any], step: int, kind: str = "train") -> None:
        if not self.enabled:
            return
        clean = {k: _jsonable(v) for k, v in record.items()}
        clean.update({"kind": kind, "step": step})
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.writer is not None:
            for key, value in clean.items():
                if isinstance(value, (int, float)) and key not in ("step",) and math.isfinite(float(value)):
                    self.writer.add_scalar(f"{kind}/{key}", value, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def step_table(step: int, metrics: dict[str, float], keys: list[str]) -> Table:
    table = Table(title=f"step {step}", show_header=True, header_style="bold")
    for key in keys:
        table.add_column(key)
    table.add_row(*[f"{metrics[k]:.4g}" if isinstance(metrics.get(k), (int, float)) else "-" for k in keys])
    return table


console = Console(stderr=True)
