"""OfficeQA: questions over long statistical bulletins, answered as a number in answer.txt.

Documents imitate monthly fiscal bulletins of a national finance ministry: pages of fixed-width or
markdown tables (receipts by source, outlays by agency, debt at quarter ends) between prose sections
that also quote (distracting) figures. All figures are in millions of dollars.

- level 0: one short page and a direct lookup of one table cell; built like ClawGymBench's level 0 (the
  instruction names the `write` tool; half the reward for answer.txt existing, half for the number);
- level 1: a long bulletin (about ten pages) and one or two arithmetic steps (quarter sums, month
  deficits, percent changes);
- level 2: two bulletins of consecutive fiscal years (.txt and .md) plus a debt history CSV; the answer
  needs figures from several documents and several steps.
Scoring: `match_answer` (relative tolerance, separators, %, currency) on answer.txt.

OfficeQAEasy (`load_easy`): level 0 with the bulletin excerpt quoted in the instruction and an empty
workspace (task_suites.inline says why), the suite where the 0.5B model gets GRPO signal.
"""

from __future__ import annotations

import random

from clawgym_env.specs import TaskSpec
from task_suites._common import Draft, generate
from task_suites.inline import easy_tasks
from verifiers.files import AnswerMatches, FileChecksVerifier, FileExists

SUITE = "OfficeQA"
EASY_SUITE = "OfficeQAEasy"
MONTHS = ["Oct", "Nov", "Dec", "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep"]
RECEIPTS = {
    "Individual income taxes": 180_000,
    "Corporation income taxes": 32_000,
    "Social insurance and retirement receipts": 110_000,
    "Excise taxes": 7_500,
    "Estate and gift taxes": 2_100,
    "Customs duties": 6_400,
    "Miscellaneous receipts": 9_800,
}
OUTLAYS = {
    "Department of Defense": 62_000,
    "Department of Health and Human Services": 120_000,
    "Social Security Administration": 98_000,
    "Department of the Treasury": 55_000,
    "Department of Agriculture": 14_000,
    "Department of Transportation": 9_000,
    "Department of Education": 7_000,
    "Other agencies": 41_000,
}
ANSWER_NOTE = "Write only the number (no words) to a file named answer.txt in the workspace."
# Level 0 names the tool, as ClawGymBench's level 0 does (there it turned the 0.5B model's chat answers into
# write calls; through Claude Code, OfficeQA's level 0 still starts at 0: docs/experiments.md).
LEVEL0_ANSWER_NOTE = "Use the write tool to create the file answer.txt containing only the number (no words)."


def month_label(fy: int, i: int) -> str:
    return f"{MONTHS[i]} {fy - 1 if i < 3 else fy}"


def fiscal_year(rng: random.Random, fy: int) -> dict:
    receipts = {k: [int(v * rng.uniform(0.7, 1.3)) for _ in MONTHS] for k, v in RECEIPTS.items()}
    outlays = {k: [int(v * rng.uniform(0.75, 1.25)) for _ in MONTHS] for k, v in OUTLAYS.items()}
    public = rng.randint(21_000_000, 27_000_000)
    debt = []
    for q in range(4):
        public += rng.randint(150_000, 450_000)
        debt.append(
            {
                "quarter_end": month_label(fy, 3 * q + 2),
                "held_by_public": public,
                "intragovernmental": rng.randint(6_500_000, 7_200_000),
            }
        )
    return {"fy": fy, "receipts": receipts, "outlays": outlays, "debt": debt}


def _txt_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    rule = "-" * len(line(header))
    return "\n".join([title, rule, line(header), rule, *map(line, rows), rule])


def _md_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    out = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _n(v: int) -> str:
    return f"{v:,}"


def _prose(rng: random.Random, data: dict, topic: str) -> str:
    fy = data["fy"]
    sentences = [
        f"This section reviews {topic} during fiscal year {fy}, which began on October 1, {fy - 1}.",
        f"Analysts noted that seasonal patterns in {rng.choice(list(RECEIPTS)).lower()} were broadly in line with prior years.",
        f"A revision of {_n(rng.randint(50, 900))} million dollars to earlier estimates is reflected in the tables that follow.",
        f"Employment in the reporting agencies rose by {rng.randint(1, 9)}.{rng.randint(0, 9)} percent over the year.",
        f"Figures for {month_label(fy, rng.randrange(12))} are preliminary and subject to revision in the next issue.",
        f"Interest rates on marketable securities averaged {rng.randint(1, 5)}.{rng.randint(10, 99)} percent, compared with "
        f"{rng.randint(1, 5)}.{rng.randint(10, 99)} percent a year earlier.",
        "Detail may not add to totals because of rounding.",
        f"Outstanding balances in the stabilization fund stood at {_n(rng.randint(10_000, 99_000))} million dollars.",
    ]
    rng.shuffle(sentences)
    return " ".join(sentences)


