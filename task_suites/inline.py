"""Easy variants of the document suites: level 0 with its input file shown in the instruction as text.

Why: at 0.5B, OfficeQA's and JobBench's level 0 give GRPO almost no signal (docs/experiments.md, "groups
whose rewards differ"): the model must open a file before it answers, and through Claude Code it either
answers with a fenced JSON edit instead of a tool call (OfficeQA) or writes into the input file (JobBench).
An Easy task keeps level 0's question, verifier and reference and moves the reading into the prompt: the
workspace is empty and the one step left is the `write` call that ClawGymBench's level 0 shows the model
can make. So it is built like ClawGymBench's level 0 and measures whether a harness teaches the model to
look a fact up and answer in a file, not whether it can parse an .xlsx or a SQLite database.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import random
import sqlite3
from collections.abc import Callable
from pathlib import PurePosixPath

from clawgym_env.specs import TaskSpec
from task_suites._common import Draft, generate

EASY_LEVELS = (0,)
"""An Easy suite has level 0 only (its tasks are level 0's, inlined)."""


def _csv(rows: list[list]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def _xlsx(data: bytes) -> str:
    import openpyxl

    book = openpyxl.load_workbook(io.BytesIO(data), read_only=True)
    return "\n".join(
        f"sheet {sheet.title}:\n{_csv([list(r) for r in sheet.iter_rows(values_only=True)])}" for sheet in book
    )


def _sqlite(data: bytes) -> str:
    conn = sqlite3.connect(":memory:")
    try:
        conn.deserialize(data)
        parts = []
        for (table,) in conn.execute("select name from sqlite_master where type = 'table' order by name"):
            cursor = conn.execute(f'select * from "{table}"')
            header = [c[0] for c in cursor.description]
            parts.append(f"table {table}:\n{_csv([header, *cursor.fetchall()])}")
        return "\n".join(parts)
    finally:
        conn.close()


def _docx(data: bytes) -> str:
    import docx

    return "".join(p.text + "\n" for p in docx.Document(io.BytesIO(data)).paragraphs)


def _png(data: bytes) -> str:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        meta = "".join(f"{k}: {v}\n" for k, v in image.text.items())
        return f"PNG image, {image.width} x {image.height} pixels; text metadata:\n{meta}"


READERS = {".xlsx": _xlsx, ".db": _sqlite, ".docx": _docx, ".png": _png}
"""Binary inputs by extension, read with the library that wrote them; anything else must be UTF-8 text."""


def file_as_text(name: str, data: str | bytes) -> str:
    """`name`'s content as the text a reader of the file would see (a spreadsheet as CSV, a database table
    by table, a document's paragraphs, an image's size and metadata)."""
    reader = READERS.get(PurePosixPath(name).suffix.lower())
    if reader is not None:
        return reader(data.encode() if isinstance(data, str) else data)
    try:
        return data if isinstance(data, str) else data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"cannot show {name} as text: not UTF-8 and no reader for its extension") from exc


def inline_workspace(draft: Draft) -> Draft:
    """The same task with every input file quoted in the instruction and an empty workspace."""
    if not isinstance(draft.workspace, dict):
        raise TypeError(f"inline_workspace needs a dict workspace (name -> content), got {type(draft.workspace)}")
    quoted = "".join(
        f"Content of {name} (shown here; the workspace is empty):\n```\n{file_as_text(name, data).rstrip()}\n```\n\n"
        for name, data in sorted(draft.workspace.items())
    )
    return dataclasses.replace(draft, key=f"inline|{draft.key}", instruction=quoted + draft.instruction, workspace={})


def easy_tasks(
    suite: str,
    make: Callable[[random.Random, int], Draft],
    split: str,
    level: int | None,
    seed: int,
    count: int | None,
) -> list[TaskSpec]:
    """An Easy suite's tasks: its base suite's level-0 drafts (`make(rng, 0)`), inlined."""
    return generate(
        suite,
        lambda rng, _: inline_workspace(make(rng, 0)),
        split=split,
        level=level,
        seed=seed,
        count=count,
        levels=EASY_LEVELS,
    )
