"""Render a rollout's tree for people: terminal text (rich) and a self-contained HTML page.

The tree is shown in segments: maximal runs of tokens without a fork. Each segment says how many tokens it
holds, how many were generated, where its context came from, and which calls it belongs to; the page also
lists every call (role, filter decision, token counts, timings) and the auxiliary trees set aside.
`inspect_run` is what `clawgym inspect <run_dir|calls.jsonl> [--rollout ID]` calls.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from clawgym_env.records import ModelCall, read_calls
from clawgym_env.specs import ForestOptions
from clawgym_env.trajectory.forest import SOURCE_KINDS, TrajectoryForest
from clawgym_env.trajectory.reconstruct import build_forest

Decode = Callable[[list[int]], str]


@dataclass
class Segment:
    """A run of tokens without a fork."""

    nodes: list[int]
    children: list[Segment] = field(default_factory=list)


def segments(forest: TrajectoryForest) -> list[Segment]:
    """The forest's roots as segment trees (a new segment starts at a root and after every fork)."""
    parents = forest.parents
    child_count = np.bincount(parents[parents >= 0], minlength=forest.num_tokens)
    of_node: dict[int, Segment] = {}
    roots: list[Segment] = []
    for node, parent in enumerate(parents.tolist()):
        if parent >= 0 and child_count[parent] == 1:
            seg = of_node[parent]
            seg.nodes.append(node)
        else:
            seg = Segment([node])
            (roots if parent < 0 else of_node[parent].children).append(seg)
        of_node[node] = seg
    return roots


def describe(forest: TrajectoryForest, seg: Segment, decode: Decode | None = None) -> str:
    nodes = np.asarray(seg.nodes)
    gen = int(forest.generated[nodes].sum())
    ctx = Counter(SOURCE_KINDS[s] for s in forest.source[nodes][~forest.generated[nodes]].tolist())
    calls = sorted(set(forest.call_index[nodes].tolist()))
    parts = [f"{len(nodes):,} tokens", f"generated {gen:,}" if gen else "context"]
    if gen and ctx:
        parts.append(f"context {sum(ctx.values()):,}")
    if ctx:
        parts.append("(" + ", ".join(f"{k} {v:,}" for k, v in ctx.most_common()) + ")")
    parts.append("calls " + ",".join(map(str, calls)))
    if gen:
        lp = forest.logprobs[nodes][forest.generated[nodes]]
        parts.append(f"mean logprob {float(lp.mean()):.3f}")
    if not seg.children:
        parts.append("[leaf]")
    text = " | ".join(parts)
    if decode is not None:
        ids = forest.tokens[nodes].tolist()
        preview = decode(ids[:24]) + (" ... " + decode(ids[-24:]) if len(ids) > 48 else decode(ids[24:]))
        text += f"\n  {preview!r}"
    return text


def render_text(forest: TrajectoryForest, decode: Decode | None = None, width: int = 140) -> str:
    console = Console(record=True, width=width, file=open("/dev/null", "w"))  # noqa: SIM115 - recording only
    head = Tree(Text(_headline(forest)))

    def add(node: Tree, f: TrajectoryForest, seg: Segment) -> None:
        child = node.add(Text(describe(f, seg, decode)))
        for sub in seg.children:
            add(child, f, sub)

    for root in segments(forest):
        add(head, forest, root)
    for aux in forest.auxiliary:
        reason = aux.metadata.get("auxiliary_reason")
        branch = head.add(Text(f"[set aside: {reason}] {aux.num_tokens:,} tokens, {aux.num_branches} branches"))
        for root in segments(aux):
            add(branch, aux, root)
    console.print(head)
    console.print(_calls_table(forest))
    breaks = prefix_breaks(forest)
    if breaks:
        console.print(Text("Prefix breaks: " + "; ".join(breaks)))
    filtered = forest.metadata.get("filtered", [])
    if filtered:
        console.print(
            Text("Filtered: " + "; ".join(f"call {f['call_index']}: {f['filter']} ({f['reason']})" for f in filtered))
        )
    return console.export_text()


def _headline(forest: TrajectoryForest) -> str:
    s = forest.stats
    reward = "n/a" if forest.reward is None else f"{forest.reward:.3f}"
    status = forest.status + (f" ({forest.failure})" if forest.failure else "")
    return (
        f"rollout {forest.rollout_id} | task {forest.task_id or '-'} | harness {forest.harness or '-'} | {status} | "
        f"reward {reward} | {s.unique_tokens:,} unique tokens, {s.generated_tokens:,} generated, {s.leaves} branches "
        f"({s.branch_tokens:,} branch tokens) | calls {s.calls} (failed {s.failed_calls}) | {_prefix_summary(s)}"
    )


BREAK_REASONS = ("drift", "edited_history", "harness_rewrite", "compaction", "retry")


