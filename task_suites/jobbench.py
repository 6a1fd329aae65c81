"""JobBench: professional workflows over heterogeneous workspaces, judged by binary fact-anchored criteria.

Workspaces mix spreadsheets (.xlsx), SQLite databases, Word documents (.docx) and PNG images with text
metadata. Each task's `RubricVerifier` holds several binary criteria, all checked by code against facts
of the generated files (the right total, the right department, the right set of flagged invoices ...).

Categories: spreadsheet, database, documents, images. Level 0: one small file and one fact written to
answer.txt, built like ClawGymBench's level 0 (the instruction names the `write` tool; half the reward for
answer.txt existing, half for the fact); level 1: one larger file and a structured output (JSON or CSV) of
several facts; level 2: two or three files of different kinds combined into one output.

JobBenchEasy (`load_easy`; the article trains a "JobBench-Easy"): level 0 with the input file shown in the
instruction as text (a spreadsheet as CSV, a database table by table, a document's paragraphs, an image's
metadata) and an empty workspace (task_suites.inline says why).
"""

from __future__ import annotations

import io
import json
import random
import sqlite3
import tempfile
from datetime import date, timedelta
from pathlib import Path

from clawgym_env.specs import TaskSpec
from task_suites._common import Draft, fixed_zip, generate
from task_suites.inline import easy_tasks
from verifiers.answer import normalize_text
from verifiers.files import AnswerMatches, CsvMatches, FileExists, JsonMatches
from verifiers.rubric import Criterion, RubricVerifier

SUITE = "JobBench"
EASY_SUITE = "JobBenchEasy"
DEPARTMENTS = ["Engineering", "Marketing", "Sales", "Finance", "Operations", "Legal"]
VENDORS = ["Acme Supply", "Globex", "Initech", "Umbrella Services", "Stark Tools", "Wayne Logistics", "Hooli Cloud"]
PEOPLE = [
    "Ana Silva",
    "Ben Okafor",
    "Chen Wei",
    "Dana Kowalski",
    "Eli Cohen",
    "Fatima Noor",
    "Gus Lind",
    "Hana Sato",
    "Ivan Petrov",
    "Julia Ortiz",
    "Kofi Mensah",
    "Lena Braun",
    "Mateo Rossi",
    "Nina Patel",
    "Omar Haddad",
]
LICENSES = ["CC-BY", "CC-BY-SA", "CC-BY-NC", "All rights reserved"]


# ------------------------------------------------------------------------------------------ file makers
def xlsx_bytes(sheet: str, header: list[str], rows: list[list]) -> bytes:
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = sheet
    ws.append(header)
    for row in rows:
        ws.append(row)
    fixed = __import__("datetime").datetime(2024, 1, 1)
    wb.properties.created = wb.properties.modified = fixed
    buf = io.BytesIO()
    wb.save(buf)
    return fixed_zip(buf.getvalue())


def docx_bytes(title: str, paragraphs: list[str]) -> bytes:
    import docx

    document = docx.Document()
    document.add_heading(title, level=1)
    for p in paragraphs:
        document.add_paragraph(p)
    fixed = __import__("datetime").datetime(2024, 1, 1)
    document.core_properties.created = document.core_properties.modified = fixed
    buf = io.BytesIO()
    document.save(buf)
    return fixed_zip(buf.getvalue())


def sqlite_bytes(schema: str, table: str, rows: list[tuple]) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "db.sqlite"
        conn = sqlite3.connect(path)
        conn.execute(schema)
        conn.executemany(f"insert into {table} values ({','.join('?' * len(rows[0]))})", rows)
        conn.commit()
        conn.close()
        return path.read_bytes()


def png_bytes(rng: random.Random, width: int, height: int, meta: dict[str, str]) -> bytes:
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    img = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    info = PngInfo()
    for k, v in meta.items():
        info.add_text(k, v)
    buf = io.BytesIO()
    img.save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


def _key(level: int, category: str, instruction: str, facts) -> str:
    return f"{level}|{category}|{instruction}|{json.dumps(facts, sort_keys=True, default=str)}"


def lines_check(path: str, expected: set[str]):
    """Criterion checks for a one-item-per-line output file: all expected present, nothing extra."""

    def read(ws: Path) -> set[str]:
        p = ws / path
        return (
            {normalize_text(x) for x in p.read_text(encoding="utf-8").splitlines() if x.strip()}
            if p.is_file()
            else set()
        )

    want = {normalize_text(x) for x in expected}
    return (lambda ws: want <= read(ws)), (lambda ws: (ws / path).is_file() and read(ws) <= want)


