"""A training loop of your own: ClawGym environments, your loop, one call to the GRPO loss.

    .venv/bin/python examples/custom_training_loop.py                # tiny model, white-box loop, 2 steps
    .venv/bin/python examples/custom_training_loop.py --env ClawGymBench-Pi --steps 5

Nothing here uses the bundled Trainer: `make_vec` runs a group of rollouts of one task, `grpo_loss`
turns their forests and rewards into a loss (advantages per Task–Harness group, packed trees, clipped
ratio, rollout correction), and the weights go back into the engine with `update_weights`.
"""

from __future__ import annotations

import argparse
import copy

import torch

import clawgym_env
from clawgym_env.chat import ChatMLRenderer
from clawgym_env.engines.models import load_policy_model
from clawgym_env.engines.transformers_engine import TransformersEngine
from trainers.grpo import GRPOConfig, grpo_loss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="ClawGymBench-WhiteBox")
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()

    model, tokenizer = load_policy_model(args.model)  # the copy we train
    engine = TransformersEngine(copy.deepcopy(model), tokenizer)  # the copy that samples rollouts
    policy = clawgym_env.Policy(engine=engine, renderer=ChatMLRenderer(tokenizer), name=args.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    venv = clawgym_env.make_vec(args.env, num_envs=args.group_size, max_new_tokens=256, max_calls=6)
    config = GRPOConfig()  # eps_low/eps_high, std normalisation, rollout correction (truncate at 2.0) ...

    for step in range(args.steps):
        venv.reset(seed=step)  # one task for the whole group (same_task=True)
        forests, rewards, terminated, truncated, info = venv.step(policy)
        model.train()
        loss, metrics = grpo_loss(model, forests, rewards, harnesses=[args.env] * len(forests), config=config)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        engine.update_weights(dict(model.named_parameters()), version=step + 1)
        print(
            f"step {step}: rewards {rewards.tolist()} failed {int(truncated.sum())} "
            f"degenerate groups {int(metrics['groups_degenerate'])} loss {metrics['loss']:.4f}"
        )
    venv.close()
    engine.close()


if __name__ == "__main__":
    main()
