"""The trainer's micro-batch: a packed tree (clawgym_env.trajectory.packing) plus per-token targets.

`pack_forests` flattens forests so each unique token appears once, with depth position ids and an
ancestor-only attention mask; the logits that predict node t sit at `parent_index[t]`. On top of that
the trainer needs, per token: the advantage (and PPO's value target), the index of the token's rollout
in the step's batch (GRPO groups and sequence-level masking), and, when a batch is reused for several
updates, the log-probs and values from before the first update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from clawgym_env.trajectory import TrajectoryForest
from clawgym_env.trajectory.packing import PackedBatch, pack_forests


@dataclass
class TreeBatch:
    """One packed micro-batch; per-token tensors are [T] (T unique tokens)."""

    packed: PackedBatch
    rollout_index: torch.Tensor  # long: the token's rollout in the step's rollout list
    advantages: torch.Tensor  # float: 0 on context tokens
    returns: torch.Tensor  # float: PPO value targets (0 where unused)
    old_logprobs: torch.Tensor | None = None  # trainer log-probs before the update
    old_values: torch.Tensor | None = None  # critic values before the update (PPO)

    # ---- views of the packed tree, 1-D
    @property
    def input_ids(self) -> torch.Tensor:
        return self.packed.input_ids[0]

    @property
    def position_ids(self) -> torch.Tensor:
        return self.packed.position_ids[0]

    @property
    def parents(self) -> torch.Tensor:
        return self.packed.parent_index

    @property
    def loss_mask(self) -> torch.Tensor:
        return self.packed.loss_mask

    @property
    def rollout_logprobs(self) -> torch.Tensor:
        return self.packed.rollout_logprobs

    @property
    def num_tokens(self) -> int:
        return self.packed.num_tokens

    @property
    def num_loss_tokens(self) -> int:
        return int(self.packed.loss_mask.sum())

    @property
    def branch_tokens(self) -> int:
        return self.packed.branch_tokens

    def branches(self) -> list[np.ndarray]:
        """Packed node indexes of each root-to-leaf branch."""
        nodes = self.packed.branch_nodes.numpy()
        ptr = self.packed.branch_ptr.tolist()
        return [nodes[ptr[b] : ptr[b + 1]] for b in range(len(ptr) - 1)]

    def branch_rollouts(self) -> list[int]:
        """The step-level rollout index of each branch."""
        forest_to_rollout = self.rollout_index_of_forest()
        return [forest_to_rollout[int(f)] for f in self.packed.branch_forest.tolist()]

    def rollout_index_of_forest(self) -> list[int]:
        out = [0] * len(self.packed.rollout_ids)
        for f, r in zip(self.packed.forest_index.tolist(), self.rollout_index.tolist()):
            out[f] = r
        return out

    def model_inputs(self, model: torch.nn.Module) -> dict[str, object]:
        return self.packed.model_inputs(model)


def build_micro_batches(
    forests: Sequence[TrajectoryForest],
    rollout_indexes: Sequence[int],
    token_advantages: Sequence[np.ndarray],
    token_budget: int,
    token_returns: Sequence[np.ndarray] | None = None,
    *,
    share_context: bool = True,
) -> list[TreeBatch]:
    """Pack trainable forests into micro-batches of at most `token_budget` unique tokens.

    `token_advantages[k]` (and `token_returns[k]`) are per-token arrays over `forests[k]`'s nodes.
    Forests are matched back by rollout id, which must be unique in one call. `share_context` computes
    the common leading prompt of a group's rollouts once (exact: only untrained context is shared; see
    clawgym_env.trajectory.packing): for a group of 8 rollouts behind a 1.4k-token harness prompt it cuts
    the tokens of a step several-fold.
    """
    if not (len(forests) == len(rollout_indexes) == len(token_advantages)):
        raise ValueError(
            f"build_micro_batches: {len(forests)} forests, {len(rollout_indexes)} rollout indexes, "
            f"{len(token_advantages)} advantage arrays; pass one of each per forest"
        )
    by_id: dict[str, int] = {}
    for k, forest in enumerate(forests):
        if forest.rollout_id in by_id:
            raise ValueError(f"rollout id {forest.rollout_id!r} appears twice; rollout ids must be unique in a batch")
        if not forest.ok:
            raise ValueError(
                f"rollout {forest.rollout_id} is {forest.status}: leave failed rollouts out before packing"
            )
        by_id[forest.rollout_id] = k
    out = []
    for packed in pack_forests(list(forests), token_budget, share_context=share_context):
        ks = [by_id[rid] for rid in packed.rollout_ids]
        ridx = torch.tensor([rollout_indexes[k] for k in ks], dtype=torch.long)[packed.forest_index]
        adv = packed.gather([np.asarray(token_advantages[k], np.float32) for k in ks]).astype(np.float32)
        if token_returns is None:
            ret = np.zeros_like(adv)
        else:
            ret = packed.gather([np.asarray(token_returns[k], np.float32) for k in ks]).astype(np.float32)
        out.append(
            TreeBatch(
                packed=packed,
                rollout_index=ridx,
                advantages=torch.from_numpy(adv),
                returns=torch.from_numpy(ret),
            )
        )
    return out