def _draft(level, category, instruction, files, criteria, reference, facts) -> Draft:
    return Draft(
        key=_key(level, category, instruction, facts),
        instruction=instruction,
        workspace=files,
        verifier=RubricVerifier(criteria, name=f"jobbench-{category}"),
        category=category,
        reference=reference,
        extra={"facts": facts},
    )


# --------------------------------------------------------------------------------------------- tasks
def spreadsheet(rng: random.Random, level: int) -> Draft:
    n = {0: 5, 1: 15, 2: 20}[level]
    rows = [
        [
            str(date(2024, 1, 1) + timedelta(days=rng.randrange(180))),
            rng.choice(DEPARTMENTS),
            rng.choice(VENDORS),
            round(rng.uniform(50, 5000), 2),
        ]
        for _ in range(n)
    ]
    header = ["Date", "Department", "Vendor", "Amount"]
    files: dict[str, str | bytes] = {"expenses.xlsx": xlsx_bytes("Expenses", header, rows)}
    total = round(sum(r[3] for r in rows), 2)
    if level == 0:
        instr = "expenses.xlsx lists company expenses. What is the total of the Amount column? Use the write tool to write only the number to answer.txt."
        crit = [
            Criterion("answer_written", check=FileExists("answer.txt")),
            Criterion("total_correct", check=AnswerMatches("answer.txt", total, rel_tol=1e-4)),
        ]
        return _draft(
            level, "spreadsheet", instr, files, crit, {"answer.txt": f"{total:.2f}\n"}, {"total": total, "rows": rows}
        )
    by_dept: dict[str, float] = {}
    for r in rows:
        by_dept[r[1]] = round(by_dept.get(r[1], 0) + r[3], 2)
    if level == 1:
        top = max(by_dept, key=by_dept.get)
        largest = max(rows, key=lambda r: r[3])[2]
        instr = (
            'Summarize expenses.xlsx into summary.json with keys: "total" (sum of Amount, 2 decimals), '
            '"top_department" (department with the highest total spend) and "largest_expense_vendor" (vendor of the single largest expense).'
        )
        facts = {"total": total, "top_department": top, "largest_expense_vendor": largest}
        crit = [
            Criterion("valid_json", check=JsonMatches("summary.json", required=list(facts))),
            Criterion("total", 2, JsonMatches("summary.json", {"total": total}, rel_tol=1e-4, name="t")),
            Criterion("top_department", 1, JsonMatches("summary.json", {"top_department": top}, name="d")),
            Criterion("largest_vendor", 1, JsonMatches("summary.json", {"largest_expense_vendor": largest}, name="v")),
        ]
        return _draft(level, "spreadsheet", instr, files, crit, {"summary.json": json.dumps(facts) + "\n"}, facts)
    budgets = {d: round(by_dept.get(d, 0) * rng.uniform(0.7, 1.3), 2) for d in DEPARTMENTS}
    files["budgets.db"] = sqlite_bytes(
        "create table budgets (department text primary key, budget real)", "budgets", sorted(budgets.items())
    )
    over = sorted((d, by_dept[d], budgets[d]) for d in by_dept if by_dept[d] > budgets[d])
    instr = (
        "Compare actual spend in expenses.xlsx with the budgets in the SQLite database budgets.db (table budgets). "
        "Write over_budget.csv with columns department,spent,budget,overrun (overrun = spent - budget, 2 decimals) for every "
        "department whose spend exceeds its budget, sorted by department name."
    )
    rows_out = [{"department": d, "spent": s, "budget": b, "overrun": round(s - b, 2)} for d, s, b in over]
    csv_text = "department,spent,budget,overrun\n" + "".join(
        f"{r['department']},{r['spent']:.2f},{r['budget']:.2f},{r['overrun']:.2f}\n" for r in rows_out
    )
    crit = [
        Criterion("file_written", check=FileExists("over_budget.csv")),
        Criterion("columns", check=CsvMatches("over_budget.csv", columns=["department", "spent", "budget", "overrun"])),
        Criterion(
            "right_departments",
            2,
            CsvMatches(
                "over_budget.csv", rows=[{"department": r["department"]} for r in rows_out], key="department", name="d"
            ),
        ),
        Criterion(
            "right_figures", 2, CsvMatches("over_budget.csv", rows=rows_out, ordered=True, rel_tol=1e-3, name="f")
        ),
    ]
    return _draft(level, "spreadsheet", instr, files, crit, {"over_budget.csv": csv_text}, {"over": rows_out})


