"""PinchBench: tasks in the PinchBench markdown format, loaded through its importer.

A handful ship in `pinchbench_tasks/*.md` (with explicit `split` and `level` in the front matter); more
are generated from the seed as markdown files into the suite cache and imported the same way, so the
bundled suite exercises the importer end to end. All bundled tasks use `grading_type: automated`
(their `grade()` runs in a child Python process), so no judge model is needed to train on them.
Categories: file_ops, calendar, writing, data.
"""

from __future__ import annotations

import hashlib
import json
import random
import textwrap
from pathlib import Path

import yaml

from clawgym_env.engines.cache import build_once
from clawgym_env.specs import TaskSpec
from task_suites._common import LEVELS, Draft, check_args, generate
from task_suites.clawgymbench import NAMES, WORDS, cache_dir
from task_suites.importers.pinchbench import load_pinchbench_folder

SUITE = "PinchBench"
SHIPPED = Path(__file__).parent / "pinchbench_tasks"


def markdown(
    task_id: str,
    name: str,
    category: str,
    level: int,
    prompt: str,
    expected: str,
    criteria: list[str],
    grade_body: str,
    reference: dict[str, str],
    workspace: dict[str, str],
    timeout: int = 180,
) -> str:
    front = {
        "id": task_id,
        "name": name,
        "category": category,
        "grading_type": "automated",
        "timeout_seconds": timeout,
        "workspace_files": [{"path": k, "content": v} for k, v in workspace.items()],
        "level": level,
        "reference_files": reference,
    }
    code = "def grade(transcript: list, workspace_path: str) -> dict:\n" + textwrap.indent(
        grade_body.strip() + "\n", "    "
    )
    checklist = "\n".join(f"- [ ] {c}" for c in criteria)
    return (
        f"---\n{yaml.safe_dump(front, sort_keys=False)}---\n\n## Prompt\n\n{prompt}\n\n## Expected Behavior\n\n{expected}\n\n"
        f"## Grading Criteria\n\n{checklist}\n\n## Automated Checks\n\n```python\n{code}```\n"
    )


def _draft(level, category, name, prompt, expected, criteria, grade_body, reference, workspace) -> Draft:
    key = f"{level}|{category}|{prompt}|{json.dumps(workspace, sort_keys=True)}|{grade_body}"
    return Draft(
        key=key,
        instruction=prompt,
        workspace=workspace,
        verifier=lambda ws: 0.0,
        category=category,
        reference=reference,
        extra={"_md": (name, expected, criteria, grade_body)},
    )


def file_ops(rng: random.Random, level: int) -> Draft:
    if level == 0:
        fname, phrase = f"{rng.choice(WORDS)}.txt", " ".join(rng.sample(WORDS, 3))
        grade = f"""
from pathlib import Path
p = Path(workspace_path) / {fname!r}
text = p.read_text().strip() if p.exists() else ""
return {{"file_created": float(p.exists()), "content_exact": float(text == {phrase!r})}}"""
        return _draft(
            level,
            "file_ops",
            "Write a file",
            f"Create a file named {fname} in the workspace containing exactly this line: {phrase}",
            "The agent writes the file with the given line.",
            [f"{fname} exists", "Content is exact"],
            grade,
            {fname: phrase + "\n"},
            {},
        )
    keys = rng.sample(["name", "owner", "region", "tier", "color", "mode"], 3 if level == 1 else 5)
    conf = {k: rng.choice(WORDS) for k in keys}
    src = "".join(f"{k} = {v}\n" for k, v in conf.items())
    grade = f"""
import json
from pathlib import Path
p = Path(workspace_path) / "settings.json"
try:
    data = json.loads(p.read_text())
except Exception:
    data = None
want = {conf!r}
ok = isinstance(data, dict)
scores = {{"valid_json": float(ok)}}
for k, v in want.items():
    scores["key_" + k] = float(ok and data.get(k) == v)
return scores"""
    extra = " Keep the keys in the same order." if level == 2 else ""
    return _draft(
        level,
        "file_ops",
        "INI to JSON",
        f"Convert settings.ini (lines 'key = value') into settings.json, a flat JSON object of the same keys and string values.{extra}",
        "The agent parses each line and writes JSON.",
        ["settings.json is valid JSON", *(f"{k} is {v}" for k, v in conf.items())],
        grade,
        {"settings.json": json.dumps(conf)},
        {"settings.ini": src},
    )