def bulletin(rng: random.Random, data: dict, *, markdown: bool) -> str:
    """A many-page bulletin for one fiscal year (text with fixed-width tables, or markdown)."""
    fy = data["fy"]
    table = _md_table if markdown else _txt_table
    head = [
        f"# Monthly Fiscal Bulletin, fiscal year {fy}" if markdown else f"MONTHLY FISCAL BULLETIN -- FISCAL YEAR {fy}"
    ]
    months = [month_label(fy, i) for i in range(12)]
    pages: list[str] = []
    pages.append(
        "\n\n".join(head + [_prose(rng, data, "the federal finances"), _prose(rng, data, "economic conditions")])
    )
    total_r = [sum(v[i] for v in data["receipts"].values()) for i in range(12)]
    total_o = [sum(v[i] for v in data["outlays"].values()) for i in range(12)]
    rows = [[months[i], _n(total_r[i]), _n(total_o[i]), _n(total_r[i] - total_o[i])] for i in range(12)]
    rows.append(["Fiscal year total", _n(sum(total_r)), _n(sum(total_o)), _n(sum(total_r) - sum(total_o))])
    pages.append(
        table(
            "Table FFO-1. Summary of Fiscal Operations (in millions of dollars)",
            ["Month", "Total receipts", "Total outlays", "Surplus or deficit (-)"],
            rows,
        )
    )
    pages.append(_prose(rng, data, "budget receipts"))
    for half, idx in (("first half", range(0, 6)), ("second half", range(6, 12))):
        rows = [[k, *(_n(v[i]) for i in idx)] for k, v in data["receipts"].items()]
        if half == "second half":
            rows = [r + [_n(sum(data["receipts"][r[0]]))] for r in rows]
        hdr = ["Source", *(months[i] for i in idx)] + (["Fiscal year total"] if half == "second half" else [])
        pages.append(
            table(
                f"Table FFO-2. Budget Receipts by Source, {half} of fiscal year {fy} (in millions of dollars)",
                hdr,
                rows,
            )
        )
    pages.append(_prose(rng, data, "budget outlays"))
    for half, idx in (("first half", range(0, 6)), ("second half", range(6, 12))):
        rows = [[k, *(_n(v[i]) for i in idx)] for k, v in data["outlays"].items()]
        pages.append(
            table(
                f"Table FFO-3. Budget Outlays by Agency, {half} of fiscal year {fy} (in millions of dollars)",
                ["Agency", *(months[i] for i in idx)],
                rows,
            )
        )
    pages.append(_prose(rng, data, "federal debt"))
    rows = [
        [
            d["quarter_end"],
            _n(d["held_by_public"]),
            _n(d["intragovernmental"]),
            _n(d["held_by_public"] + d["intragovernmental"]),
        ]
        for d in data["debt"]
    ]
    pages.append(
        table(
            "Table FD-1. Summary of Federal Debt at end of quarter (in millions of dollars)",
            ["End of quarter", "Held by the public", "Intragovernmental holdings", "Total"],
            rows,
        )
    )
    pages.append(
        _prose(rng, data, "international financial statistics") + "\n\n" + _prose(rng, data, "cash management")
    )
    sep = "\n\n---\n\n" if markdown else "\n\f\n"
    return (
        sep.join(
            f"{p}\n\n{'' if markdown else '                                   '}Page {i + 1}"
            for i, p in enumerate(pages)
        )
        + "\n"
    )


def _answer_task(rng, level, category, instruction, files, answer, decimals, rel_tol):
    text = f"{answer:.{decimals}f}" if decimals else str(int(round(answer)))
    checks = [
        AnswerMatches(
            "answer.txt", text, rel_tol=rel_tol, abs_tol=0.6 * 10**-decimals if decimals else 0.5, name="answer"
        )
    ]
    if level == 0:  # built like ClawGymBench's level 0: the tool named, half credit for the asked-for file
        checks.insert(0, FileExists("answer.txt", name="exists"))
    return Draft(
        key=f"{level}|{category}|{instruction}|{text}|{sorted(files.items())}",
        instruction=f"{instruction} {LEVEL0_ANSWER_NOTE if level == 0 else ANSWER_NOTE}",
        workspace=files,
        verifier=FileChecksVerifier(checks, name="officeqa"),
        category=category,
        reference={"answer.txt": text + "\n"},
        extra={"answer": text},
    )


