"""The trainer's update in float32 against the same update under bfloat16 autocast (`optim.autocast`),
side by side.

    .venv/bin/python -m benchmarks.autocast_bench                     # Qwen2.5-Coder-0.5B, the main job's recipe
    .venv/bin/python -m benchmarks.autocast_bench --model tiny-qwen3 --rounds 1 --rollouts 4   # a smoke run

One GRPO update (forward, backward, AdamW step) with LoRA and gradient checkpointing as the main job trains,
on synthetic harness-shaped rollouts (`benchmarks.trainer_bench.make_rollouts`, shared prompts), each mode
from the same weights, the modes alternating for `--rounds`; reported: median update seconds, unique tokens
per second, the ratio, and how far the bfloat16 pass's target log-probs are from float32's (the price: on a
CPU without AMX or AVX512_BF16, bfloat16 matmuls fall back to slow kernels, so the ratio depends on the CPU;
the machine's flags are printed with it).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from benchmarks.headline import emit
from benchmarks.trainer_bench import make_rollouts
from trainers.core import OptimConfig, Trainer
from trainers.grpo import GRPO
from trainers.model import LoraSettings, apply_lora, enable_gradient_checkpointing

MODES = (None, "bfloat16")


def logprob_gap(model: torch.nn.Module, batch) -> tuple[float, float]:
    """Mean and max |log-prob difference| on the targets of the first micro-batch, bfloat16 vs float32."""
    from clawgym_env.trajectory.packing import pack_forests, tree_logprobs

    packed = pack_forests(batch.forests, token_budget=OptimConfig().token_budget, share_context=True)[0]
    with torch.no_grad():
        full = tree_logprobs(model, packed, with_entropy=False).logprobs
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = tree_logprobs(model, packed, with_entropy=False).logprobs
    gap = (full - half)[packed.loss_mask & (packed.parent_index >= 0)].abs()
    return float(gap.mean()), float(gap.max())


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--scale", type=int, default=30, help="tokens per generation/tool result (about)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    from clawgym_env.engines.models import load_policy_model
    from trainers.engine_choice import cpu_summary

    torch.set_num_threads(args.threads)
    base, _ = load_policy_model(args.model)
    base = apply_lora(base.train(), LoraSettings(enabled=True))
    enable_gradient_checkpointing(base)
    batch = make_rollouts(args.rollouts, int(base.config.vocab_size), args.scale)
    seconds: dict[str | None, list[float]] = {m: [] for m in MODES}
    tokens = 0.0
    for _ in range(args.rounds):
        for mode in MODES:
            trainer = Trainer(copy.deepcopy(base), GRPO(), OptimConfig(lr=1e-5, autocast=mode))
            start = time.perf_counter()
            metrics = trainer.update(batch)
            seconds[mode].append(time.perf_counter() - start)
            tokens = metrics["unique_tokens"]
            if not tokens:
                raise SystemExit("the batch's groups all scored alike, so nothing trained: use --rollouts 4 or more")
            del trainer
    mean_gap, max_gap = logprob_gap(base, batch)
    full, half = (statistics.median(seconds[m]) for m in MODES)
    print(
        f"{args.model}, LoRA + gradient checkpointing, one GRPO update of {tokens:.0f} unique tokens; medians of "
        f"{args.rounds} alternated rounds on {cpu_summary()}"
    )
    print(f"{'mode':<22}{'update s':>10}{'unique tok/s':>15}")
    for label, s in (("float32", full), ("bfloat16 autocast", half)):
        print(f"{label:<22}{s:>10.1f}{tokens / s:>15.0f}")
    result = {"speedup": full / half, "logprob_gap_mean": mean_gap, "logprob_gap_max": max_gap}
    print(
        f"float32 / autocast time: {result['speedup']:.2f}x; target log-probs bfloat16 vs float32: mean |diff| "
        f"{mean_gap:.4f}, max {max_gap:.3f}"
    )
    emit("autocast", result["speedup"], f"{result['speedup']:.2f}x faster update under bfloat16 autocast")
    return result


if __name__ == "__main__":
    main()
