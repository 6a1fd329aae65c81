"""Packed tree batches: forests flattened so each unique token is computed once.

In a packed batch token t attends exactly to its ancestors (itself included), its position id is its depth
in its branch (so positions restart at each fork), and because it is a tree the next-token prediction of
t comes from the logits at its PARENT's position: `parent_index[t]`, not t - 1. With that, the packed
per-token log-probs equal those of running every branch on its own (tests/trajectory/test_packing.py).

Attention inputs, per transformers attention implementation:
- "sdpa": a 4-D bool mask [1, 1, T, T] (True = attend);
- "eager": the same as an additive float mask (0 / dtype min);
- "flex_attention": a BlockMask, only on devices where flex attention has a backward pass (not on CPU).
Several forests in one batch get a block-diagonal mask (no token sees another rollout), except with
`share_context=True`: then forests whose prompts start with the same context tokens (the rollouts of one
GRPO group all start with the harness's system prompt, tool list and the task) share those leading
context tokens, computed once. Only context (never generated) tokens before the first fork are shared,
so every trained token still belongs to exactly one rollout and its hidden state is unchanged (same
tokens, same positions, same ancestors). `token_source` maps each packed token back to its forest node.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.utils.checkpoint

from clawgym_env.trajectory.forest import TrajectoryForest

log = logging.getLogger(__name__)


@dataclass
class PackedBatch:
    """One or more forests as a single packed sequence of T unique tokens and B branches."""

    input_ids: torch.Tensor  # [1, T] long
    position_ids: torch.Tensor  # [1, T] long: depth in the branch
    parent_index: torch.Tensor  # [T] long: where the logits predicting token t are; -1 for a root
    loss_mask: torch.Tensor  # [T] bool: generated tokens (that have a parent)
    rollout_logprobs: torch.Tensor  # [T] float32: the engine's logprob; 0 where not generated
    policy_versions: torch.Tensor  # [T] int32: -1 for context
    forest_index: torch.Tensor  # [T] long: which forest of `rollout_ids` a token belongs to
    branch_ptr: torch.Tensor  # [B + 1] long: CSR offsets into branch_nodes
    branch_nodes: torch.Tensor  # [sum of branch lengths] long: each branch's tokens, root to leaf
    branch_forest: torch.Tensor  # [B] long: the forest of each branch
    token_branch: torch.Tensor  # [T] long: one branch holding each token (any; used for the mask)
    token_source: torch.Tensor | None = None  # [T] long: index into the forests' nodes concatenated in order
    rollout_ids: list[str] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def num_branches(self) -> int:
        return int(self.branch_ptr.shape[0] - 1)

    @property
    def branch_tokens(self) -> int:
        """Tokens per-branch training would compute: the sum of all branch lengths."""
        return int(self.branch_nodes.shape[0])

    def branch_membership(self) -> torch.Tensor:
        """[T, B] bool: token t lies on branch b."""
        member = torch.zeros(self.num_tokens, self.num_branches, dtype=torch.bool)
        lengths = self.branch_ptr[1:] - self.branch_ptr[:-1]
        member[self.branch_nodes, torch.repeat_interleave(torch.arange(self.num_branches), lengths)] = True
        return member

    def attention_mask(self, dtype: torch.dtype = torch.bool) -> torch.Tensor:
        """[1, 1, T, T] ancestor-only mask: bool (True = attend) or additive float of `dtype`.

        j is an ancestor-or-self of i iff j lies on a branch through i at a depth <= i's depth: a branch
        holds one node per depth, so this needs no walk up the tree.
        """
        member = self.branch_membership()
        depth = self.position_ids[0]
        allowed = member[:, self.token_branch].T & (depth[None, :] <= depth[:, None])
        if dtype == torch.bool:
            return allowed[None, None]
        additive = torch.zeros(allowed.shape, dtype=dtype)
        additive.masked_fill_(~allowed, torch.finfo(dtype).min)
        return additive[None, None]

    def flex_block_mask(self, device: torch.device | str):
        """A flex-attention BlockMask of the same ancestor relation.

        Refused on CPU: flex attention has no backward pass there; use the 4-D mask with "sdpa" instead.
        """
        device = torch.device(device)
        if device.type == "cpu":
            raise ValueError(
                "flex attention has no backward pass on CPU: use attn_implementation='sdpa' with attention_mask()"
            )
        from torch.nn.attention.flex_attention import create_block_mask

        member = self.branch_membership().to(device)
        token_branch = self.token_branch.to(device)
        depth = self.position_ids[0].to(device)

        def ancestor(b, h, q, kv):  # noqa: ANN001 - flex's mask_mod signature
            return member[kv, token_branch[q]] & (depth[kv] <= depth[q])

        return create_block_mask(ancestor, 1, None, self.num_tokens, self.num_tokens, device=device)

    def model_inputs(self, model: torch.nn.Module) -> dict[str, object]:
        """Keyword arguments for a transformers causal LM, with the mask its attention implementation needs."""
        impl = getattr(model.config, "_attn_implementation", "sdpa")
        device = next(model.parameters()).device
        if impl == "flex_attention":
            mask: object = self.flex_block_mask(device)
        elif impl == "eager":
            mask = self.attention_mask(next(model.parameters()).dtype).to(device)
        else:
            mask = self.attention_mask().to(device)
        return {
            "input_ids": self.input_ids.to(device),
            "position_ids": self.position_ids.to(device),
            "attention_mask": mask,
        }

    def gather(self, per_forest: Sequence[np.ndarray]) -> np.ndarray:
        """Per-node arrays of this batch's forests (in `rollout_ids` order) -> one value per packed token."""
        flat = np.concatenate([np.asarray(a) for a in per_forest]) if per_forest else np.zeros(0)
        if self.token_source is None:
            return flat
        return flat[self.token_source.numpy()]

    def unpack(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Per-token outputs [T, ...] -> one tensor per branch, root to leaf."""
        if values.shape[0] != self.num_tokens:
            raise ValueError(f"unpack needs one value per packed token ({self.num_tokens}), got {values.shape[0]}")
        nodes = self.branch_nodes.to(values.device)
        ptr = self.branch_ptr.tolist()
        return [values[nodes[ptr[b] : ptr[b + 1]]] for b in range(self.num_branches)]


def pack_forest(forest: TrajectoryForest) -> PackedBatch:
    """Pack one forest; it must be trainable (status "ok")."""
    if not forest.ok:
        raise ValueError(
            f"rollout {forest.rollout_id} is {forest.status} ({forest.failure}); only ok forests can be trained on"
        )
    return _pack([forest])


def pack_forests(
    forests: Sequence[TrajectoryForest], token_budget: int, *, share_context: bool = False
) -> list[PackedBatch]:
    """Bin-pack ok forests into batches of at most `token_budget` unique tokens (first-fit decreasing).

    Forests that are not ok are skipped. A forest alone larger than the budget cannot be split (its
    branches share attention) and gets a batch of its own (a warning is logged). With `share_context`,
    a forest costs only the tokens it does not share with the bin's leading context (see the module doc),
    and a bin whose first forest is larger than the budget still takes up to one budget more of such
    tokens: a harness whose system prompt alone is past the budget (OpenClaw's ~8k tokens against the
    default 4,096) would otherwise train every rollout of a group in a batch of its own, computing that
    prompt once per rollout instead of once per group (8x the tokens for a group of 8).
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    trainable = [f for f in forests if f.ok and f.num_tokens > 0]
    bins: list[list[TrajectoryForest]] = []
    bin_chains: list[list[np.ndarray]] = []  # leading context nodes of each forest in a bin
    sizes: list[int] = []
    limits: list[int] = []  # the budget; for a bin opened by a forest past it, that forest + one budget
    for forest in sorted(trainable, key=lambda f: f.num_tokens, reverse=True):
        chain = leading_context(forest) if share_context else np.zeros(0, np.int64)
        head = forest.tokens[chain]
        for i, used in enumerate(sizes):
            shared = max((_common_prefix(head, f.tokens[c]) for f, c in zip(bins[i], bin_chains[i])), default=0)
            if used + forest.num_tokens - shared <= limits[i] and (shared or used <= token_budget):
                bins[i].append(forest)
                bin_chains[i].append(chain)
                sizes[i] += forest.num_tokens - shared
                break
        else:
            bins.append([forest])
            bin_chains.append([chain])
            sizes.append(forest.num_tokens)
            oversized = share_context and forest.num_tokens > token_budget
            limits.append(forest.num_tokens + token_budget if oversized else token_budget)
    batches = [_pack(group, chains) for group, chains in zip(bins, bin_chains)]
    for batch in batches:
        if batch.num_tokens > token_budget:
            log.warning(
                "a batch of %d rollouts has %d tokens > token_budget %d (rollout %s alone is past it)",
                len(batch.rollout_ids),
                batch.num_tokens,
                token_budget,
                batch.rollout_ids[0],
            )
    return batches


def leading_context(forest: TrajectoryForest) -> np.ndarray:
    """Node indexes of the forest's leading context: from its single root down to the first fork or the
    first generated token (empty when the forest has several roots)."""
    roots = np.flatnonzero(forest.parents < 0)
    if roots.shape[0] != 1:
        return np.zeros(0, np.int64)
    has_parent = forest.parents >= 0
    num_children = np.bincount(forest.parents[has_parent], minlength=forest.num_tokens)
    a_child = np.full(forest.num_tokens, -1, np.int64)
    a_child[forest.parents[has_parent]] = np.flatnonzero(has_parent)
    chain, node = [], int(roots[0])
    while not forest.generated[node]:  # walks only the chain, not the whole forest
        chain.append(node)
        if num_children[node] != 1:
            break
        node = int(a_child[node])
    return np.asarray(chain, np.int64)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.shape[0], b.shape[0])
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.shape[0] else n