def database(rng: random.Random, level: int) -> Draft:
    n = {0: 8, 1: 15, 2: 10}[level]
    names = rng.sample(PEOPLE, n)
    emps = [
        (
            i + 1,
            names[i],
            rng.choice(DEPARTMENTS[:4]),
            rng.randrange(40, 160) * 1000,
            str(date(2010, 1, 1) + timedelta(days=rng.randrange(4500))),
        )
        for i in range(n)
    ]
    files: dict[str, str | bytes] = {
        "hr.db": sqlite_bytes(
            "create table employees (id integer primary key, name text, department text, salary integer, hire_date text)",
            "employees",
            emps,
        )
    }
    if level == 0:
        dept = rng.choice(sorted({e[2] for e in emps}))
        count = sum(e[2] == dept for e in emps)
        instr = f"The SQLite database hr.db has a table employees. How many employees work in the {dept} department? Use the write tool to write only the number to answer.txt."
        crit = [
            Criterion("answer_written", check=FileExists("answer.txt")),
            Criterion("count_correct", check=AnswerMatches("answer.txt", count, rel_tol=0)),
        ]
        return _draft(
            level,
            "database",
            instr,
            files,
            crit,
            {"answer.txt": f"{count}\n"},
            {"count": count, "dept": dept, "emps": emps},
        )
    if level == 1:
        dept = rng.choice(sorted({e[2] for e in emps}))
        headcount = {d: sum(e[2] == d for e in emps) for d in sorted({e[2] for e in emps})}
        avg = round(sum(e[3] for e in emps if e[2] == dept) / headcount[dept], 2)
        senior = min(emps, key=lambda e: e[4])[1]
        instr = (
            f'From hr.db (table employees) write report.json with keys "headcount" (an object: department -> number of employees), '
            f'"average_salary_{dept.lower()}" (mean salary in {dept}, 2 decimals) and "longest_serving" (name of the employee with the earliest hire_date).'
        )
        facts = {"headcount": headcount, f"average_salary_{dept.lower()}": avg, "longest_serving": senior}
        crit = [
            Criterion("valid_json", check=JsonMatches("report.json", required=list(facts))),
            Criterion("headcount", 2, JsonMatches("report.json", {"headcount": headcount}, name="h")),
            Criterion(
                "average_salary",
                1,
                JsonMatches("report.json", {f"average_salary_{dept.lower()}": avg}, rel_tol=1e-4, name="a"),
            ),
            Criterion("longest_serving", 1, JsonMatches("report.json", {"longest_serving": senior}, name="l")),
        ]
        return _draft(level, "database", instr, files, crit, {"report.json": json.dumps(facts) + "\n"}, facts)
    pct = {r: rng.choice([0, 1, 2, 3, 4, 5, 6, 8]) for r in ("exceeds", "meets", "below")}
    if len(set(pct.values())) < 3:
        pct = {"exceeds": 6, "meets": 3, "below": 0}
    ratings = {e[0]: rng.choice(list(pct)) for e in emps}
    files["ratings.xlsx"] = xlsx_bytes(
        "Ratings", ["employee_id", "rating"], [[i, r] for i, r in sorted(ratings.items())]
    )
    files["raise_policy.docx"] = docx_bytes(
        "Annual raise policy",
        [
            "This policy sets the salary increase for each performance rating.",
            *(f"Employees rated '{r}' receive a raise of {p} percent of their current salary." for r, p in pct.items()),
            "New salaries are rounded to the nearest whole dollar.",
        ],
    )
    new = {e[0]: round(e[3] * (1 + pct[ratings[e[0]]] / 100)) for e in emps}
    instr = (
        "Apply the raise policy in raise_policy.docx to every employee in hr.db (table employees) using the ratings in ratings.xlsx. "
        "Write raises.csv with columns employee_id,name,new_salary (one row per employee, sorted by employee_id)."
    )
    rows_out = [{"employee_id": e[0], "name": e[1], "new_salary": new[e[0]]} for e in emps]
    csv_text = "employee_id,name,new_salary\n" + "".join(
        f"{r['employee_id']},{r['name']},{r['new_salary']}\n" for r in rows_out
    )
    crit = [
        Criterion("file_written", check=FileExists("raises.csv")),
        Criterion("columns", check=CsvMatches("raises.csv", columns=["employee_id", "name", "new_salary"])),
        Criterion("every_employee", 1, CsvMatches("raises.csv", row_count=len(rows_out), name="n")),
        Criterion(
            "salaries_correct", 3, CsvMatches("raises.csv", rows=rows_out, key="employee_id", rel_tol=1e-6, name="s")
        ),
    ]
    return _draft(level, "database", instr, files, crit, {"raises.csv": csv_text}, {"pct": pct, "rows": rows_out})