def make(rng: random.Random, level: int) -> Draft:
    fy = rng.randint(2012, 2023)
    if level == 0:
        data = fiscal_year(rng, fy)
        cats = rng.sample(list(RECEIPTS), 3)
        start = rng.randrange(10)
        idx = range(start, start + 3)
        rows = [[c, *(_n(data["receipts"][c][i]) for i in idx)] for c in cats]
        doc = (
            "\n\n".join(
                [
                    f"MONTHLY FISCAL BULLETIN -- FISCAL YEAR {fy} (excerpt)",
                    _txt_table(
                        "Budget receipts by source (in millions of dollars)",
                        ["Source", *(month_label(fy, i) for i in idx)],
                        rows,
                    ),
                ]
            )
            + "\n"
        )
        cat, i = rng.choice(cats), rng.choice(list(idx))
        question = (
            f"According to bulletin.txt, what were {cat.lower()} in {month_label(fy, i)}, in millions of dollars?"
        )
        return _answer_task(rng, level, "lookup", question, {"bulletin.txt": doc}, data["receipts"][cat][i], 0, 1e-6)
    if level == 1:
        data = fiscal_year(rng, fy)
        files = {f"bulletin_fy{fy}.txt": bulletin(rng, data, markdown=False)}
        kind = rng.choice(["quarter_sum", "deficit", "pct_change"])
        if kind == "quarter_sum":
            cat, q = rng.choice(list(RECEIPTS)), rng.randrange(4)
            value = sum(data["receipts"][cat][3 * q : 3 * q + 3])
            question = (
                f"Using the bulletin in the workspace, what were total {cat.lower()} in quarter {q + 1} of fiscal year {fy} "
                f"({month_label(fy, 3 * q)} through {month_label(fy, 3 * q + 2)}), in millions of dollars?"
            )
            return _answer_task(rng, level, "sum", question, files, value, 0, 1e-6)
        if kind == "deficit":
            agencies = rng.sample(list(OUTLAYS), 2)
            i = rng.randrange(12)
            value = sum(data["outlays"][a][i] for a in agencies)
            question = (
                f"Using the bulletin in the workspace, what were the combined outlays of the {agencies[0]} and the "
                f"{agencies[1]} in {month_label(fy, i)}, in millions of dollars?"
            )
            return _answer_task(rng, level, "sum", question, files, value, 0, 1e-6)
        agency = rng.choice(list(OUTLAYS))
        a, b = sorted(rng.sample(range(12), 2))
        old, new = data["outlays"][agency][a], data["outlays"][agency][b]
        question = (
            f"Using the bulletin in the workspace, by what percent did outlays of the {agency} change from "
            f"{month_label(fy, a)} to {month_label(fy, b)}? Round to one decimal place (negative for a decrease)."
        )
        return _answer_task(rng, level, "percent_change", question, files, 100 * (new - old) / old, 1, 2e-3)
    y1, y2 = fiscal_year(rng, fy), fiscal_year(rng, fy + 1)
    csv_rows = ["quarter_end,held_by_public_musd,intragovernmental_musd"] + [
        f"{d['quarter_end']},{d['held_by_public']},{d['intragovernmental']}" for d in y1["debt"] + y2["debt"]
    ]
    files = {
        f"bulletin_fy{fy}.txt": bulletin(rng, y1, markdown=False),
        f"bulletin_fy{fy + 1}.md": bulletin(rng, y2, markdown=True),
        "debt_history.csv": "\n".join(csv_rows) + "\n",
    }
    kind = rng.choice(["annual_change", "debt_ratio", "two_year_average"])
    if kind == "annual_change":
        cat = rng.choice(list(RECEIPTS))
        old, new = sum(y1["receipts"][cat]), sum(y2["receipts"][cat])
        question = (
            f"The workspace holds the bulletins for fiscal years {fy} and {fy + 1}. By what percent did annual "
            f"{cat.lower()} change from fiscal year {fy} to fiscal year {fy + 1}? Round to two decimal places."
        )
        return _answer_task(rng, level, "cross_document", question, files, 100 * (new - old) / old, 2, 1e-3)
    if kind == "debt_ratio":
        public = y2["debt"][-1]["held_by_public"]
        receipts = sum(sum(v) for v in y2["receipts"].values())
        question = (
            f"Using debt_history.csv and the bulletins in the workspace, what is the ratio of debt held by the public at "
            f"the end of fiscal year {fy + 1} ({month_label(fy + 1, 11)}) to total receipts of fiscal year {fy + 1}? "
            "Round to two decimal places."
        )
        return _answer_task(rng, level, "cross_document", question, files, public / receipts, 2, 2e-3)
    agency = rng.choice(list(OUTLAYS))
    value = (sum(y1["outlays"][agency]) + sum(y2["outlays"][agency])) / 24
    question = (
        f"Using both bulletins in the workspace, what were the average monthly outlays of the {agency} over the 24 "
        f"months of fiscal years {fy} and {fy + 1}, in millions of dollars, rounded to the nearest million?"
    )
    return _answer_task(rng, level, "multi_step", question, files, value, 0, 1e-4)


def load(split: str = "train", level: int | None = None, seed: int = 0, count: int | None = None) -> list[TaskSpec]:
    """OfficeQA tasks of one split (see the module docstring for the levels)."""
    return generate(SUITE, make, split=split, level=level, seed=seed, count=count)


def load_easy(
    split: str = "train", level: int | None = None, seed: int = 0, count: int | None = None
) -> list[TaskSpec]:
    """OfficeQAEasy: level 0 with the bulletin excerpt in the instruction (task_suites.inline)."""
    return easy_tasks(EASY_SUITE, make, split, level, seed, count)
