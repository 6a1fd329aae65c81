"""The token trie one tree of a rollout is built in: growing numpy columns plus one path per inserted call.

Insertion finds the longest common prefix (LCP) of a call's token sequence with the tree by comparing it
against the token list of each current leaf's path: every node lies on some leaf's path, so the best of
those LCPs is the LCP with the whole trie. The comparison runs on whole list slices in C (no Python loop
over tokens, and no conversion of the repeated history to numpy: only a call's new suffix is converted),
so an append-only call costs one slice comparison with the previous leaf.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from clawgym_env.prefix import RootKey
from clawgym_env.prefix import root_key as prefix_root_key
from clawgym_env.records import ModelCall
from clawgym_env.trajectory.forest import SOURCE_CODE

GENERATED = SOURCE_CODE["generated"]
SPLICED = SOURCE_CODE["assistant_spliced"]
UNKNOWN = SOURCE_CODE["unknown"]

NODE_COLUMNS: dict[str, tuple[type, float | int]] = {
    # name: (dtype, fill value for a fresh row)
    "tokens": (np.int64, 0),
    "parents": (np.int64, -1),
    "generated": (np.bool_, False),
    "logprobs": (np.float32, np.nan),
    "policy_versions": (np.int32, -1),
    "call_index": (np.int32, -1),
    "source": (np.int8, UNKNOWN),
    "depth": (np.int64, 0),
}


@dataclass
class PreparedCall:
    """A ModelCall turned into the arrays insertion needs (done once per call)."""

    call: ModelCall
    ids: list[int]  # prompt ids + generated ids
    prompt_len: int
    logprobs: np.ndarray  # float32, one per generated id
    prompt_source: np.ndarray  # int8 SOURCE_CODE per prompt position
    root_key: RootKey  # identifies the leading system/tools/template segments (None: no segments)

    @property
    def index(self) -> int:
        return self.call.call_index

    @property
    def generated_count(self) -> int:
        return len(self.ids) - self.prompt_len

    @classmethod
    def from_call(cls, call: ModelCall) -> PreparedCall:
        prompt_len = len(call.prompt_ids)
        ids = call.prompt_ids + call.generated_ids
        source = np.full(prompt_len, UNKNOWN, np.int8)
        for seg in call.segments:
            if not 0 <= seg.start <= seg.end <= prompt_len:
                raise ValueError(
                    f"call {call.rollout_id}#{call.call_index}: segment {seg.kind} [{seg.start}, {seg.end}) lies outside "
                    f"its prompt of {prompt_len} ids; the recorder must give spans inside prompt_ids"
                )
            source[seg.start : seg.end] = SOURCE_CODE[seg.kind]
        return cls(
            call=call,
            ids=ids,
            prompt_len=prompt_len,
            logprobs=np.asarray(call.logprobs, np.float32),
            prompt_source=source,
            root_key=root_key(call),
        )


def root_key(call: ModelCall) -> RootKey:
    """What makes two calls the same agent: the ids of their leading system / tools / template segments.

    A subagent (or a side call such as a title generator) has another system prompt or tool set, so its
    key differs. Calls recorded without segments have key None and all count as one root. The key is
    (length, hash): a system prompt plus tool definitions can be 20k ids, hashed once per call.
    """
    return prefix_root_key(call.prompt_ids, call.segments)


def common_prefix_length(a: list[int], b: list[int], block: int = 512) -> int:
    """Length of the common prefix of two id lists: whole-slice comparisons, then one block scanned."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        if a[lo:hi] != b[lo:hi]:
            return next(i for i in range(lo, hi) if a[i] != b[i])
    return n


