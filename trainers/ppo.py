"""PPO on trajectory forests, top to bottom.

1. Keep the usable rollouts (status ok, finite reward, some tokens); count the others.
2. Pack them into micro-batches (each unique token once).
3. Critic: one packed forward per micro-batch gives V at every token (the value of the state in which
   the token is chosen).
4. Advantages: GAE along each root-to-leaf branch separately. Along a branch, the generated tokens are
   the actions in order (context tokens such as tool output are part of the next state, not actions);
   the branch's reward arrives at its last generated token. Sibling branches never exchange advantages.
   A token shared by several branches (the common history before a fork) gets the mean over the
   branches through it, each branch equally weighted, so it stays one loss term. Optionally whitened
   over the batch's unique trained tokens. A batch where every rollout scored the same moves only the
   critic (`skip_uniform_batches`): with sparse 0/1 rewards such batches are common, and whitening would
   turn the critic's errors into a full-size policy step.
5. Loss per micro-batch: the clipped-ratio policy loss with rollout correction (trainers.losses.policy_loss,
   the step GRPO and PPO share) + vf_coef * the clipped value loss, both unique-token means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from trainers.losses import LossParts, PolicyLossConfig, policy_loss
from trainers.rollout_batch import RolloutBatch
from trainers.tree_batch import TreeBatch, build_micro_batches
from trainers.tree_forward import Critic


class PPOConfig(PolicyLossConfig):
    name: Literal["ppo"] = "ppo"
    gamma: float = Field(default=1.0, ge=0, le=1, description="discount per generated token")
    lam: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="GAE lambda; 1.0 gives every token R - V(s): with one reward at a branch's end, a lambda of 0.95 "
        "leaves a token 100 steps earlier 0.95**100 = 0.6% of it until the critic has learned",
    )
    vf_coef: float = Field(default=0.5, ge=0, description="weight of the value loss")
    value_clip: float | None = Field(default=0.2, gt=0, description="PPO value clipping (null = off)")
    normalize_advantages: bool = Field(default=True, description="whiten advantages over the batch's trained tokens")
    train_critic_trunk: bool = Field(
        default=True,
        description="train the critic's transformer trunk (false: only its value head, on frozen features; ~2x cheaper)",
    )
    skip_uniform_batches: bool = Field(
        default=True,
        description="a batch whose rollouts all scored the same trains only the critic (policy advantages 0): "
        "whitened, its advantages would be the critic's errors blown up to unit scale",
    )


# ------------------------------------------------------------------------------ 4: GAE per branch
def discounted_reverse_cumsum(x: np.ndarray, discount: float) -> np.ndarray:
    """y[t] = x[t] + discount * y[t+1]."""
    out = np.zeros_like(x, dtype=np.float64)
    running = 0.0
    for t in range(x.shape[0] - 1, -1, -1):
        running = float(x[t]) + discount * running
        out[t] = running
    return out


def branch_gae(
    values: np.ndarray,
    action_nodes: np.ndarray,
    reward: float,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """GAE along one branch. `action_nodes`: the branch's generated tokens in order; returns (adv, returns).

    Rewards are 0 except `reward` at the last action; the value after the last action is 0 (terminal).
    """
    v = values[action_nodes].astype(np.float64)
    if v.size == 0:
        return np.zeros(0), np.zeros(0)
    next_v = np.append(v[1:], 0.0)
    rewards = np.zeros_like(v)
    rewards[-1] = reward
    delta = rewards + gamma * next_v - v
    adv = discounted_reverse_cumsum(delta, gamma * lam)
    return adv, adv + v


def tree_gae(
    values: np.ndarray,
    generated: np.ndarray,
    branches: Sequence[np.ndarray],
    branch_rewards: Sequence[float],
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-branch GAE on a packed tree, combined per token as the mean over the branches through it.

    values, generated: [T] (value of the state before each token; generated = is an action).
    Returns (advantages [T], returns [T], branch count [T]); context tokens get 0 and count 0.
    """
    if len(branches) != len(branch_rewards):
        raise ValueError(f"tree_gae: {len(branches)} branches but {len(branch_rewards)} rewards")
    adv_sum = np.zeros(values.shape[0])
    ret_sum = np.zeros(values.shape[0])
    count = np.zeros(values.shape[0], dtype=np.int64)
    for nodes, reward in zip(branches, branch_rewards):
        actions = nodes[generated[nodes]]
        adv, ret = branch_gae(values, actions, reward, gamma=gamma, lam=lam)
        np.add.at(adv_sum, actions, adv)
        np.add.at(ret_sum, actions, ret)
        np.add.at(count, actions, 1)
    safe = np.maximum(count, 1)
    return (adv_sum / safe).astype(np.float32), (ret_sum / safe).astype(np.float32), count


# ------------------------------------------------------------------------------ 1-4: usable rollouts, packing, values, advantages
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
    metrics.update(rollouts.reward_metrics())
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
                mb.advantages = torch.where(
                    mb.loss_mask, (mb.advantages - mean) / (std + 1e-6), torch.zeros_like(mb.advantages)
                )
    return micro_batches, metrics


# ------------------------------------------------------------------------------ 5: the algorithm for Trainer
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
        policy = policy_loss(trainer.model, mb, normalizer, self.config, trainer.ref_model)

        # the value loss: 0.5 * (V - R)^2, or PPO's clipped form max((V - R)^2, (V_clipped - R)^2)
        values = trainer.critic(mb)
        device = values.device
        mask = mb.loss_mask.to(device).float()
        returns = mb.returns.to(device)
        old_values = (mb.old_values.to(device) if mb.old_values is not None else values).detach()
        err = (values - returns) ** 2
        if self.config.value_clip is not None:
            clip = self.config.value_clip
            clipped_values = old_values + (values - old_values).clamp(-clip, clip)
            err = torch.maximum(err, (clipped_values - returns) ** 2)
        value_loss = 0.5 * (err * mask).sum() / normalizer

        with torch.no_grad():
            policy.sums.update(
                {
                    "value_loss": float((0.5 * err * mask).sum()),
                    "value_mean": float((values * mask).sum()),
                    "return_mean": float((returns * mask).sum()),
                }
            )
        return LossParts(loss=policy.loss + self.config.vf_coef * value_loss, sums=policy.sums)