def calendar(rng: random.Random, level: int) -> Draft:
    title = f"{rng.choice(WORDS).title()} {rng.choice(['Review', 'Sync', 'Planning', 'Retro'])}"
    day, hour, minute = (
        f"2025{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}",
        rng.randint(8, 17),
        rng.choice([0, 15, 30, 45]),
    )
    who = f"{rng.choice(NAMES).lower()}@example.com"
    iso = f"{day[:4]}-{day[4:6]}-{day[6:]}"
    ics = f"BEGIN:VCALENDAR\nVERSION:2.0\nBEGIN:VEVENT\nSUMMARY:{title}\nDTSTART:{day}T{hour:02d}{minute:02d}00\nATTENDEE:mailto:{who}\nEND:VEVENT\nEND:VCALENDAR\n"
    grade = f"""
import re
from pathlib import Path
files = sorted(Path(workspace_path).glob("*.ics"))
ics = files[0].read_text() if files else ""
return {{
    "event_created": float("BEGIN:VEVENT" in ics),
    "title": float(bool(re.search(r"SUMMARY.*" + re.escape({title!r}), ics))),
    "start": float(bool(re.search(r"DTSTART.*{day}T{hour:02d}{minute:02d}", ics))),
    "attendee": float({who!r} in ics.lower()),
}}"""
    prompt = f'Create event.ics, an iCalendar file with one event titled "{title}" starting on {iso} at {hour:02d}:{minute:02d} with attendee {who}.'
    return _draft(
        level,
        "calendar",
        "Calendar event",
        prompt,
        "One VEVENT with title, start and attendee.",
        ["ICS file with a VEVENT", "Title", "Start", "Attendee"],
        grade,
        {"event.ics": ics},
        {},
    )


def writing(rng: random.Random, level: int) -> Draft:
    person, units, price = rng.choice(NAMES), rng.randint(5, 90), rng.randint(3, 60) + rng.choice([0, 0.25, 0.5])
    po = f"PO-{rng.randint(1000, 9999)}"
    total = units * price
    thread = f"From: {person}\nWe can deliver {units} units at ${price:.2f} each. Please confirm the PO number.\n"
    reply = f"Subject: Re: delivery\n\nHi {person},\n\nWe confirm {units} units at ${price:.2f} each (total ${total:.2f}). Our PO number is {po}.\n"
    grade = f"""
from pathlib import Path
p = Path(workspace_path) / "reply.txt"
text = p.read_text() if p.exists() else ""
low = text.lower().replace(",", "")
return {{
    "subject_line": float(text.lstrip().lower().startswith("subject:")),
    "facts": float({str(units)!r} in low and {f"{price:.2f}"!r} in low),
    "total": float({f"{total:.2f}"!r} in low or {f"{total:g}"!r} in low),
    "po_number": float({po.lower()!r} in low),
}}"""
    prompt = (
        f"Read thread.txt and write reply.txt: a reply to {person} that starts with a 'Subject:' line, confirms the quantity and "
        f"unit price, states the total cost (quantity x unit price, 2 decimals) and gives our PO number {po}."
    )
    return _draft(
        level,
        "writing",
        "Vendor reply",
        prompt,
        "A short reply with all facts and the computed total.",
        ["Subject line", "Quantity and price", "Total", "PO number"],
        grade,
        {"reply.txt": reply},
        {"thread.txt": thread},
    )