@dataclass
class TreeBuilder:
    """One tree (a root and everything inserted under it) of a rollout, built call by call."""

    kind: str  # "main" | "compaction" | "subagent"
    capacity: int = 1024
    size: int = 0
    cols: dict[str, np.ndarray] = field(default_factory=dict)
    leaf_paths: dict[int, tuple[list[int], np.ndarray]] = field(default_factory=dict)  # leaf -> (ids, nodes)
    call_paths: dict[int, np.ndarray] = field(default_factory=dict)  # call index -> its node path
    prompt_lens: dict[int, int] = field(default_factory=dict)
    longest: int = 0  # longest full sequence inserted so far
    relocated_splice_tokens: int = 0

    def __post_init__(self) -> None:
        self.cols = {name: np.full(self.capacity, fill, dtype) for name, (dtype, fill) in NODE_COLUMNS.items()}

    def match(self, ids: list[int]) -> tuple[int, np.ndarray]:
        """Longest common prefix of `ids` with this tree, and the node path of that prefix."""
        best, best_path = 0, np.zeros(0, np.int64)
        for leaf_ids, nodes in reversed(list(self.leaf_paths.values())):  # the newest leaf is the likeliest match
            if min(len(leaf_ids), len(ids)) <= best:
                continue
            lcp = common_prefix_length(leaf_ids, ids)
            if lcp > best:
                best, best_path = lcp, nodes
                if best == len(ids) or best == len(leaf_ids):
                    break  # nothing else can share more: this path ends at a leaf, or ids are used up
        return best, best_path[:best]

    def _grow(self, extra: int) -> None:
        need = self.size + extra
        if need <= self.capacity:
            return
        new_cap = max(need, 2 * self.capacity)
        for name, (dtype, fill) in NODE_COLUMNS.items():
            col = np.full(new_cap, fill, dtype)
            col[: self.size] = self.cols[name][: self.size]
            self.cols[name] = col
        self.capacity = new_cap

    def insert(self, pc: PreparedCall, lcp: int, matched: np.ndarray) -> np.ndarray:
        """Add `pc` under the prefix it shares with the tree; returns the call's node path."""
        ids, plen, n = pc.ids, pc.prompt_len, len(pc.ids)
        cols = self.cols
        # matched generated positions that landed on context nodes become generated by this call
        if lcp > plen:
            gen_nodes = matched[plen:lcp]
            fresh = ~cols["generated"][gen_nodes]
            if fresh.any():
                nodes = gen_nodes[fresh]
                offsets = np.flatnonzero(fresh)
                cols["generated"][nodes] = True
                cols["logprobs"][nodes] = pc.logprobs[offsets]
                cols["policy_versions"][nodes] = pc.call.policy_version
                cols["call_index"][nodes] = pc.index
                cols["source"][nodes] = GENERATED
        k = n - lcp
        if k:
            self._grow(k)
            start = self.size
            new = np.arange(start, start + k, dtype=np.int64)
            positions = np.arange(lcp, n)
            is_gen = positions >= plen
            cols["tokens"][new] = np.array(ids[lcp:], dtype=np.int64)
            cols["parents"][new] = new - 1
            cols["parents"][start] = matched[-1] if lcp else -1
            cols["generated"][new] = is_gen
            lp = np.full(k, np.nan, np.float32)
            lp[is_gen] = pc.logprobs[positions[is_gen] - plen]
            cols["logprobs"][new] = lp
            cols["policy_versions"][new] = np.where(is_gen, pc.call.policy_version, -1)
            cols["call_index"][new] = pc.index
            src = np.full(k, GENERATED, np.int8)
            ctx = ~is_gen
            src[ctx] = pc.prompt_source[positions[ctx]]
            cols["source"][new] = src
            cols["depth"][new] = positions
            # an earlier generation spliced where it was not sampled: context here (it is trained where sampled)
            self.relocated_splice_tokens += int(np.count_nonzero(src == SPLICED))
            self.size += k
            path = np.concatenate((matched, new))
            if lcp:
                self.leaf_paths.pop(int(matched[-1]), None)
            self.leaf_paths[int(new[-1])] = (ids, path)
        else:
            path = matched
        self.call_paths[pc.index] = path
        self.prompt_lens[pc.index] = plen
        self.longest = max(self.longest, n)
        return path

    def column(self, name: str) -> np.ndarray:
        return self.cols[name][: self.size]
