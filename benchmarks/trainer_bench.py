"""Trainer throughput: packed-tree training vs per-branch training on the same rollouts, side by side.

    .venv/bin/python -m benchmarks.trainer_bench                    # tiny-qwen3, harness-shaped forests
    .venv/bin/python -m benchmarks.trainer_bench --model smollm2-135m --rollouts 4
    .venv/bin/python -m benchmarks.trainer_bench --quick            # a smoke run

One full GRPO update (forward, backward, AdamW step) on one batch of rollouts, each mode starting from
the same weights; reported as unique tree tokens per second (the tokens the batch holds, each once)
and the ratio packed / per-branch. Rollouts are synthetic ModelCall logs rebuilt by the real
reconstruction, shaped like OpenClaw sessions (non-prefix calls and kept retries make branches that
share a long system prompt and tool history). The rollouts of one task start with the same prompt, as
through a harness, so a third mode packs with `optim.share_prompts` (the group's prompt once per
micro-batch). All modes train the same objective: the losses agree.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import numpy as np
import torch

from clawgym_env.trajectory.packing import leading_context
from trainers.branchwise import BranchwiseGRPO
from trainers.core import OptimConfig, Trainer
from trainers.grpo import GRPO, GRPOConfig
from trainers.rollout_batch import RolloutBatch
from trainers.synthetic_batches import synthetic_forest


def make_rollouts(n: int, vocab: int, scale: int, seed: int = 0) -> RolloutBatch:
    forests = []
    for i in range(n):
        f = synthetic_forest(
            seed * 1000 + i,
            vocab=vocab,
            rollout_id=f"r{i}",
            task_id=f"t{i % 2}",
            harness="OpenClaw",
            mode="openclaw_chat",
            turns=6,
            retry_prob=0.3,
            system_tokens=6 * scale,
            gen_tokens=(scale // 3, scale),
            tool_tokens=(scale // 2, 2 * scale),
        )
        f.reward = float(i % 3 == 0)
        forests.append(f)
    prompts: dict[str, np.ndarray] = {}
    for f in forests:  # one task, one harness prompt: overwrite each forest's leading context with its task's
        chain = leading_context(f)
        common = prompts.setdefault(f.task_id, f.tokens[chain].copy())
        n = min(len(chain), len(common))
        f.tokens = f.tokens.copy()
        f.tokens[chain[:n]] = common[:n]
    return RolloutBatch.from_forests(forests)


def time_update(
    model: torch.nn.Module, algorithm, batch: RolloutBatch, token_budget: int, repeats: int, share_prompts: bool = False
) -> tuple[float, dict]:
    best, metrics = float("inf"), {}
    for _ in range(repeats):
        optim = OptimConfig(lr=1e-5, token_budget=token_budget, share_prompts=share_prompts)
        trainer = Trainer(copy.deepcopy(model), algorithm, optim)
        start = time.perf_counter()
        metrics = trainer.update(batch)
        best = min(best, time.perf_counter() - start)
    return best, metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--scale", type=int, default=120, help="tokens per generation/tool result (about)")
    parser.add_argument("--token-budget", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args()
    if args.quick:
        args.rollouts, args.scale, args.repeats = 4, 40, 1
    torch.set_num_threads(args.threads)
    from clawgym_env.engines.models import load_policy_model

    model, _ = load_policy_model(args.model)
    model = model.to(args.device).train()
    vocab = int(model.config.vocab_size)
    batch = make_rollouts(args.rollouts, vocab, args.scale)
    config = GRPOConfig(normalize_std=False)
    packed_s, packed_m = time_update(model, GRPO(config), batch, args.token_budget, args.repeats)
    shared_s, shared_m = time_update(model, GRPO(config), batch, args.token_budget, args.repeats, share_prompts=True)
    branch_s, branch_m = time_update(model, BranchwiseGRPO(config), batch, args.token_budget, args.repeats)
    unique = packed_m["unique_tokens"]
    result = {
        "model": args.model,
        "device": args.device,
        "rollouts": args.rollouts,
        "unique_tokens": unique,
        "branch_tokens": packed_m["branch_tokens"],
        "trained_tokens": packed_m["trained_tokens"],
        "packed_s": packed_s,
        "per_branch_s": branch_s,
        "packed_unique_tok_per_s": unique / packed_s,
        "per_branch_unique_tok_per_s": unique / branch_s,
        "speedup": branch_s / packed_s,
        "token_ratio": packed_m["branch_tokens"] / unique,
        "loss_packed": packed_m["loss"],
        "loss_per_branch": branch_m["loss"],
        "shared_s": shared_s,
        "shared_packed_tokens": shared_m["unique_tokens"],
        "shared_unique_tok_per_s": unique / shared_s,
        "speedup_shared": branch_s / shared_s,
        "loss_shared": shared_m["loss"],
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"model {args.model} on {args.device}, {args.rollouts} rollouts, {int(unique)} unique tokens, "
        f"{int(result['branch_tokens'])} branch tokens ({result['token_ratio']:.2f}x), {int(result['trained_tokens'])} trained"
    )
    print(f"{'mode':<12}{'update s':>10}{'unique tok/s':>15}")
    print(f"{'packed':<12}{packed_s:>10.2f}{result['packed_unique_tok_per_s']:>15.0f}")
    print(
        f"{'+ shared':<12}{shared_s:>10.2f}{result['shared_unique_tok_per_s']:>15.0f}   "
        f"({int(shared_m['unique_tokens'])} packed tokens: the group prompt once per micro-batch)"
    )
    print(f"{'per-branch':<12}{branch_s:>10.2f}{result['per_branch_unique_tok_per_s']:>15.0f}")
    print(
        f"speedup packed / per-branch: {result['speedup']:.2f}x, with shared prompts {result['speedup_shared']:.2f}x   "
        f"(losses {result['loss_packed']:.6f}, {result['loss_shared']:.6f} vs {result['loss_per_branch']:.6f})"
    )


if __name__ == "__main__":
    main()