def data(rng: random.Random, level: int) -> Draft:
    scores = {n: rng.randint(40, 100) for n in rng.sample(NAMES, 5)}
    cutoff = min(rng.choice([60, 70, 75, 80]), max(scores.values()))  # at least one name passes
    passed = sorted(n for n, s in scores.items() if s >= cutoff)
    grade = f"""
from pathlib import Path
p = Path(workspace_path) / "passed.txt"
got = [ln.strip() for ln in p.read_text().splitlines() if ln.strip()] if p.exists() else []
want = {passed!r}
return {{"file_created": float(p.exists()), "names_correct": float(sorted(got) == want), "sorted": float(bool(got) and got == want)}}"""
    prompt = f"scores.csv has columns name,score. Write passed.txt listing the names with score >= {cutoff}, one per line, sorted alphabetically."
    csv_text = "name,score\n" + "".join(f"{n},{s}\n" for n, s in scores.items())
    return _draft(
        level,
        "data",
        "Filter scores",
        prompt,
        "The agent filters and sorts names.",
        ["passed.txt exists", "Right names", "Sorted"],
        grade,
        {"passed.txt": "".join(f"{n}\n" for n in passed) or "\n"},
        {"scores.csv": csv_text},
    )


def make(rng: random.Random, level: int) -> Draft:
    kinds = {0: [file_ops], 1: [file_ops, calendar, data], 2: [file_ops, writing, data, calendar]}[level]
    return rng.choice(kinds)(rng, level)


def shipped_tasks() -> list[TaskSpec]:
    """The hand-written tasks in pinchbench_tasks/ (split and level from their front matter)."""
    suite = load_pinchbench_folder(SHIPPED, name=SUITE)
    if suite.problems:
        raise RuntimeError(f"shipped PinchBench tasks are broken:\n{suite.report()}")
    out = []
    for task in suite.tasks or []:
        key = hashlib.sha256(Path(task.metadata["source"]).read_bytes()).hexdigest()[:16]
        out.append(task.model_copy(update={"metadata": {**task.metadata, "suite": SUITE, "instance_key": key}}))
    return out


def load(split: str = "train", level: int | None = None, seed: int = 0, count: int | None = None) -> list[TaskSpec]:
    """PinchBench tasks of one split: the shipped ones of that split and level first, then generated ones."""
    check_args(SUITE, split, level, count)
    levels = LEVELS if level is None else (level,)
    shipped = [t for t in shipped_tasks() if t.metadata["split"] == split and t.metadata["level"] in levels]
    drafts = generate(
        SUITE, make, split=split, level=level, seed=seed, count=None if count is None else max(0, count - len(shipped))
    )
    if count is not None:
        shipped = shipped[:count]
    if not drafts:
        return shipped
    texts = {}
    for t in drafts:
        name, expected, criteria, grade = t.metadata["_md"]
        texts[t.id] = markdown(
            t.id,
            name,
            t.metadata["category"],
            t.metadata["level"],
            t.instruction,
            expected,
            criteria,
            grade,
            t.metadata["reference"]["files"],
            dict(t.workspace.files),
        )
    digest = hashlib.sha256(json.dumps(texts, sort_keys=True).encode()).hexdigest()[:20]

    def build(tmp: Path) -> None:
        for task_id, text in texts.items():
            (tmp / f"{task_id}.md").write_text(text, encoding="utf-8")

    root = build_once(cache_dir() / f"pinchbench-{split}-{digest}", build)
    suite = load_pinchbench_folder(root, name=SUITE, default_split=split)
    if suite.problems:
        raise RuntimeError(f"generated PinchBench tasks failed to import:\n{suite.report()}")
    by_id = {t.id: t for t in suite.tasks or []}
    generated = []
    for d in drafts:
        meta = {k: v for k, v in d.metadata.items() if k != "_md"}
        task = by_id[d.id]
        generated.append(task.model_copy(update={"metadata": {**task.metadata, **meta}}))
    return shipped + generated