def documents(rng: random.Random, level: int) -> Draft:
    client, vendor = rng.sample(
        ["Northwind Traders", "Contoso Ltd", "Fabrikam Inc", "Tailspin Toys", "Litware Group", "Proseware Co"], 2
    )
    eff = date(2023, 1, 1) + timedelta(days=rng.randrange(700))
    fee, term = rng.randrange(20, 400) * 500, rng.choice([6, 12, 18, 24, 36])
    cap = rng.randrange(8, 40) * 250
    paragraphs = [
        f"This Services Agreement is made between {client} (the Client) and {vendor} (the Vendor).",
        f"The agreement takes effect on {eff.strftime('%B %d, %Y')} and runs for a term of {term} months.",
        f"The Client shall pay the Vendor a total fee of ${fee:,} for the services described in Schedule A.",
        f"No single monthly invoice may exceed ${cap:,}; amounts above this cap require written approval.",
        "This agreement is governed by the laws of the State of Delaware.",
        "Either party may terminate the agreement with sixty days written notice.",
    ]
    files: dict[str, str | bytes] = {"contract.docx": docx_bytes("Services Agreement", paragraphs)}
    if level == 0:
        instr = "contract.docx is a services agreement. What total fee does the Client pay? Use the write tool to write only the amount in dollars to answer.txt."
        crit = [
            Criterion("answer_written", check=FileExists("answer.txt")),
            Criterion("fee_correct", check=AnswerMatches("answer.txt", fee, rel_tol=1e-6)),
        ]
        return _draft(
            level, "documents", instr, files, crit, {"answer.txt": f"{fee}\n"}, {"fee": fee, "client": client}
        )
    if level == 1:
        facts = {
            "client": client,
            "vendor": vendor,
            "effective_date": eff.isoformat(),
            "total_fee": fee,
            "term_months": term,
        }
        instr = (
            'Extract the key terms of contract.docx into contract_summary.json with keys "client", "vendor", '
            '"effective_date" (YYYY-MM-DD), "total_fee" (a number) and "term_months" (a number).'
        )
        crit = [Criterion("valid_json", check=JsonMatches("contract_summary.json", required=list(facts)))] + [
            Criterion(k, 1, JsonMatches("contract_summary.json", {k: v}, rel_tol=1e-6, name=k))
            for k, v in facts.items()
        ]
        return _draft(
            level, "documents", instr, files, crit, {"contract_summary.json": json.dumps(facts) + "\n"}, facts
        )
    invoices = [
        [f"INV-{1000 + i}", str(eff + timedelta(days=30 * i)), rng.randrange(int(cap * 0.6), int(cap * 1.4))]
        for i in range(8)
    ]
    files["invoices.xlsx"] = xlsx_bytes("Invoices", ["invoice_id", "date", "amount"], invoices)
    flagged = {i[0] for i in invoices if i[2] > cap}
    instr = (
        "The contract in contract.docx caps each monthly invoice. List every invoice in invoices.xlsx whose amount exceeds "
        "that cap: write their invoice ids to flagged.txt, one per line (write an empty file if none)."
    )
    all_found, nothing_extra = lines_check("flagged.txt", flagged)
    crit = [
        Criterion("file_written", check=FileExists("flagged.txt")),
        Criterion("all_flagged_found", 2, all_found),
        Criterion("no_false_flags", 2, nothing_extra),
    ]
    return _draft(
        level,
        "documents",
        instr,
        files,
        crit,
        {"flagged.txt": "".join(f"{i}\n" for i in sorted(flagged))},
        {"cap": cap, "flagged": sorted(flagged)},
    )