def _pack(forests: Sequence[TrajectoryForest], chains: Sequence[np.ndarray] | None = None) -> PackedBatch:
    """Pack `forests` into one batch; `chains[k]` (leading_context of forest k) is what it may share."""
    tokens, parents, depth, gen, lps, versions, forest_idx, source = [], [], [], [], [], [], [], []
    branch_lists: list[np.ndarray] = []
    branch_forest: list[int] = []
    trunks: list[tuple[np.ndarray, np.ndarray]] = []  # (leading context tokens, their packed indexes)
    offset = 0  # packed tokens so far
    node_offset = 0  # forest nodes so far (the index space of `token_source`)
    for k, forest in enumerate(forests):
        chain = chains[k] if chains is not None else np.zeros(0, np.int64)
        shared, shared_at = 0, np.zeros(0, np.int64)
        for trunk_tokens, trunk_index in trunks:
            n = _common_prefix(trunk_tokens, forest.tokens[chain])
            if n > shared:
                shared, shared_at = n, trunk_index[:n]
        own = np.ones(forest.num_tokens, bool)
        own[chain[:shared]] = False
        where = np.empty(forest.num_tokens, np.int64)  # packed index of each node
        where[chain[:shared]] = shared_at
        where[own] = offset + np.arange(int(own.sum()))
        if chain.shape[0]:
            trunks.append((forest.tokens[chain], where[chain]))
        tokens.append(forest.tokens[own])
        parents.append(np.where(forest.parents[own] >= 0, where[np.maximum(forest.parents[own], 0)], -1))
        depth.append(forest.depths()[own])
        gen.append((forest.generated & (forest.parents >= 0))[own])
        lps.append(np.where(forest.generated, forest.logprobs, 0.0).astype(np.float32)[own])
        versions.append(forest.policy_versions[own])
        forest_idx.append(np.full(int(own.sum()), k, np.int64))
        source.append(node_offset + np.flatnonzero(own))
        for branch in forest.branches():
            branch_lists.append(where[branch])
            branch_forest.append(k)
        offset += int(own.sum())
        node_offset += forest.num_tokens
    lengths = np.asarray([b.shape[0] for b in branch_lists], np.int64)
    branch_nodes = np.concatenate(branch_lists) if branch_lists else np.zeros(0, np.int64)
    token_branch = np.full(offset, -1, np.int64)
    # any branch through a token will do; later branches overwrite earlier ones
    token_branch[branch_nodes] = np.repeat(np.arange(len(branch_lists)), lengths)
    if (token_branch < 0).any():
        raise ValueError("a token lies on no root-to-leaf branch: the forest's leaves are inconsistent")
    as_t = torch.from_numpy
    return PackedBatch(
        input_ids=as_t(np.concatenate(tokens).astype(np.int64))[None],
        position_ids=as_t(np.concatenate(depth).astype(np.int64))[None],
        parent_index=as_t(np.concatenate(parents).astype(np.int64)),
        loss_mask=as_t(np.concatenate(gen)),
        rollout_logprobs=as_t(np.concatenate(lps)),
        policy_versions=as_t(np.concatenate(versions).astype(np.int32)),
        forest_index=as_t(np.concatenate(forest_idx)),
        branch_ptr=as_t(np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)),
        branch_nodes=as_t(branch_nodes.astype(np.int64)),
        branch_forest=as_t(np.asarray(branch_forest, np.int64)),
        token_branch=as_t(token_branch),
        token_source=as_t(np.concatenate(source).astype(np.int64)) if source else None,
        rollout_ids=[f.rollout_id for f in forests],
        rewards=[f.reward for f in forests],
    )


