"""Warm start: supervised fine-tuning on demonstrations recorded through the real harness.

A small model that never succeeds gives GRPO nothing to work with (every group degenerate). The
demonstrations are the suite's reference solutions (`metadata["reference"]["files"]`) played through
the harness by a scripted test engine (evaluation.ScriptedReferencePolicies: one write-tool
call per file, then a final message). The proxy records those calls like any others, so the forests
carry the exact token ids the harness saw; the loss is the negative log-likelihood of the generated
tokens only (tool results, system prompt and user text are context), each unique tree token once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel
from torch import nn

from clawgym_env.trajectory.packing import tree_logprobs
from trainers.rollout_batch import RolloutBatch
from trainers.tree_batch import build_micro_batches


class SFTReport(BaseModel):
    demonstrations: int
    successful: int
    tokens: int
    loss_per_epoch: list[float]


def demonstration_policies(tokenizer: Any = None) -> Any:
    """Per-task scripted policies that write the reference solution (a named test double of a model).

    `tokenizer`: the policy model's own tokenizer, so the recorded ids are in its vocabulary.
    """
    from evaluation import ScriptedReferencePolicies

    policies = ScriptedReferencePolicies("reference")
    if tokenizer is not None:
        from clawgym_env.chat import ChatMLRenderer

        policies.tokenizer = tokenizer
        policies.renderer = ChatMLRenderer(tokenizer)
    return policies


def collect_demonstrations(
    envs: Sequence[Any], tasks: Sequence[Sequence[Any]], per_task: int, tokenizer: Any = None
) -> RolloutBatch:
    """Play the reference solution of each task through each env's harness, `per_task` times."""
    policies = demonstration_policies(tokenizer)
    batches = []
    for env, env_tasks in zip(envs, tasks):
        jobs = [env.arollout(policies(task), task) for task in env_tasks for _ in range(per_task)]

        async def run_all(jobs: list = jobs) -> list:
            return list(await asyncio.gather(*jobs))

        results = env.runtime.run(run_all())
        batches.append(
            RolloutBatch(
                forests=[r.forest for r in results],
                rewards=np.array([r.reward for r in results]),
                statuses=[r.status for r in results],
                task_ids=[r.task_id for r in results],
                harnesses=[env.harness.name] * len(results),
            )
        )
    out = batches[0]
    for b in batches[1:]:
        out = out + b
    return out


def sft(
    model: nn.Module,
    demos: RolloutBatch,
    *,
    epochs: int = 3,
    lr: float = 1e-4,
    token_budget: int = 8192,
    min_reward: float = 1.0,
) -> SFTReport:
    """Fine-tune on the generated tokens of the successful demonstrations (reward >= min_reward)."""
    keep = [
        i
        for i, (f, s, r) in enumerate(zip(demos.forests, demos.statuses, demos.rewards))
        if s == "ok" and f.ok and np.isfinite(r) and r >= min_reward and f.num_tokens > 0
    ]
    forests = [demos.forests[i] for i in keep]
    ones = [f.generated.astype(np.float32) for f in forests]
    micro_batches = build_micro_batches(forests, keep, ones, token_budget)
    tokens = sum(mb.num_loss_tokens for mb in micro_batches)
    losses: list[float] = []
    if tokens:
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
        model.train()
        for _ in range(epochs):
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for mb in micro_batches:
                out = tree_logprobs(model, mb.packed, with_entropy=False)
                loss = -(out.logprobs * mb.loss_mask.to(out.logprobs.device).float()).sum() / tokens
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(total)
    return SFTReport(demonstrations=len(demos), successful=len(keep), tokens=tokens, loss_per_epoch=losses)
