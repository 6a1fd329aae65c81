"""ClawGymBench: general workspace tasks in the ClawGym folder format, loaded through its importer.

Categories: file_manipulation, data_processing, scripting, document_writing. Each generated instance
is written as a ClawGym task folder (data_entry.json, input_files/, reward/reward.sh + check.py +
spec.json) into a cache folder (`$CLAWGYM_SUITE_CACHE`, default `<repo>/.cache/suites`), then loaded
with `load_clawgym_folder`: the reward is computed inside the sandbox by reward.sh (code-checked
sub-scores, last stdout line the mean). Level 0: one short instruction that names the tool to use (`write`,
the name pi, OpenClaw, Claude Code and the white-box loop share) and at most one small file: a level
a 0.5B model reaches often enough for GRPO to have signal (without the tool named it mostly answers
with the file's text instead of a tool call). Level 0 gives half credit for the asked-for file and the
other half for its content, so a group where some rollouts at least wrote the right file has a signal.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

from clawgym_env.engines.cache import REPO_ROOT, build_once
from clawgym_env.specs import DEFAULT_MOUNT_PATH, TaskSpec
from task_suites._common import Draft, generate
from task_suites.importers.clawgym import load_clawgym_folder

SUITE = "ClawGymBench"
TEMPLATE = Path(__file__).parent / "clawgym_template"
WORDS = [
    "alpha",
    "river",
    "copper",
    "lantern",
    "meadow",
    "orbit",
    "pepper",
    "quartz",
    "saddle",
    "timber",
    "violet",
    "walnut",
]
NAMES = ["Ada", "Grace", "Linus", "Margaret", "Alan", "Barbara", "Ken", "Frances"]


def cache_dir() -> Path:
    return Path(os.environ.get("CLAWGYM_SUITE_CACHE", REPO_ROOT / ".cache" / "suites"))


def _draft(level, category, instruction, inputs, checks, reference) -> Draft:
    if level == 0:
        # Level 0's partial credit: the asked-for file (the reference's one file) exists earns half the
        # reward, its content the other half. A 0.5B model often calls the right tool on the wrong file (it
        # edits numbers.txt instead of writing answer.txt): all-or-nothing, such groups all score 0 and GRPO
        # learns nothing.
        checks = [{"name": "exists", "kind": "exists", "path": path} for path in reference] + checks
    spec = {"checks": checks}
    return Draft(
        key=f"{level}|{category}|{instruction}|{json.dumps(inputs, sort_keys=True)}|{json.dumps(spec, sort_keys=True)}",
        instruction=instruction,
        workspace=dict(inputs),
        verifier=lambda ws: 0.0,  # replaced by reward.sh when the folder is imported
        category=category,
        reference=reference,
        extra={"_spec": spec},
    )


def file_manipulation(rng: random.Random, level: int) -> Draft:
    if level == 0:
        name, phrase = rng.choice(WORDS), " ".join(rng.sample(WORDS, 3))
        instr = f"Use the write tool to create the file {name}.txt containing exactly this line: {phrase}"
        return _draft(
            level,
            "file_manipulation",
            instr,
            {},
            [{"name": "content", "kind": "file_equals", "path": f"{name}.txt", "expected": phrase}],
            {f"{name}.txt": phrase + "\n"},
        )
    if level == 1:
        logs, errors = {}, []
        for f in ("logs/app1.log", "logs/app2.log"):
            out = []
            for i in range(rng.randint(6, 10)):
                lvl = rng.choice(["INFO", "INFO", "WARN", "ERROR"])
                line = f"2024-03-{rng.randint(10, 28)} 12:{i:02d}:00 {lvl} {rng.choice(WORDS)} {rng.choice(WORDS)}"
                out.append(line)
                if "ERROR" in line:
                    errors.append(line)
            logs[f] = "\n".join(out) + "\n"
        if not errors:
            logs["logs/app2.log"] += "2024-03-29 13:00:00 ERROR disk full\n"
            errors.append("2024-03-29 13:00:00 ERROR disk full")
        instr = (
            "Collect every line containing ERROR from logs/app1.log and then logs/app2.log, in file order, "
            "into errors.txt in the workspace (one line each, nothing else)."
        )
        checks = [
            {"name": "exists", "kind": "exists", "path": "errors.txt"},
            {"name": "lines", "kind": "file_equals", "path": "errors.txt", "expected": "\n".join(errors)},
        ]
        return _draft(level, "file_manipulation", instr, logs, checks, {"errors.txt": "\n".join(errors) + "\n"})
    folder_of = {".txt": "docs", ".md": "docs", ".csv": "data", ".json": "data", ".log": "other", ".ini": "other"}
    inputs, manifest = {}, {}
    for word in rng.sample(WORDS, 5):
        ext = rng.choice(sorted(folder_of))
        inputs[f"inbox/{word}{ext}"] = f"{word} {rng.randint(1, 999)}\n"
        manifest[f"{word}{ext}"] = folder_of[ext]
    instr = (
        "Sort the files of inbox/: copy each into docs/ (.txt, .md), data/ (.csv, .json) or other/ (any other extension), "
        "keeping its name and content, and write manifest.json mapping each file name to the folder name it went to."
    )
    checks = [
        {"name": f"copied_{n}", "kind": "file_equals", "path": f"{d}/{n}", "expected": inputs[f"inbox/{n}"]}
        for n, d in manifest.items()
    ]
    checks.append({"name": "manifest", "kind": "json_values", "path": "manifest.json", "values": manifest})
    reference = {f"{d}/{n}": inputs[f"inbox/{n}"] for n, d in manifest.items()} | {
        "manifest.json": json.dumps(manifest)
    }
    return _draft(level, "file_manipulation", instr, inputs, checks, reference)


def data_processing(rng: random.Random, level: int) -> Draft:
    if level == 0:
        nums = [rng.randint(1, 50) for _ in range(rng.randint(3, 5))]
        instr = "numbers.txt has one number per line. Read it, then use the write tool to write their sum (only the number) to answer.txt."
        return _draft(
            level,
            "data_processing",
            instr,
            {"numbers.txt": "\n".join(map(str, nums)) + "\n"},
            [{"name": "sum", "kind": "number", "path": "answer.txt", "expected": sum(nums)}],
            {"answer.txt": f"{sum(nums)}\n"},
        )
    if level == 1:
        regions = rng.sample(["north", "south", "east", "west", "central"], 3)
        rows = [(rng.choice(regions), rng.randint(10, 500)) for _ in range(rng.randint(8, 14))]
        totals = {r: sum(a for g, a in rows if g == r) for r in sorted({g for g, _ in rows})}
        instr = "sales.csv has columns region,amount. Write totals.csv with header region,total: one row per region with the summed amount, sorted by region."
        want = [["region", "total"]] + [[r, str(t)] for r, t in totals.items()]
        return _draft(
            level,
            "data_processing",
            instr,
            {"sales.csv": "region,amount\n" + "".join(f"{g},{a}\n" for g, a in rows)},
            [
                {"name": "exists", "kind": "exists", "path": "totals.csv"},
                {"name": "rows", "kind": "csv_rows", "path": "totals.csv", "rows": want},
            ],
            {"totals.csv": "\n".join(",".join(r) for r in want) + "\n"},
        )
    customers = {i + 1: (n, rng.choice(["DE", "FR", "US"])) for i, n in enumerate(rng.sample(NAMES, 5))}
    orders = [(100 + i, rng.choice(list(customers)), rng.randint(5, 400)) for i in range(12)]
    per_customer = {c: sum(a for _, cc, a in orders if cc == c) for c in customers}
    ranked = sorted((c for c in per_customer if per_customer[c] > 0), key=lambda c: (-per_customer[c], customers[c][0]))
    by_country: dict[str, int] = {}
    for _, c, a in orders:
        by_country[customers[c][1]] = by_country.get(customers[c][1], 0) + a
    answer = {"top3": [customers[c][0] for c in ranked[:3]], "by_country": dict(sorted(by_country.items()))}
    instr = (
        "orders.csv (order_id,customer_id,amount) and customers.csv (customer_id,name,country) are in the workspace. "
        'Write top_customers.json with "top3": the names of the three customers with the largest total order amount '
        '(largest first, ties by name) and "by_country": an object country -> total order amount.'
    )
    inputs = {
        "orders.csv": "order_id,customer_id,amount\n" + "".join(f"{o},{c},{a}\n" for o, c, a in orders),
        "customers.csv": "customer_id,name,country\n" + "".join(f"{i},{n},{k}\n" for i, (n, k) in customers.items()),
    }
    values = {"top3": answer["top3"], **{f"by_country.{k}": v for k, v in answer["by_country"].items()}}
    return _draft(
        level,
        "data_processing",
        instr,
        inputs,
        [{"name": "values", "kind": "json_values", "path": "top_customers.json", "values": values}],
        {"top_customers.json": json.dumps(answer)},
    )


def scripting(rng: random.Random, level: int) -> Draft:
    if level == 0:
        name = rng.choice(NAMES)
        instr = f"Use the write tool to create a Python script greet.py that prints exactly: Hello, {name}!"
        checks = [
            {
                "name": "output",
                "kind": "script_output",
                "script": "greet.py",
                "cases": [{"args": [], "stdout": f"Hello, {name}!"}],
            }
        ]
        return _draft(level, "scripting", instr, {}, checks, {"greet.py": f'print("Hello, {name}!")\n'})
    if level == 1:
        cases = []
        for _ in range(3):
            words = [rng.choice(WORDS) for _ in range(rng.randint(3, 12))]
            text = "\n".join(" ".join(words[i : i + 4]) for i in range(0, len(words), 4)) + "\n"
            cases.append({"args": [{"file": "input.txt", "content": text}], "stdout": str(len(words))})
        sample = cases[0]["args"][0]["content"]
        instr = (
            "Write a Python script wordcount.py that takes a file path as its only argument and prints the number of "
            "whitespace-separated words in that file (just the number). sample.txt is an example input."
        )
        script = "import sys\nprint(len(open(sys.argv[1]).read().split()))\n"
        return _draft(
            level,
            "scripting",
            instr,
            {"sample.txt": sample},
            [{"name": "hidden_tests", "kind": "script_output", "script": "wordcount.py", "cases": cases}],
            {"wordcount.py": script},
        )
    cases = []
    for _ in range(3):
        col = rng.choice(["price", "qty"])
        vals = [(rng.randint(1, 99), rng.randint(1, 20)) for _ in range(rng.randint(3, 7))]
        content = "item,price,qty\n" + "".join(f"i{i},{p},{q}\n" for i, (p, q) in enumerate(vals))
        series = [p if col == "price" else q for p, q in vals]
        out = f"{min(series)} {max(series)} {sum(series) / len(series):.2f}"
        cases.append({"args": [{"file": "data.csv", "content": content}, col], "stdout": out})
    example = cases[0]["args"][0]["content"]
    instr = (
        "Write a Python script csvstats.py taking two arguments, a CSV file path and a column name, that prints the column's "
        "minimum, maximum and mean separated by spaces, the min and max as integers and the mean with 2 decimals (e.g. '3 17 9.25'). "
        "example.csv is an example input."
    )
    script = (
        "import csv, sys\nv = [float(r[sys.argv[2]]) for r in csv.DictReader(open(sys.argv[1]))]\n"
        "print(f'{min(v):.0f} {max(v):.0f} {sum(v) / len(v):.2f}')\n"
    )
    return _draft(
        level,
        "scripting",
        instr,
        {"example.csv": example},
        [{"name": "hidden_tests", "kind": "script_output", "script": "csvstats.py", "cases": cases}],
        {"csvstats.py": script},
    )


def document_writing(rng: random.Random, level: int) -> Draft:
    if level == 0:
        title = f"{rng.choice(WORDS).title()} {rng.choice(WORDS).title()} Plan"
        instr = f"Use the write tool to create the file title.md whose first line is the markdown heading: # {title}"
        return _draft(
            level,
            "document_writing",
            instr,
            {},
            [{"name": "heading", "kind": "first_line", "path": "title.md", "expected": f"# {title}"}],
            {"title.md": f"# {title}\n"},
        )
    people = rng.sample(NAMES, 3)
    decisions = [f"adopt {rng.choice(WORDS)} {rng.choice(WORDS)}" for _ in range(2)]
    actions = [f"{p} to prepare the {rng.choice(WORDS)} report" for p in people[:2]]
    if level == 1:
        notes = (
            f"meeting notes\npresent: {', '.join(people)}\n"
            + "".join(f"we decided to {d}\n" for d in decisions)
            + "".join(f"todo: {a}\n" for a in actions)
        )
        instr = (
            "Turn notes.txt into minutes.md with three sections, '## Attendees', '## Decisions' and '## Action Items', "
            "listing every attendee, decision and action item from the notes as bullet points."
        )
        items = ["## Attendees", "## Decisions", "## Action Items", *people, *decisions, *actions]
        ref = (
            "## Attendees\n"
            + "".join(f"- {p}\n" for p in people)
            + "## Decisions\n"
            + "".join(f"- {d}\n" for d in decisions)
            + "## Action Items\n"
            + "".join(f"- {a}\n" for a in actions)
        )
        return _draft(
            level,
            "document_writing",
            instr,
            {"notes.txt": notes},
            [{"name": "sections_and_items", "kind": "file_contains", "path": "minutes.md", "items": items}],
            {"minutes.md": ref},
        )
    products = [(w, rng.randint(1, 40), rng.randint(2, 90)) for w in rng.sample(WORDS, 4)]
    revenue = sum(u * p for _, u, p in products)
    best = max(products, key=lambda t: (t[1] * t[2], t[0]))[0]
    instr = (
        "Write report.md from sales.csv (product,units,price): a title line '# Sales Report', a markdown table with one row "
        "per product and its revenue (units x price), a line 'Total revenue: N' and a line 'Best seller: NAME' (highest revenue)."
    )
    inputs = {"sales.csv": "product,units,price\n" + "".join(f"{w},{u},{p}\n" for w, u, p in products)}
    items = [
        "# Sales Report",
        f"Total revenue: {revenue}",
        f"Best seller: {best}",
        *(f"| {w} |" for w, _, _ in products),
        *(str(u * p) for _, u, p in products),
    ]
    table = "| product | revenue |\n|---|---|\n" + "".join(f"| {w} | {u * p} |\n" for w, u, p in products)
    ref = f"# Sales Report\n\n{table}\nTotal revenue: {revenue}\nBest seller: {best}\n"
    checks = [
        {"name": "title", "kind": "first_line", "path": "report.md", "expected": "# Sales Report"},
        {"name": "content", "kind": "file_contains", "path": "report.md", "items": items},
    ]
    return _draft(level, "document_writing", instr, inputs, checks, {"report.md": ref})


CATEGORIES = {
    "file_manipulation": file_manipulation,
    "data_processing": data_processing,
    "scripting": scripting,
    "document_writing": document_writing,
}


def make(rng: random.Random, level: int) -> Draft:
    return CATEGORIES[rng.choice(sorted(CATEGORIES))](rng, level)


def write_clawgym_folder(task: TaskSpec, spec: dict, dest: Path) -> None:
    """One generated task as a ClawGym task folder."""
    dest.mkdir(parents=True)
    # spec.json holds the expected answers and hidden test inputs: it reaches the checker on stdin only
    metadata = {k: v for k, v in task.metadata.items() if k != "_spec"} | {"reward_stdin": "spec.json"}
    entry = {
        "task_id": task.id,
        "user_query": task.instruction,
        "input_mount_dir": DEFAULT_MOUNT_PATH,
        "metadata": metadata,
    }
    (dest / "data_entry.json").write_text(json.dumps(entry, indent=1, sort_keys=True))
    for rel, content in task.workspace.files.items():
        target = dest / "input_files" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
    (dest / "reward").mkdir()
    shutil.copy(TEMPLATE / "reward.sh", dest / "reward" / "reward.sh")
    shutil.copy(TEMPLATE / "check.py", dest / "reward" / "check.py")
    (dest / "reward" / "spec.json").write_text(json.dumps(spec, indent=1))


def load(split: str = "train", level: int | None = None, seed: int = 0, count: int | None = None) -> list[TaskSpec]:
    """ClawGymBench tasks of one split: generated, written as ClawGym folders (cached), imported."""
    drafts = generate(SUITE, make, split=split, level=level, seed=seed, count=count)
    if not drafts:
        return []
    template = (TEMPLATE / "check.py").read_bytes() + (TEMPLATE / "reward.sh").read_bytes()
    digest = hashlib.sha256(
        template
        + json.dumps([[t.id, t.metadata["instance_key"], t.metadata["_spec"]] for t in drafts], sort_keys=True).encode()
    ).hexdigest()[:20]

    def build(tmp: Path) -> None:
        for task in drafts:
            write_clawgym_folder(task, task.metadata["_spec"], tmp / task.id)

    root = build_once(cache_dir() / f"clawgymbench-{split}-{digest}", build)
    suite = load_clawgym_folder(root, name=SUITE)
    if suite.problems:
        raise RuntimeError(f"generated ClawGymBench folders failed to import:\n{suite.report()}")
    by_id = {t.id: t for t in suite.tasks or []}
    return [by_id[t.id] for t in drafts]
