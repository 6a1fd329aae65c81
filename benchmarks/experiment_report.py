"""The experiments' tables in the docs, rebuilt from the committed per-rollout evidence.

    .venv/bin/python -m benchmarks.experiment_report            # rewrite the generated blocks (and the plot)
    .venv/bin/python -m benchmarks.experiment_report --check    # exit 1 if a doc says what the files do not

Every number in a generated block of docs/experiments.md and of the README comes from the evidence files
under docs/results/ (`evaluation.evidence`): the starting rewards (`benchmarks.starting_rewards
--publish docs/results`), the transfer matrix (`benchmarks.transfer_matrix --publish docs/results`), the
main job's runs (`benchmarks.main_job_runs RUN_DIR --publish docs/results`) and the benchmarks' stored rows.
A block sits between `<!-- generated: NAME -->` and `<!-- end generated: NAME -->`; text outside the
blocks is written by hand. tests/docs/test_experiment_report.py runs `--check`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from evaluation.evidence import UNTRAINED, EvidenceRow, degenerate_groups, groups_with_signal, read_rows
from evaluation.gains import Estimate, difference, gain

if TYPE_CHECKING:
    from benchmarks.main_job_runs import MainJobRun

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
DOCS = [REPO / "docs" / "experiments.md", REPO / "README.md", REPO / "docs" / "trainers.md", REPO / "docs" / "proxy.md"]
MATRIX_SUITE = "ClawGymBench"
BLACK_BOX = ["OpenClaw", "ClaudeCode", "Pi"]
MARKER = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)", re.S)


def _load(name: str, results: Path) -> list[EvidenceRow]:
    path = results / f"{name}.jsonl.gz"
    return read_rows(path) if path.is_file() else []


def _harness_order(harness: str) -> int:
    """Tables list the white-box loop first, then the black-box harnesses, then any other."""
    order = ["WhiteBox", *BLACK_BOX]
    return order.index(harness) if harness in order else len(order)


def _fmt(e: Estimate) -> str:
    return f"{e.value:+.3f} [{e.low:+.3f}, {e.high:+.3f}]"


def _after_comparisons(e: Estimate) -> str:
    """Whether a shown estimate survives the Bonferroni correction for the table's comparisons."""
    if e.comparisons <= 1:  # with one comparison the corrected interval is the interval
        return ""
    return f", holds for {e.comparisons} comparisons" if e.holds_after else f", not after {e.comparisons} comparisons"


def _verdict(e: Estimate) -> str:
    one_seed = "; one seed: tasks and rollouts only, not training seeds" if e.seeds == 1 else ""
    if not e.shown:
        return "no change detectable" + one_seed
    return ("**shown**" if e.value > 0 else "**a loss, shown**") + _after_comparisons(e) + one_seed


def _difference_verdict(d: Estimate) -> str:
    """A difference of two arms' gains, read over the training seeds both arms have (said, since an arm with
    fewer seeds limits it), with the same correction for the table's comparisons as a cell."""
    if d.seeds == 1:
        over = "; over the one seed both arms have: tasks and rollouts only, not training seeds"
    else:
        over = f" (over the {d.seeds} seeds both arms have)"
    if not d.shown:
        return "no difference detectable" + over
    return "shown" + _after_comparisons(d) + over


# ------------------------------------------------------------------------------------------- starting rewards
def _by_suite_and_harness(rows: list[EvidenceRow]) -> list[tuple[tuple[str, str], list[EvidenceRow]]]:
    """Rows grouped by (suite, harness): the matrix's suite first, then by name; harnesses white-box first."""
    groups: dict[tuple[str, str], list[EvidenceRow]] = defaultdict(list)
    for r in rows:
        groups[r.suite, r.eval_harness].append(r)
    return sorted(groups.items(), key=lambda kv: (kv[0][0] != MATRIX_SUITE, kv[0][0], _harness_order(kv[0][1])))