@dataclass
class TokenLogprobs:
    """Per-token results of a packed forward, [T]; 0 where a token is not a target (context, roots)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor


def token_logprobs_from_logits(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) and the entropy of each row of logits (float32 for a stable log-softmax)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


HEAD_CHUNK = 128
"""Targets per chunk of the output head in `tree_logprobs` (benchmarks/step_memory.py --compare head measures it)."""


def _hidden_rows(
    model: torch.nn.Module, inputs: dict[str, object], rows: torch.Tensor
) -> tuple[torch.nn.Module, torch.Tensor]:
    """The output head and the final hidden states at `rows`: the model's own forward with its head
    swapped for the identity for the call, so what comes back as logits are the rows the head would take."""
    head = model.get_output_embeddings()
    model.set_output_embeddings(torch.nn.Identity())
    try:
        return head, model(**inputs, logits_to_keep=rows, use_cache=False).logits[0]
    finally:
        model.set_output_embeddings(head)


def _head_logprobs(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return token_logprobs_from_logits(head(hidden), targets, temperature)


def tree_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    target_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
    head_chunk: int | None = HEAD_CHUNK,
) -> TokenLogprobs:
    """Log-probs (and entropies) of the target tokens of a packed tree, each given its ancestors.

    Targets default to `loss_mask` (the generated tokens); roots are never targets (nothing predicts
    them). The decoder runs once over all unique tokens; the output head runs only on the rows that
    predict a target (the parent of each, passed as transformers' `logits_to_keep`), which keeps the
    [targets x vocabulary] logits small: with a 151k vocabulary the full logits of a 4k-token tree
    would be 2.4 GB in float32. The model's own forward is called, so PEFT and FSDP wrappers see it.

    Even the targets' logits are large (each float32 copy 0.6 GB at 1,000 targets, and the log-softmax,
    the entropy's terms and their gradients add several), so with `head_chunk` the head runs
    `head_chunk` targets at a time, each chunk recomputed in backward (`torch.utils.checkpoint`): only one
    chunk's logits are alive at once. Same values and gradients (tests/trajectory/test_packing.py).
    Not under torch.distributed (FSDP gathers the head's weights only inside the model's forward).
    """
    target_mask = batch.loss_mask if target_mask is None else target_mask
    target_mask = target_mask & (batch.parent_index >= 0)
    inputs = batch.model_inputs(model)
    device = inputs["input_ids"].device  # type: ignore[union-attr]
    idx = target_mask.to(device).nonzero().squeeze(-1)
    rows, targets = batch.parent_index.to(device)[idx], batch.input_ids[0].to(device)[idx]
    softcap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)  # applied after the head
    if head_chunk is None or len(idx) <= head_chunk or softcap or torch.distributed.is_initialized():
        out = model(**inputs, logits_to_keep=rows, use_cache=False)
        logp_t, ent_t = token_logprobs_from_logits(out.logits[0], targets, temperature)
    else:
        head, hidden = _hidden_rows(model, inputs, rows)
        chunks = [
            torch.utils.checkpoint.checkpoint(_head_logprobs, head, h, t, temperature, use_reentrant=False)
            for h, t in zip(hidden.split(head_chunk), targets.split(head_chunk), strict=True)
        ]
        logp_t, ent_t = torch.cat([c[0] for c in chunks]), torch.cat([c[1] for c in chunks])
    logprobs = torch.zeros(batch.num_tokens, dtype=torch.float32, device=logp_t.device).index_put((idx,), logp_t)
    entropy = torch.zeros_like(logprobs)
    if with_entropy:
        entropy = entropy.index_put((idx,), ent_t)
    return TokenLogprobs(logprobs=logprobs, entropy=entropy)