def _prefix_summary(s: Any) -> str:
    """How many prompts extended the previous call of their agent, and why the others did not."""
    reasons = [f"{r} {getattr(s, 'breaks_' + r)}" for r in BREAK_REASONS if getattr(s, "breaks_" + r)]
    text = f"prefix extended {s.prefix_extended}, broke {s.prefix_breaks}" + (
        f" ({', '.join(reasons)})" if reasons else ""
    )
    if s.rewritten_turns:
        text += f", rewritten echoes {s.rewritten_turns}"
    return text


def _prefix_cell(check: dict[str, Any] | None) -> str:
    if not check:
        return "-"
    if check.get("extended"):
        return f"extends {check['previous_call']}"
    if check.get("reason") == "new_root":
        return "new root"
    if check.get("reason") is None:
        return "first"
    return f"{check['reason']} @{check['shared']:,}/{check['previous_length']:,}"


def prefix_breaks(forest: TrajectoryForest) -> list[str]:
    """One line per call whose prompt did not extend the previous call of its agent: where and why."""
    out = []
    for rec in forest.metadata.get("calls", []):
        check = rec.get("prefix") or {}
        if check.get("extended") is False:
            out.append(
                f"call {rec['call_index']} vs call {check['previous_call']}: {check['reason']}, {check['detail']}"
            )
    return out


def _call_rows(forest: TrajectoryForest) -> list[dict[str, Any]]:
    rows = []
    for rec in forest.metadata.get("calls", []):
        t = rec.get("timings", {})
        decision = "dead leaf" if rec.get("dead_leaf") else rec.get("role") or "-"
        rows.append(
            {
                "call": rec["call_index"],
                "decision": decision,
                "prompt": rec["prompt_tokens"],
                "generated": rec["generated_tokens"],
                "shared prefix": rec.get("shared_prefix", "-"),
                "prefix": _prefix_cell(rec.get("prefix")),
                "queue s": f"{t.get('queue_s', 0):.3f}",
                "generate s": f"{t.get('generate_s', 0):.3f}",
                "total s": f"{t.get('total_s', 0):.3f}",
                "finish": rec.get("finish_reason", ""),
                "error": rec.get("error") or "",
            }
        )
    return rows


