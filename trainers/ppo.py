"""PPO on trajectory forests, top to bottom.

1. Keep the usable rollouts (status ok, finite reward, some tokens); count the others.
2. Pack them into micro-batches (each unique token once).
3. Critic: one packed forward per micro-batch gives V at every token (the value of the state in which
   the token is chosen).
4. Advantages: GAE along each root-to-leaf branch separately (the branch's reward at its last generated
   token; context tokens are part of the state, not actions). Sibling branches never exchange
   advantages. A shared token's advantage and value target are the mean over the branches through it,
   so it stays one loss term (trainers.advantages.tree_gae). Optionally whitened over the batch's
   unique trained tokens. A batch where every rollout scored the same moves only the critic
   (`skip_uniform_batches`): with sparse 0/1 rewards such batches are common, and whitening would turn
   the critic's errors into a full-size policy step.
5. Loss per micro-batch: GRPO's clipped-ratio policy term with rollout correction
   (trainers.grpo.policy_micro_batch_loss) + vf_coef * clipped value loss, both unique-token means.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from trainers.advantages import tree_gae
from trainers.grpo import GRPOConfig, policy_micro_batch_loss, rollout_metrics
from trainers.losses import LossParts, value_loss
from trainers.rollouts import RolloutBatch
from trainers.tree_batch import TreeBatch, build_micro_batches
from trainers.tree_forward import Critic


class PPOConfig(GRPOConfig):
    gamma: float = Field(default=1.0, ge=0, le=1, description="discount per generated token")
    lam: float = Field(
        default=1.0, ge=0, le=1,
        description="GAE lambda; 1.0 gives every token R - V(s): with one reward at a branch's end, a lambda of 0.95 "
        "leaves a token 100 steps earlier 0.95**100 = 0.6% of it until the critic has learned",
    )
    vf_coef: float = Field(default=0.5, ge=0, description="weight of the value loss")
    value_clip: float | None = Field(default=0.2, gt=0, description="PPO value clipping (null = off)")
    normalize_advantages: bool = Field(default=True, description="whiten advantages over the batch's trained tokens")
    train_critic_trunk: bool = Field(
        default=True, description="train the critic's transformer trunk (false: only its value head, on frozen features; ~2x cheaper)"
    )
    skip_uniform_batches: bool = Field(
        default=True,
        description="a batch whose rollouts all scored the same trains only the critic (policy advantages 0): "
        "whitened, its advantages would be the critic's errors blown up to unit scale",
    )


def ppo_micro_batches(
    rollouts: RolloutBatch, critic: Critic, config: PPOConfig, token_budget: int, share_prompts: bool = True
) -> tuple[list[TreeBatch], dict[str, float]]:
    # 1. usable rollouts
    ok = np.array([s == "ok" and f.ok for s, f in zip(rollouts.statuses, rollouts.forests)], dtype=bool)
    finite = np.isfinite(rollouts.rewards)
    nonempty = np.array([f.num_tokens > 0 for f in rollouts.forests], dtype=bool)
    kept = np.flatnonzero(ok & finite & nonempty).tolist()
    metrics = {
        "rollouts": float(len(rollouts)),
        "rollouts_failed": float((~ok).sum()),
        "rollouts_nan_reward": float((ok & ~finite).sum()),
        "rollouts_trained": float(len(kept)),
    }
    metrics.update(rollout_metrics(rollouts))
    # 2. pack (advantages filled below)
    forests = [rollouts.forests[i] for i in kept]
    zeros = [np.zeros(f.num_tokens, np.float32) for f in forests]
    micro_batches = build_micro_batches(forests, kept, zeros, token_budget, share_context=share_prompts)
    # 3-4. critic values, then GAE per branch
    with torch.no_grad():
        for mb in micro_batches:
            values = critic(mb).detach().cpu()
            mb.old_values = values
            branch_rewards = [float(rollouts.rewards[r]) for r in mb.branch_rollouts()]
            adv, ret, _ = tree_gae(
                values.numpy(), mb.loss_mask.numpy(), mb.branches(), branch_rewards, gamma=config.gamma, lam=config.lam
            )
            mb.advantages = torch.from_numpy(adv)
            mb.returns = torch.from_numpy(ret)
    rewards = rollouts.rewards[kept]
    uniform = rewards.size > 0 and bool(np.all(rewards == rewards[0]))
    metrics["policy_skipped_uniform_reward"] = float(uniform and config.skip_uniform_batches)
    if uniform and config.skip_uniform_batches:
        for mb in micro_batches:
            mb.advantages = torch.zeros_like(mb.advantages)
    elif config.normalize_advantages and micro_batches:
        trained = torch.cat([mb.advantages[mb.loss_mask] for mb in micro_batches])
        if trained.numel() > 1:
            mean, std = trained.mean(), trained.std()
            for mb in micro_batches:
                mb.advantages = torch.where(mb.loss_mask, (mb.advantages - mean) / (std + 1e-6), torch.zeros_like(mb.advantages))
    return micro_batches, metrics


class PPO:
    name = "ppo"

    def __init__(self, config: PPOConfig | None = None) -> None:
        self.config = config or PPOConfig()

    def prepare(self, trainer, rollouts: RolloutBatch) -> tuple[list[TreeBatch], dict[str, float]]:  # noqa: ANN001
        if trainer.critic is None:
            raise ValueError("PPO needs a critic: pass critic=trainers.tree_forward.Critic(model_copy) to the Trainer")
        optim = trainer.optim_config
        return ppo_micro_batches(rollouts, trainer.critic, self.config, optim.token_budget, optim.share_prompts)

    def micro_batch_loss(self, trainer, mb: TreeBatch, normalizer: float) -> LossParts:  # noqa: ANN001
        parts = policy_micro_batch_loss(trainer.model, mb, normalizer, self.config, trainer.ref_model)
        values = trainer.critic(mb)
        device = values.device
        vparts = value_loss(
            values,
            mb.old_values.to(device) if mb.old_values is not None else values.detach(),
            mb.returns.to(device),
            mb.loss_mask.to(device),
            normalizer,
            clip=self.config.value_clip,
        )
        parts.sums.update(vparts.sums)
        return LossParts(loss=parts.loss + self.config.vf_coef * vparts.loss, sums=parts.sums)
