"""The decisions reconstruction makes about which calls and branches can carry the rollout's reward.

Each filter has a switch in `specs.ForestOptions` and a count in `ForestStats`:

- failed calls (`ModelCall.error` set, or nothing generated): skipped, counted in `failed_calls`;
- subagents: a call whose root key (its leading system / tools / template segments) differs from the
  main root's is another agent (a subagent, or a side call such as Claude Code's title generator);
- the **main root** is the root key whose calls generated the most tokens (ties: the root of the earliest
  call); the **main tree** is the tree of the main root's first call and every call that extends it;
- context compaction: a call of a tree whose prompt, past the shared root, is shorter than
  `compaction_ratio` x the longest history already in that tree (so it cannot continue it) is a restart:
  it opens an auxiliary tree that the calls extending it join;
- retries: a generation that no later call continued (neither in place nor spliced into a later prompt)
  while a sibling generation from the same prompt was continued is a dead leaf: removed;
- over-forking: more surviving leaves than `max_leaves` drops the rollout (status "failed").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from clawgym_env.trajectory.trie import PreparedCall, RootKey, TreeBuilder


def is_failed_call(pc: PreparedCall) -> bool:
    """A call that produced nothing the harness saw: an error, or no generated token."""
    return pc.call.error is not None or pc.generated_count == 0


def choose_main_root(calls: Sequence[PreparedCall]) -> RootKey:
    """The root key whose calls generated the most tokens; ties go to the root of the earliest call."""
    generated: dict[RootKey, int] = defaultdict(int)
    first_seen: dict[RootKey, int] = {}
    for order, pc in enumerate(calls):
        generated[pc.root_key] += pc.generated_count
        first_seen.setdefault(pc.root_key, order)
    return max(generated, key=lambda key: (generated[key], -first_seen[key]))


def is_compaction_restart(pc: PreparedCall, tree: TreeBuilder, shared: int, ratio: float) -> bool:
    """The harness summarized its history and restarted: same root, but far shorter than the tree's longest.

    `shared` is the call's common prefix with the tree: a restart's prompt has new content (the summary),
    so it is not already in the tree (that would be a retry). Lengths are measured past the root (system
    prompt and tools), which both share and which can be most of a short history.
    """
    root = pc.root_key[0] if pc.root_key is not None else 0
    diverges = shared < pc.prompt_len
    return diverges and tree.longest > root and pc.prompt_len - root < ratio * (tree.longest - root)


def spliced_sources(calls: Iterable[PreparedCall]) -> dict[int, int]:
    """For each call index, the largest call index whose prompt splices its generation back in."""
    latest: dict[int, int] = {}
    for pc in calls:
        for seg in pc.call.spliced_spans:
            if seg.source_call is not None:
                latest[seg.source_call] = max(latest.get(seg.source_call, -1), pc.index)
    return latest


def dead_leaf_calls(tree: TreeBuilder, spliced_later: dict[int, int]) -> list[int]:
    """Calls of `tree` whose generation is a dead leaf (a retry that lost to a continued sibling)."""
    parents = tree.column("parents")
    child_count = np.bincount(parents[parents >= 0], minlength=tree.size)

    def continued(call_index: int) -> bool:
        end = int(tree.call_paths[call_index][-1])
        return bool(child_count[end] > 0) or spliced_later.get(call_index, -1) > call_index

    by_prompt: dict[int, list[int]] = defaultdict(list)
    for call_index, path in tree.call_paths.items():
        plen = tree.prompt_lens[call_index]
        by_prompt[int(path[plen - 1]) if plen else -1].append(call_index)
    dead: list[int] = []
    for siblings in by_prompt.values():
        if len(siblings) < 2:
            continue
        alive = {c: continued(c) for c in siblings}
        if any(alive.values()):
            dead.extend(c for c, ok in alive.items() if not ok)
    return sorted(dead)


def keep_mask(tree: TreeBuilder, surviving_calls: Iterable[int]) -> np.ndarray:
    """Nodes on the path of at least one surviving call (everything else was only a dead leaf)."""
    keep = np.zeros(tree.size, bool)
    for call_index in surviving_calls:
        keep[tree.call_paths[call_index]] = True
    return keep


def is_overforked(num_leaves: int, max_leaves: int) -> bool:
    return num_leaves > max_leaves