def _calls_table(forest: TrajectoryForest) -> Table:
    rows = _call_rows(forest)
    table = Table(title="calls")
    for col in rows[0] if rows else ["call"]:
        table.add_column(col)
    for row in rows:
        table.add_row(*(Text(str(v)) for v in row.values()))
    return table


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
ul.tree{list-style:none;padding-left:1.2em;border-left:1px dotted #aaa}
.seg{padding:2px 6px;border-radius:4px;display:inline-block;margin:2px 0}
.gen{background:#e3f4e1}.ctx{background:#eef0f5}.aux{background:#fbeee0}
.leaf{font-weight:600}.prev{font-family:monospace;color:#555;white-space:pre-wrap}
table{border-collapse:collapse;margin-top:1em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#f4f4f4}.bad{color:#a00}
"""


def render_html(forest: TrajectoryForest, decode: Decode | None = None) -> str:
    """A self-contained page (inline CSS, no script, no external asset)."""

    def seg_html(f: TrajectoryForest, seg: Segment, extra: str = "") -> str:
        desc = describe(f, seg, decode).split("\n", 1)
        kind = "gen" if f.generated[np.asarray(seg.nodes)].any() else "ctx"
        leaf = " leaf" if not seg.children else ""
        body = f'<span class="seg {kind}{extra}{leaf}">{html.escape(desc[0])}</span>'
        if len(desc) > 1:
            body += f'<div class="prev">{html.escape(desc[1].strip())}</div>'
        kids = "".join(seg_html(f, c, extra) for c in seg.children)
        return f"<li>{body}" + (f'<ul class="tree">{kids}</ul>' if kids else "") + "</li>"

    parts = [f"<h2>{html.escape(_headline(forest))}</h2>", '<ul class="tree">']
    parts += [seg_html(forest, root) for root in segments(forest)]
    parts.append("</ul>")
    for aux in forest.auxiliary:
        reason = html.escape(str(aux.metadata.get("auxiliary_reason")))
        parts.append(
            f"<h3>Set aside ({reason}): {aux.num_tokens:,} tokens, {aux.num_branches} branches</h3><ul class='tree'>"
        )
        parts += [seg_html(aux, root, " aux") for root in segments(aux)]
        parts.append("</ul>")
    rows = _call_rows(forest)
    if rows:
        parts.append("<table><tr>" + "".join(f"<th>{html.escape(k)}</th>" for k in rows[0]) + "</tr>")
        for row in rows:
            broke = row["prefix"] not in ("-", "first", "new root") and not row["prefix"].startswith("extends")
            cls = ' class="bad"' if row["decision"] in ("failed", "dead leaf") or broke else ""
            parts.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row.values()) + "</tr>")
        parts.append("</table>")
    breaks = prefix_breaks(forest)
    if breaks:
        parts.append("<h3>Prefix breaks</h3><ul>" + "".join(f"<li>{html.escape(b)}</li>" for b in breaks) + "</ul>")
    stats = forest.stats.model_dump()
    parts.append("<table>" + "".join(f"<tr><th>{k}</th><td>{v:,}</td></tr>" for k, v in stats.items()) + "</table>")
    title = html.escape(f"rollout {forest.rollout_id}")
    return f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title><style>{_CSS}</style></head><body>{"".join(parts)}</body></html>'


def find_calls_file(path: Path, rollout_id: str | None = None) -> Path:
    """A calls.jsonl, given it or the run directory that holds it; with `rollout_id`, the one that holds that
    rollout (a sharded proxy's run has one per shard: `shard-K/calls.jsonl`)."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is neither a calls.jsonl file nor a run directory")
    direct = path / "calls.jsonl"
    if direct.is_file():
        return direct
    found = sorted(path.rglob("*calls*.jsonl"))
    if not found:
        raise FileNotFoundError(
            f"no calls.jsonl under {path}: pass the run directory of a recorded run or the file itself"
        )
    if rollout_id is not None and len(found) > 1:
        return next((f for f in found if rollout_id in rollout_ids(f)), found[0])
    return found[0]


def rollout_ids(calls_file: Path) -> list[str]:
    """Rollout ids in order of first appearance (cheap: no full validation)."""
    seen: dict[str, None] = {}
    with open(calls_file, "rb") as fh:
        for raw in fh:
            if raw.endswith(b"\n"):
                try:
                    seen.setdefault(orjson.loads(raw)["rollout_id"], None)
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn line: read_calls skips and counts it
    return list(seen)


def inspect_run(
    path: str | Path,
    rollout_id: str | None = None,
    *,
    options: ForestOptions | None = None,
    reward: float | None = None,
    out_dir: str | Path | None = None,
    decode: Decode | None = None,
) -> tuple[str, Path]:
    """Rebuild one recorded rollout and render it: returns (terminal text, path of the HTML page).

    `path` is a run directory or its calls.jsonl; `rollout_id` defaults to the first rollout recorded.
    The page goes to `out_dir` (default: an `inspect/` folder next to the calls file).
    """
    calls_file = find_calls_file(Path(path), rollout_id)
    ids = rollout_ids(calls_file)
    if not ids:
        raise ValueError(f"{calls_file} holds no complete call")
    rollout_id = rollout_id or ids[0]
    if rollout_id not in ids:
        raise ValueError(f"rollout {rollout_id!r} is not in {calls_file}; recorded: {', '.join(ids[:10])}")
    reader = read_calls(calls_file, rollout_id)
    calls: list[ModelCall] = list(reader)
    forest = build_forest(calls, rollout_id=rollout_id, reward=reward, options=options)
    out = Path(out_dir) if out_dir is not None else calls_file.parent / "inspect"
    out.mkdir(parents=True, exist_ok=True)
    html_path = out / f"{rollout_id}.html"
    html_path.write_text(render_html(forest, decode), encoding="utf-8")
    text = render_text(forest, decode)
    if reader.torn_lines:
        text += f"\n{reader.torn_lines} torn line(s) in {calls_file} skipped (a writer was killed mid-line)"
    return text, html_path


def recording_stats(path: str | Path, options: ForestOptions | None = None) -> list[dict[str, Any]]:
    """One row of tree statistics per rollout of a recorded calls.jsonl (for docs and dashboards)."""
    calls_file = find_calls_file(Path(path))
    by_rollout: dict[str, list[ModelCall]] = {}
    for call in read_calls(calls_file):
        by_rollout.setdefault(call.rollout_id, []).append(call)
    rows = []
    for rid, calls in by_rollout.items():
        f = build_forest(calls, rollout_id=rid, options=options)
        s = f.stats
        rows.append(
            {
                "rollout": rid,
                "status": f.status,
                "calls": s.calls,
                "failed calls": s.failed_calls,
                "unique tokens": s.unique_tokens,
                "generated": s.generated_tokens,
                "branches": s.leaves,
                "branch tokens": s.branch_tokens,
                "packed/per-branch": round(s.unique_tokens / s.branch_tokens, 3) if s.branch_tokens else 0.0,
                "dead leaves": s.dead_leaves_removed,
                "compaction calls": s.compaction_calls_set_aside,
                "subagent calls": s.subagent_calls_set_aside,
                "relocated splice tokens": s.relocated_splice_tokens,
                "prefix extended": s.prefix_extended,
                "prefix breaks": s.prefix_breaks,
                "prompt tokens sent": sum(len(c.prompt_ids) for c in calls),
            }
        )
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no rollouts)"
    head = "| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n"
    return head + "".join(
        "| " + " | ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in r.values()) + " |\n" for r in rows
    )
