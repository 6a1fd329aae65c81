"""`clawgym health`: each installed harness checked end to end, printed as a table.

For every harness: is it installed (pinned version), does it launch inside the local sandbox, does one tool
call reach the real proxy and come back (a scripted test engine emits the harness's own write tool call,
then a final text), does the tool write the file, and does the harness exit cleanly.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from clawgym_env.interfaces import HarnessNotInstalled, Policy
from clawgym_env.specs import DEFAULT_MOUNT_PATH, EnvOptions, TaskSpec
from harness_adapters.tool_calls import write_file_call

HARNESSES = ("ClaudeCode", "OpenClaw", "Codex", "Pi", "WhiteBox")
HEALTH_FILE = "health.txt"
HEALTH_TEXT = "ok"


class HealthRow(BaseModel):
    harness: str
    version: str | None = None
    installed: bool = False
    launched: bool = False
    tool_call: bool = False
    clean_exit: bool = False
    calls: int = 0
    wall_s: float = 0.0
    detail: str = ""

    @property
    def healthy(self) -> bool:
        return self.installed and self.launched and self.tool_call and self.clean_exit


def health_write_call(harness: str) -> str:
    """The scripted model turn of a health check: `harness` writes HEALTH_TEXT into HEALTH_FILE."""
    return write_file_call(harness, f"{DEFAULT_MOUNT_PATH}/{HEALTH_FILE}", HEALTH_TEXT, DEFAULT_MOUNT_PATH)


def health_verifier(workspace: Path) -> float:
    """1.0 when the health file holds HEALTH_TEXT."""
    path = workspace / HEALTH_FILE
    return 1.0 if path.is_file() and path.read_text().strip() == HEALTH_TEXT else 0.0


def make_adapter(harness: str) -> Any:
    from clawgym_env.builtin import BUILTIN_HARNESSES
    from clawgym_env.specs import resolve_callable

    return resolve_callable(BUILTIN_HARNESSES[harness][0])()


async def check_harness(harness: str, proxy: Any, backend: Any, tokenizer: Any, renderer: Any) -> HealthRow:
    from clawgym_env.engines import ScriptedTestEngine
    from clawgym_env.rollout import run_rollout

    row = HealthRow(harness=harness)
    adapter = make_adapter(harness)
    row.version = adapter.version() if hasattr(adapter, "version") else "in-process"
    try:
        adapter.check_installed()
        row.installed = True
    except HarnessNotInstalled as exc:
        row.detail = str(exc)
        return row
    engine = ScriptedTestEngine(tokenizer, [health_write_call(harness), "Health check done."])
    task = TaskSpec(
        id=f"health-{harness}",
        instruction=f"Write {HEALTH_TEXT} into {HEALTH_FILE}.",
        verifier=health_verifier,
        timeout_s=120,
    )
    t0 = time.perf_counter()
    result = await run_rollout(
        task=task,
        adapter=adapter,
        policy=Policy(engine=engine, renderer=renderer),
        backend=backend,
        proxy=proxy,
        options=EnvOptions(max_calls=8),
    )
    row.wall_s = time.perf_counter() - t0
    hr = result.harness_result
    row.calls = len(result.calls)
    row.launched = hr is not None and (hr.exit_code is not None or bool(hr.events))
    row.tool_call = row.calls >= 1 and result.reward == 1.0
    row.clean_exit = hr is not None and hr.success and hr.exit_code == 0 and result.status == "ok"
    if not row.healthy:
        row.detail = (result.failure.reason if result.failure else "") or (hr.error if hr else "") or "file not written"
    return row


async def run_health(harnesses: tuple[str, ...] = HARNESSES) -> list[HealthRow]:
    from clawgym_env.chat import ChatMLRenderer
    from clawgym_env.engines import load_qwen_tokenizer
    from clawgym_env.serving_stack import serving_stack

    tokenizer = load_qwen_tokenizer()
    renderer = ChatMLRenderer(tokenizer)
    async with serving_stack() as stack:
        rows = []
        for harness in harnesses:  # one at a time: the timings stay readable on a small machine
            try:
                rows.append(await check_harness(harness, stack.proxy, stack.backend, tokenizer, renderer))
            except Exception as exc:  # noqa: BLE001 - a health check reports, never crashes
                rows.append(HealthRow(harness=harness, detail=f"{type(exc).__name__}: {exc}"))
        return rows


def render_table(rows: list[HealthRow]) -> Any:
    from rich.table import Table

    table = Table(title="ClawGym harness health")
    for column in ("harness", "version", "installed", "launch", "tool call", "clean exit", "calls", "wall s", "detail"):
        table.add_column(column)
    mark = {True: "[green]yes[/]", False: "[red]no[/]"}
    for r in rows:
        table.add_row(
            r.harness,
            r.version or "-",
            mark[r.installed],
            mark[r.launched],
            mark[r.tool_call],
            mark[r.clean_exit],
            str(r.calls),
            f"{r.wall_s:.1f}",
            r.detail[:80],
        )
    return table


def health_cli(harnesses: tuple[str, ...] = HARNESSES, console: Any = None) -> list[HealthRow]:
    """Run the checks and print the table (on `console`, a rich Console); exits 1 when any harness is unhealthy."""
    from rich.console import Console

    rows = asyncio.run(run_health(harnesses))
    (console or Console()).print(render_table(rows))
    if not all(r.healthy for r in rows):
        raise SystemExit(1)
    return rows