def images(rng: random.Random, level: int) -> Draft:
    n = {0: 1, 1: 4, 2: 5}[level]
    photos = []
    for i in range(n):
        w, h = rng.choice([(32, 24), (40, 30), (24, 32), (48, 48), (64, 36)])
        meta = {
            "Author": rng.choice(PEOPLE),
            "Title": f"{rng.choice(['Harbor', 'Market', 'Bridge', 'Garden', 'Station'])} {rng.randrange(1, 99)}",
        }
        photos.append((f"photo_{i + 1}.png" if n > 1 else "photo.png", w, h, meta))
    prefix = "photos/" if n > 1 else ""
    files: dict[str, str | bytes] = {f"{prefix}{p[0]}": png_bytes(rng, p[1], p[2], p[3]) for p in photos}
    if level == 0:
        author = photos[0][3]["Author"]
        instr = "photo.png carries text metadata (PNG text chunks). Who is its Author? Use the write tool to write only the name to answer.txt."
        crit = [
            Criterion("answer_written", check=FileExists("answer.txt")),
            Criterion("author_correct", check=AnswerMatches("answer.txt", author)),
        ]
        return _draft(level, "images", instr, files, crit, {"answer.txt": author + "\n"}, {"author": author})
    if level == 1:
        rows = [{"filename": p[0], "author": p[3]["Author"], "width": p[1], "height": p[2]} for p in photos]
        instr = (
            "Build catalog.csv for the PNG images in photos/: columns filename,author,width,height (author from each image's "
            "Author metadata, size in pixels), one row per image sorted by filename."
        )
        csv_text = "filename,author,width,height\n" + "".join(
            f"{r['filename']},{r['author']},{r['width']},{r['height']}\n" for r in rows
        )
        crit = [
            Criterion("file_written", check=FileExists("catalog.csv")),
            Criterion("columns", check=CsvMatches("catalog.csv", columns=["filename", "author", "width", "height"])),
            Criterion(
                "authors",
                2,
                CsvMatches(
                    "catalog.csv",
                    rows=[{k: r[k] for k in ("filename", "author")} for r in rows],
                    key="filename",
                    name="a",
                ),
            ),
            Criterion(
                "sizes",
                2,
                CsvMatches(
                    "catalog.csv",
                    rows=[{k: r[k] for k in ("filename", "width", "height")} for r in rows],
                    key="filename",
                    name="s",
                ),
            ),
        ]
        return _draft(level, "images", instr, files, crit, {"catalog.csv": csv_text}, {"rows": rows})
    authors = sorted({p[3]["Author"] for p in photos})
    lic = {a: rng.choice(LICENSES) for a in authors}
    allowed = set(rng.sample(LICENSES, 2))
    files["licenses.db"] = sqlite_bytes(
        "create table licenses (author text primary key, license text)", "licenses", sorted(lic.items())
    )
    files["publishing_policy.docx"] = docx_bytes(
        "Publishing policy",
        [
            "Only images whose author has granted one of the following licenses may be published:",
            *(f"- {x}" for x in sorted(allowed)),
            "Images under any other license must not be published.",
        ],
    )
    ok = {p[0] for p in photos if lic[p[3]["Author"]] in allowed}
    instr = (
        "Decide which images in photos/ may be published: look up each image's Author (PNG metadata) in licenses.db "
        "(table licenses) and apply publishing_policy.docx. Write the publishable file names to publishable.txt, one per line "
        "(an empty file if none)."
    )
    all_found, nothing_extra = lines_check("publishable.txt", ok)
    crit = [
        Criterion("file_written", check=FileExists("publishable.txt")),
        Criterion("all_publishable_listed", 2, all_found),
        Criterion("nothing_forbidden_listed", 2, nothing_extra),
    ]
    return _draft(
        level,
        "images",
        instr,
        files,
        crit,
        {"publishable.txt": "".join(f"{x}\n" for x in sorted(ok))},
        {"licenses": lic, "allowed": sorted(allowed)},
    )


CATEGORIES = {"spreadsheet": spreadsheet, "database": database, "documents": documents, "images": images}


def make(rng: random.Random, level: int) -> Draft:
    return CATEGORIES[rng.choice(sorted(CATEGORIES))](rng, level)


def load(split: str = "train", level: int | None = None, seed: int = 0, count: int | None = None) -> list[TaskSpec]:
    """JobBench tasks of one split (see the module docstring for categories and levels)."""
    return generate(SUITE, make, split=split, level=level, seed=seed, count=count)


def load_easy(
    split: str = "train", level: int | None = None, seed: int = 0, count: int | None = None
) -> list[TaskSpec]:
    """JobBenchEasy: level 0 with the input file shown in the instruction (task_suites.inline)."""
    return easy_tasks(EASY_SUITE, make, split, level, seed, count)