def starting_rewards_block(rows: list[EvidenceRow]) -> str:
    if not rows:
        return "No stored run yet: `python -m benchmarks.starting_rewards --publish docs/results`.\n"
    lines = [
        "| suite (level 0) | harness | tasks | mean reward | full successes | failed | mean calls | commit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (suite, harness), rs in _by_suite_and_harness(rows):
        commits = sorted({r.commit[:10] for r in rs})
        lines.append(
            f"| {suite} | {harness} | {len({r.task_id for r in rs})} | {np.mean([r.reward for r in rs]):.3f} "
            f"| {sum(r.reward >= 1.0 for r in rs)}/{len(rs)} | {sum(r.status != 'ok' for r in rs)} "
            f"| {np.mean([r.num_calls for r in rs]):.1f} | {', '.join(commits)} |"
        )
    return "\n".join(lines) + "\n\nFrom `docs/results/starting_rewards.jsonl.gz` (one row per rollout).\n"


def starting_signal_block(rows: list[EvidenceRow]) -> str:
    """Sampled groups of the untrained policy: how many would give GRPO a non-zero advantage."""
    if not rows:
        return "No stored run yet: `python -m benchmarks.starting_rewards --samples 8 --publish docs/results`.\n"
    lines = [
        "| suite (level 0) | harness | tasks x rollouts | mean reward | rewards 0 / ½ / 1 | groups whose rewards differ "
        "| failed | commit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (suite, harness), rs in _by_suite_and_harness(rows):
        groups: dict[str, list[float]] = defaultdict(list)
        for r in rs:
            groups[r.task_id].append(r.reward)
        sizes = sorted({len(g) for g in groups.values()})
        differ = groups_with_signal(groups)
        shares = " / ".join(f"{np.mean([r.reward == v for r in rs]):.0%}" for v in (0.0, 0.5, 1.0))
        lines.append(
            f"| {suite} | {harness} | {len(groups)} x {'/'.join(map(str, sizes))} | "
            f"{np.mean([r.reward for r in rs]):.3f} | {shares} | {differ}/{len(groups)} "
            f"| {sum(r.status != 'ok' for r in rs)} | {', '.join(sorted({r.commit[:10] for r in rs}))} |"
        )
    return "\n".join(lines) + "\n\nFrom `docs/results/starting_signal.jsonl.gz` (one row per rollout).\n"


# ------------------------------------------------------------------------------------------- transfer matrix
class Matrix:
    """The matrix's cells computed from its evidence rows."""

    def __init__(self, rows: list[EvidenceRow], suite: str = MATRIX_SUITE) -> None:
        self.suite = suite
        self.rows = [r for r in rows if r.suite == suite or r.phase == "train"]
        evaluated = [r for r in self.rows if r.phase != "train"]
        self.harnesses = sorted({r.eval_harness for r in evaluated}, key=_harness_order)
        self.arms = sorted({r.arm for r in evaluated if r.arm != UNTRAINED}, key=lambda a: (len(a.split("+")), a))
        self.cells: dict[tuple[str, str], Estimate] = {}
        pairs = [(a, h) for a in self.arms for h in self.harnesses if self._has(a, h)]
        self.comparisons = len(pairs)
        for arm, h in pairs:
            self.cells[arm, h] = gain(self.rows, arm, h, comparisons=self.comparisons, suite=suite)

    def _has(self, arm: str, harness: str) -> bool:
        seeds = {r.seed for r in self.rows if r.arm == arm and r.eval_harness == harness and r.phase == "after"}
        before = {r.seed for r in self.rows if r.arm == UNTRAINED and r.eval_harness == harness}
        return bool(seeds & before)

    def mean(self, arm: str, harness: str, phase: str) -> float:
        return float(
            np.mean([r.reward for r in self.rows if (r.arm, r.eval_harness, r.phase) == (arm, harness, phase)])
        )

    def table(self) -> str:
        head = "| trained in ↓ / evaluated in → | " + " | ".join(self.harnesses) + " |"
        lines = [head, "|---" * (len(self.harnesses) + 1) + "|"]
        untrained = []
        for h in self.harnesses:
            seeds = {r.seed for r in self.rows if r.arm == UNTRAINED and r.eval_harness == h}
            untrained.append(f"{self.mean(UNTRAINED, h, 'before'):.3f} ({_seeds(len(seeds))})")
        lines.append("| untrained | " + " | ".join(untrained) + " |")
        for arm in self.arms:
            cells = []
            for h in self.harnesses:
                e = self.cells.get((arm, h))
                cells.append(
                    "to run"
                    if e is None
                    else f"{self.mean(arm, h, 'after'):.3f}: {_fmt(e)}, {_verdict(e)} (n={e.seeds})"
                )
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def budgets(self) -> str:
        train = [r for r in self.rows if r.phase == "train"]
        flat = degenerate_groups(train)
        lines = [
            "| arm | seeds | steps run per seed | training rollouts per seed | degenerate groups | extra groups "
            "(with differing rewards) | mean training reward | rewards 0 / ½ / 1 |",
            "|---|---|---|---|---|---|---|---|",
        ]
        # every arm with training rows, evaluated or not: an unfinished run shows the signal it had so far
        for arm in sorted({r.arm for r in train}, key=lambda a: (len(a.split("+")), a)):
            rs = [r for r in train if r.arm == arm]
            seeds = sorted({r.seed for r in rs})
            steps = "/".join(str(max(r.step or 0 for r in rs if r.seed == s)) for s in seeds)
            n_flat, total = flat.get(arm, (0, 0))
            shares = " / ".join(f"{np.mean([r.reward == v for r in rs]):.0%}" for v in (0.0, 0.5, 1.0))
            evaluated = "" if arm in self.arms else " (not evaluated yet)"
            extra = degenerate_groups([r for r in rs if r.extra_group]).get(arm, (0, 0))  # dynamic sampling's
            lines.append(
                f"| {arm}{evaluated} | {len(seeds)} | {steps} | {len(rs) / len(seeds):.0f} | "
                f"{n_flat}/{total} ({n_flat / total:.0%}) | {extra[1]} ({extra[1] - extra[0]}) | "
                f"{np.mean([r.reward for r in rs]):.3f} | {shares} |"
            )
        return "\n".join(lines) + "\n"

    def claims(self) -> str:
        out = [f"Read off one table of {self.comparisons} cells (Bonferroni for that many comparisons):", ""]
        wb = self.cells.get(("WhiteBox", "WhiteBox"))
        if wb is not None:
            own = [e.value for (a, h), e in self.cells.items() if h == "WhiteBox"]
            largest = wb.value >= max(own)
            out.append(
                f"1. *White-box training gains most in its own loop*: {_fmt(wb)}, {_verdict(wb)}; "
                + (
                    "the only arm measured there."
                    if len(own) == 1
                    else "the largest gain in the white-box column."
                    if largest
                    else "not the largest gain in its column."
                )
            )
        transfer = [
            (h, self.cells[("WhiteBox", h)])
            for h in self.harnesses
            if ("WhiteBox", h) in self.cells and h != "WhiteBox"
        ]
        if transfer:
            out.append(
                "2. *It transfers weakly to the black-box harnesses*: "
                + "; ".join(f"in {h} {_fmt(e)}, {_verdict(e)}" for h, e in transfer)
                + "."
            )
        own_gains = [(h, self.cells[(h, h)]) for h in self.harnesses if (h, h) in self.cells and h != "WhiteBox"]
        if own_gains:
            parts = []
            for h, e in own_gains:
                ends = {a: self.mean(a, h, "after") for a in self.arms if (a, h) in self.cells}
                best = max(ends, key=ends.get)
                parts.append(f"in {h} {_fmt(e)}, {_verdict(e)}; highest end reward there: {best} ({ends[best]:.3f})")
            out.append("3. *Black-box training through a harness improves that harness*: " + "; ".join(parts) + ".")
        mixed = self.mixed()
        if mixed:
            out.append(
                "4. *A mixed batch matches single-harness training* (equal budgets): "
                + "; ".join(f"{m} minus {h} alone, in {h}: {_fmt(d)}, {_difference_verdict(d)}" for m, h, d in mixed)
                + "."
            )
        out += [f"{number}. {line}" for number, line in enumerate(self.variant_comparisons(), start=5)]
        return "\n".join(out) + "\n"

    def variant_comparisons(self) -> list[str]:
        """Each variant arm (`transfer_matrix.VARIANTS`) against its plain arm, in the harness both train through."""
        from benchmarks.transfer_matrix import ARMS, VARIANTS

        lines = []
        for arm, v in VARIANTS.items():
            (h,) = ARMS[arm]
            if (arm, h) in self.cells and (v.base, h) in self.cells:
                d = difference(self.rows, arm, v.base, h, comparisons=self.comparisons, suite=self.suite)
                lines.append(
                    f"*{v.claim.format(h=h)}*: {v.name} {_fmt(self.cells[(arm, h)])}, {v.base_name} "
                    f"{_fmt(self.cells[(v.base, h)])}; {v.name} minus {v.base_name} {_fmt(d)}, "
                    f"{_difference_verdict(d)}."
                )
        return lines

    def mixed(self) -> list[tuple[str, str, Estimate]]:
        found = []
        for arm in self.arms:
            parts = arm.split("+")
            for h in parts if len(parts) > 1 else []:
                if (arm, h) in self.cells and (h, h) in self.cells:
                    found.append(
                        (arm, h, difference(self.rows, arm, h, h, comparisons=self.comparisons, suite=self.suite))
                    )
        return found


def own_harness_lines(m: Matrix, what: str = "") -> list[str]:
    """The README's bullets: each harness an arm trained through alone, evaluated in that same harness."""
    return [
        f"- {what}trained and evaluated in {h}: {_fmt(e)}, {_verdict(e)} ({_seeds(e.seeds)})"
        for (arm, h), e in m.cells.items()
        if arm == h
    ]


def matrix_blocks(rows: list[EvidenceRow], other_suites: list[str] | None = None) -> dict[str, str]:
    """The ClawGymBench matrix, its claims and unseen-suite tables, and the README's summary (with
    `other_suites`' bullets after the matrix's)."""
    command = "python -m benchmarks.transfer_matrix --publish docs/results"
    if not rows:
        empty = f"No stored run yet: `{command}`.\n"
        return {"transfer-matrix": empty, "transfer-claims": empty, "transfer-unseen": empty, "readme-summary": empty}
    m = Matrix(rows)
    seeds = sorted({r.seed for r in m.rows if r.phase != "train"})
    source = (
        f"From `docs/results/transfer_matrix.jsonl.gz` ({len(m.rows)} rollouts, seeds {seeds}; made by `{command}`). "
        "A cell: end reward, gain [95 % interval], verdict, seeds.\n"
    )
    summary = [
        f"Held-out gain in ClawGymBench level 0 with the 0.5B policy ({m.comparisons} cells, 95 % intervals):",
        "",
    ]
    summary += own_harness_lines(m)
    if other_suites:
        summary += ["", "Trained and evaluated on one of the article's other suites (its own held-out tasks):", ""]
        summary += other_suites
    summary += [
        "",
        "The whole matrix and the article's claims point by point: [docs/experiments.md](docs/experiments.md).",
    ]
    unseen = sorted({r.suite for r in rows if r.phase != "train"} - {MATRIX_SUITE})
    transfer = []
    for suite in unseen:
        t = Matrix(rows, suite)
        transfer += [f"{suite} (level 0, never trained on; {t.comparisons} cells):", "", t.table()]
    return {
        "transfer-unseen": "\n".join(transfer) if transfer else f"No stored run yet: `{command}`.\n",
        "transfer-matrix": m.table() + "\n" + source + "\nTraining budgets and signal per arm:\n\n" + m.budgets(),
        "transfer-claims": m.claims(),
        "readme-summary": "\n".join(summary) + "\n",
    }


def other_suite_matrices(results: Path) -> list[tuple[Path, Matrix]]:
    """(file, matrix) of each `transfer_matrix --suite S` run published in `results`, read once per report."""
    matrices = []
    for path in sorted(results.glob("transfer_matrix_*.jsonl.gz")):
        suite = path.name.removeprefix("transfer_matrix_").removesuffix(".jsonl.gz")
        matrices.append((path, Matrix(read_rows(path), suite)))
    return matrices


def other_suites_block(others: list[tuple[Path, Matrix]]) -> str:
    """Arms trained on a suite other than ClawGymBench (`transfer_matrix --suite S`, one file per suite)."""
    command = (
        "python -m benchmarks.transfer_matrix --suite OfficeQAEasy --arms ClaudeCode --eval-harnesses ClaudeCode "
        "--transfer-suites --publish docs/results -- engine=vllm"
    )
    parts = []
    for path, m in others:
        seeds = sorted({r.seed for r in m.rows if r.phase != "train"})
        parts += [
            f"{m.suite} (level 0; {m.comparisons} cell{'s' if m.comparisons != 1 else ''}), from "
            f"`docs/results/{path.name}` ({len(m.rows)} rollouts, seeds {seeds}):",
            "",
            m.table(),
            m.budgets(),
        ]
        variants = m.variant_comparisons()  # a dynamic-sampling or PPO arm against its plain arm
        if variants:
            parts += [f"- {line}" for line in variants] + [""]
    if not parts:
        return f"No stored run yet: `{command}`.\n"
    return "\n".join(parts) + f"\nMade by `{command}` (with that file's suite and arms).\n"


def async_training_block(results: Path) -> str:
    """benchmarks.async_training's arms side by side, from its two stored files."""
    from benchmarks.async_training import arm_summaries, read_timings

    command = "python -m benchmarks.async_training --publish docs/results"
    steps = results / "async_training_steps.jsonl.gz"
    if not steps.is_file():
        return f"No stored run yet: `{command}`.\n"
    rows, timings = _load("async_training", results), read_timings(steps)
    arms = arm_summaries(rows, timings)
    lines = [
        "| arm | s per step (per seed) | trainer busy | rollouts busy | push MB / s | checkpoint MB | held-out gain "
        "| vs staleness-0 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in arms:
        ckpt = "-" if a["checkpoint_mb"] is None else f"{a['checkpoint_mb']:.1f}"
        versus = "-" if a["versus_sync"] is None else f"{_fmt(a['versus_sync'])}, {_verdict(a['versus_sync'])}"
        lines.append(
            f"| {a['arm']} | {a['step_s']:.0f} ({', '.join(f'{x:.0f}' for x in a['step_s_by_seed'])}) | {a['trainer_busy']:.2f} | {a['rollouts_busy']:.2f} | "
            f"{a['push_mb']:.2f} / {a['push_s']:.2f} | {ckpt} | {_fmt(a['gain'])} (n={a['gain'].seeds}) | {versus} |"
        )
    cpus = sorted({a["cpu"] for a in arms})
    return (
        "\n".join(lines)
        + f"\n\nFrom `docs/results/async_training.jsonl.gz` and `async_training_steps.jsonl.gz` (made by `{command}`; "
        f"{arms[0]['harness']}, {arms[0]['steps']} steps per arm and seed; CPU: {', '.join(cpus)}). Busy shares are of "
        "the trainer's wall time per step; they add up to more than 1 only where rollouts and updates overlap.\n"
    )


def proxy_ab_block(results: Path) -> str:
    """benchmarks.proxy_ab's before/after figures, from its stored rows."""
    from benchmarks.proxy_ab import FILE, ab_table, by_change, read_rows

    path = results / FILE
    if not path.is_file():
        return "No stored run yet: `python -m benchmarks.proxy_ab --before <checkout> --publish docs/results`.\n"
    return "\n".join(f"**{change}**\n\n{ab_table(rows)}" for change, rows in by_change(read_rows(path)).items())


def readme_table_block(results: Path) -> str:
    """The README's benchmark table, from benchmarks.readme_table's stored figures."""
    from benchmarks.readme_table import FILE, read_stored, table

    return table(read_stored(results / FILE))


def _split(run: MainJobRun) -> str:
    """A run's evaluations and set-up, split where its report measured the parts (older reports did not)."""
    if run.setup_s is None or run.evaluations_s is None:
        return ""
    return f" (set-up {run.setup_s:.0f}, evaluations {run.evaluations_s:.0f})"


def _file_backed(run: MainJobRun) -> str:
    """How much of the main process's peak was mapped files, where its report measured it (older ones did not)."""
    return "" if run.file_backed_main_mb is None else f" ({run.file_backed_main_mb / 1024:.1f} mapped files)"


def main_job_block(results: Path) -> str:
    """The README's main-job runs: what each run reported, and its held-out gain from its stored rollouts."""
    from benchmarks.main_job_runs import ROWS, RUNS, read_runs

    command = "python -m benchmarks.main_job_runs RUN_DIR --publish docs/results"
    runs = read_runs(results / RUNS)
    if not runs:
        return f"No stored run yet: `bash scripts/main.sh`, then `{command}`.\n"
    rows = _load(ROWS.removesuffix(".jsonl.gz"), results)
    lines = [
        "| run (date) | engine; update | wall | rollouts / updates / evaluations and set-up | peak RSS: main / tree | "
        "held-out before → after: gain [95 % interval] | CPU, load |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        mine = [r for r in rows if r.experiment == run.run]
        held = []
        for harness in run.held_out:
            arm = next(r.arm for r in mine if r.phase == "after" and r.eval_harness == harness)
            e = gain(mine, arm, harness)
            before, after = (
                [r for r in mine if (r.phase, r.eval_harness) == (p, harness)] for p in ("before", "after")
            )
            shape = f"{len({r.task_id for r in before})} tasks, {len(before)} rollouts"
            means = f"{np.mean([r.reward for r in before]):.3f} → {np.mean([r.reward for r in after]):.3f}"
            held.append(f"{harness} ({shape}) {means}: {_fmt(e)}, {_verdict(e)}")
        options = run.command.removeprefix("bash scripts/main.sh").strip()  # a run with options says which
        lines.append(
            f"| {run.run} ({run.date}{f'; `{options}`' if options else ''}) | {run.engine}; {run.update} | {run.wall_s / 60:.1f} min | {run.rollouts_s:.0f} / "
            f"{run.updates_s:.0f} / {run.evaluation_and_setup_s:.0f} s{_split(run)} | {run.peak_rss_main_mb / 1024:.1f}"
            f"{_file_backed(run)} / {run.peak_rss_tree_mb / 1024:.1f} GB | {'; '.join(held)} | {run.cpu}, load {run.load_start:.1f} → "
            f"{run.load_end:.1f} |"
        )
    commands = sorted({r.command for r in runs})
    return (
        "\n".join(lines)
        + f"\n\nFrom `docs/results/{RUNS}` (each run's own report) and `docs/results/{ROWS}` (its rollouts), made by "
        f"{', '.join(f'`{c}`' for c in commands)} and `{command}`. Held-out: the same tasks before and after "
        "training; one run is one seed, so its interval covers tasks and rollouts, not training seeds."
        + (
            " Mapped files: the part of the main process's peak that was file-backed pages (the model's weights "
            "file, libraries), which the kernel can drop and read again."
            if any(run.file_backed_main_mb is not None for run in runs)
            else ""
        )
        + "\n"
    )


# ------------------------------------------------------------------------------------------- the docs
def blocks(results: Path = RESULTS) -> dict[str, str]:
    others = other_suite_matrices(results)
    return {
        "main-job": main_job_block(results),
        "starting-rewards": starting_rewards_block(_load("starting_rewards", results)),
        "starting-signal": starting_signal_block(_load("starting_signal", results)),
        **matrix_blocks(
            _load("transfer_matrix", results),
            [line for _, m in others for line in own_harness_lines(m, f"{m.suite} level 0, ")],
        ),
        "other-suites": other_suites_block(others),
        "async-training": async_training_block(results),
        "proxy-ab": proxy_ab_block(results),
        "readme-benchmarks": readme_table_block(results),
    }


def rewrite(text: str, generated: dict[str, str]) -> str:
    """The doc with each generated block replaced; a block the generator does not know is an error."""

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in generated:
            raise KeyError(f"unknown generated block {name!r}; known: {sorted(generated)}")
        return match.group(1) + generated[name] + match.group(4)

    return MARKER.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a doc is out of date")
    args = parser.parse_args(argv)
    generated = blocks()
    stale = []
    for doc in DOCS:
        text = doc.read_text()
        new = rewrite(text, generated)
        if new != text:
            stale.append(doc)
            if not args.check:
                doc.write_text(new)
    if args.check and stale:
        print("out of date (run python -m benchmarks.experiment_report):", *map(str, stale), file=sys.stderr)
        return 1
    if not args.check:
        plot_matrix(_load("transfer_matrix", RESULTS), RESULTS / "transfer_matrix.png")
    return 0


def plot_matrix(rows: list[EvidenceRow], path: Path) -> Path | None:
    """Gains with 95 % intervals, one panel per evaluation harness (orange: trained in that harness)."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = Matrix(rows)
    fig, axes = plt.subplots(1, len(m.harnesses), figsize=(4 * len(m.harnesses), 3.6), sharey=True, squeeze=False)
    for ax, h in zip(axes[0], m.harnesses):
        arms = [a for a in m.arms if (a, h) in m.cells]
        es = [m.cells[(a, h)] for a in arms]
        x = np.arange(len(arms))
        spans = np.array([[e.value - e.low, e.high - e.value] for e in es]).T if es else None
        ax.bar(
            x,
            [e.value for e in es],
            yerr=spans,
            capsize=4,
            color=["tab:orange" if h in a.split("+") else "tab:blue" for a in arms],
        )
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(x, arms, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"evaluated in {h}", fontsize=10)
    axes[0][0].set_ylabel("held-out reward gain (95 % interval)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def _seeds(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")


if __name__ == "__main__":
    raise SystemExit(main())
