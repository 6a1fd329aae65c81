"""Recorded ModelCalls of one rollout -> TrajectoryForest (a token trie), with the filters applied.

Each call inserts its prompt + generation as one root-to-node path: identical histories merge, different
continuations branch. A generated token lives where the engine sampled it; when a later prompt splices
it back at the same place it stays generated (one node, its original logprob). Spliced at another place
(harnesses that reorder their history, e.g. OpenClaw's trailing context message) it is context there.
See `clawgym_env.trajectory.filters` for what the filters decide and docs/trajectory.md for the rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from clawgym_env.prefix import check_prefix
from clawgym_env.records import ModelCall
from clawgym_env.specs import ForestOptions
from clawgym_env.trajectory import filters
from clawgym_env.trajectory.forest import ForestStats, TrajectoryForest
from clawgym_env.trajectory.trie import NODE_COLUMNS, PreparedCall, RootKey, TreeBuilder

_ARRAY_FIELDS = ("tokens", "parents", "generated", "logprobs", "policy_versions", "call_index", "source", "depth")


def build_forest(
    calls: Iterable[ModelCall],
    *,
    rollout_id: str,
    task_id: str = "",
    harness: str = "",
    reward: float | None = None,
    options: ForestOptions | None = None,
    failure: str | None = None,
) -> TrajectoryForest:
    """Rebuild one rollout's forest from its calls (any order, gaps allowed).

    `failure` is the rollout-level reason when the harness crashed or the verifier errored: the forest is
    still built (for inspection) but reported as failed, never as a zero-reward success.
    """
    options = options or ForestOptions()
    ordered = _validated(list(calls), rollout_id)
    stats = ForestStats(calls=len(ordered), drift_events=sum(c.drift_events for c in ordered))
    base: dict[str, Any] = {"rollout_id": rollout_id, "task_id": task_id, "harness": harness}
    if not ordered:
        stats.empty_rollouts = 1
        return TrajectoryForest(**base, status="empty", failure=failure or "no model call was recorded", stats=stats)

    prepared = [PreparedCall.from_call(c) for c in ordered]
    records = {pc.index: _call_record(pc) for pc in prepared}
    live = [pc for pc in prepared if not filters.is_failed_call(pc)]
    _count_prefix_checks(live, records, stats, options.compaction_ratio)
    removed: list[dict[str, Any]] = []
    for pc in prepared:
        if filters.is_failed_call(pc):
            records[pc.index]["role"] = "failed"
            removed.append({"call_index": pc.index, "filter": "failed_call", "reason": pc.call.error or "no tokens"})
    stats.failed_calls = len(prepared) - len(live)
    if not live:
        stats.failed_rollouts = 1
        first_error = next((pc.call.error for pc in prepared if pc.call.error), "no tokens generated")
        reason = failure or f"all {len(prepared)} model calls failed (first error: {first_error})"
        meta = {"calls": list(records.values()), "filtered": removed}
        return TrajectoryForest(**base, status="failed", failure=reason, stats=stats, metadata=meta)

    trees = _insert_all(live, options, records)
    spliced_later = filters.spliced_sources(live)

    included: list[TreeBuilder] = []
    auxiliary: list[TrajectoryForest] = []
    for tree in trees:
        include = tree.kind == "main" or (
            tree.kind == "subagent" and (options.keep_subagent_trees or not options.set_aside_subagents)
        )
        dead = filters.dead_leaf_calls(tree, spliced_later) if options.drop_dead_leaves else []
        for call_index in dead:
            records[call_index]["dead_leaf"] = True
            removed.append({"call_index": call_index, "filter": "dead_leaf", "reason": "retry not continued"})
        if include:
            included.append(tree)
            stats.dead_leaves_removed += len(dead)
            continue
        reason = tree.kind
        if tree.kind == "compaction":
            stats.compaction_calls_set_aside += len(tree.call_paths)
            stats.compaction_trees += 1
        else:
            stats.subagent_calls_set_aside += len(tree.call_paths)
            stats.subagent_trees += 1
        for call_index in tree.call_paths:
            removed.append({"call_index": call_index, "filter": reason, "reason": f"set aside as {reason}"})
        aux = _assemble([tree], [dead], {**base, "reward": None}, ForestStats(calls=len(tree.call_paths)))
        aux.stats.dead_leaves_removed = len(dead)
        aux.metadata["auxiliary_reason"] = reason
        aux.metadata["calls"] = [records[c] for c in sorted(tree.call_paths)]
        auxiliary.append(aux)
    stats.subagent_trees += sum(t.kind == "subagent" for t in included)

    dead_per_tree = [[c for c in t.call_paths if records[c].get("dead_leaf")] for t in included]
    forest = _assemble(included, dead_per_tree, {**base, "reward": reward}, stats)
    forest.auxiliary = auxiliary
    forest.metadata.update(calls=[records[i] for i in sorted(records)], filtered=removed)
    if filters.is_overforked(forest.num_branches, options.max_leaves):
        forest.status, forest.failure = (
            "failed",
            f"overfork: {forest.num_branches} leaves > max_leaves {options.max_leaves}",
        )
        stats.dropped_overfork = 1
    if failure is not None:
        forest.status, forest.failure, forest.reward = "failed", failure, None
        stats.failed_rollouts = 1
    return forest


def _count_prefix_checks(
    live: list[PreparedCall], records: dict[int, dict[str, Any]], stats: ForestStats, compaction_ratio: float
) -> None:
    """Per call: did its prompt extend the previous call of its agent? As the proxy recorded it, or checked here.

    Calls recorded without a check (older logs, other recorders) are compared with the previous live call
    of the same root, in call order, by the same rule the proxy applies.
    """
    latest: dict[Any, ModelCall] = {}
    for pc in live:
        call = pc.call
        check = call.prefix
        if check is None:
            previous = latest.get(pc.root_key)
            check = check_prefix(
                previous, call.prompt_ids, call.segments, first_of_rollout=not latest, compaction_ratio=compaction_ratio
            )
        latest[pc.root_key] = call
        records[pc.index]["prefix"] = check.model_dump()
        stats.rewritten_turns += call.rewritten_turns
        if check.extended:
            stats.prefix_extended += 1
        elif check.reason == "new_root":
            stats.new_roots += 1
        elif check.reason is not None:
            stats.prefix_breaks += 1
            name = f"breaks_{check.reason}"
            setattr(stats, name, getattr(stats, name) + 1)


def _validated(calls: list[ModelCall], rollout_id: str) -> list[ModelCall]:
    seen: set[int] = set()
    for call in calls:
        if call.rollout_id != rollout_id:
            raise ValueError(
                f"call #{call.call_index} belongs to rollout {call.rollout_id!r}, not {rollout_id!r}: "
                "pass only one rollout's calls (read_calls(path, rollout_id) filters a log)"
            )
        if call.call_index in seen:
            raise ValueError(
                f"rollout {rollout_id!r} has call_index {call.call_index} twice; each call needs its own index"
            )
        seen.add(call.call_index)
    return sorted(calls, key=lambda c: c.call_index)


def _insert_all(
    live: list[PreparedCall], options: ForestOptions, records: dict[int, dict[str, Any]]
) -> list[TreeBuilder]:
    """Route each call to the tree it extends (or open one) and insert it there, in call order."""
    main_key = filters.choose_main_root(live)
    trees: list[TreeBuilder] = []
    by_root: dict[RootKey, list[TreeBuilder]] = {}
    for pc in live:
        group = by_root.setdefault(pc.root_key, [])
        if not group:
            group.append(
                TreeBuilder(
                    kind="main" if pc.root_key == main_key and not any(t.kind == "main" for t in trees) else "subagent"
                )
            )
            trees.append(group[0])
        best_tree, lcp, matched = group[0], -1, np.zeros(0, np.int64)
        for tree in group:
            tree_lcp, tree_matched = tree.match(pc.ids)
            if tree_lcp > lcp:
                best_tree, lcp, matched = tree, tree_lcp, tree_matched
        if options.set_aside_compaction and filters.is_compaction_restart(pc, best_tree, lcp, options.compaction_ratio):
            best_tree, lcp, matched = TreeBuilder(kind="compaction"), 0, np.zeros(0, np.int64)
            group.append(best_tree)
            trees.append(best_tree)
        best_tree.insert(pc, lcp, matched)
        records[pc.index].update(role=best_tree.kind, tree=trees.index(best_tree), shared_prefix=lcp)
    return trees


def _assemble(
    trees: list[TreeBuilder], dead: list[list[int]], base: dict[str, Any], stats: ForestStats
) -> TrajectoryForest:
    """Concatenate trees (dropping dead-leaf nodes) into one forest's flat arrays."""
    parts: dict[str, list[np.ndarray]] = {name: [] for name in _ARRAY_FIELDS}
    offset = 0
    for tree, dead_calls in zip(trees, dead, strict=True):
        survivors = [c for c in tree.call_paths if c not in set(dead_calls)]
        keep = filters.keep_mask(tree, survivors)
        new_index = np.cumsum(keep) - 1 + offset
        for name in _ARRAY_FIELDS:
            col = tree.column(name)[keep]
            if name == "parents":
                col = np.where(col >= 0, new_index[np.maximum(col, 0)], -1)
            parts[name].append(col)
        offset += int(keep.sum())
    arrays = {
        name: (np.concatenate(p) if p else np.zeros(0, NODE_COLUMNS[name][0])).astype(NODE_COLUMNS[name][0], copy=False)
        for name, p in parts.items()
    }
    parents = arrays["parents"]
    child_count = np.bincount(parents[parents >= 0], minlength=parents.shape[0])
    leaves = np.flatnonzero(child_count == 0).astype(np.int64)
    stats.unique_tokens = int(parents.shape[0])
    stats.generated_tokens = int(arrays["generated"].sum())
    stats.leaves = int(leaves.shape[0])
    stats.branch_tokens = int((arrays["depth"][leaves] + 1).sum())
    stats.relocated_splice_tokens += sum(t.relocated_splice_tokens for t in trees)
    return TrajectoryForest(**base, **arrays, leaves=leaves, stats=stats)


def _call_record(pc: PreparedCall) -> dict[str, Any]:
    """What inspection shows per call."""
    call = pc.call
    return {
        "call_index": pc.index,
        "role": None,
        "dead_leaf": False,
        "prompt_tokens": pc.prompt_len,
        "generated_tokens": pc.generated_count,
        "finish_reason": call.finish_reason,
        "policy_version": call.policy_version,
        "error": call.error,
        "drift_events": call.drift_events,
        "rewritten_turns": call.rewritten_turns,
        "prefix": None,
        "timings": call.timings.model_dump(),
    }
