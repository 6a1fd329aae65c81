"""Memory of the output head in a training step: the whole head at once vs `head_chunk` targets at a time.

    .venv/bin/python -m benchmarks.head_memory                       # Qwen2.5-Coder-0.5B, the main job's recipe
    .venv/bin/python -m benchmarks.head_memory --model tiny-qwen3 --rounds 1   # a smoke run

One packed forward and backward of the policy's log-probs and entropies (what a GRPO update does per
micro-batch), LoRA and gradient checkpointing as the main job trains, on synthetic harness-shaped rollouts
(`benchmarks.trainer_bench.make_rollouts`), the first micro-batch at the trainer's token budget. Each measurement runs in a fresh process (so one mode's freed
memory cannot hide the other's peak), the two modes alternating for `--rounds`; reported: the peak RSS the
step adds over the loaded model (sampled every 10 ms), its wall time, and the ratios whole / chunked.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from benchmarks.headline import emit

WHOLE = 0  # head_chunk value meaning "the whole head at once"


def child(model_name: str, rollouts: int, scale: int, head_chunk: int) -> dict[str, float]:
    """One measurement, in this process: load, pack, then time and sample one forward + backward."""
    import torch

    from benchmarks.trainer_bench import make_rollouts
    from clawgym_env.engines.models import load_policy_model
    from clawgym_env.trajectory.packing import pack_forests, tree_logprobs
    from trainers.core import OptimConfig
    from trainers.model import LoraSettings, apply_lora, enable_gradient_checkpointing
    from trainers.process_memory import TreeSampler, tree_rss_mb

    torch.set_num_threads(2)
    model, _ = load_policy_model(model_name)
    model = apply_lora(model.train(), LoraSettings(enabled=True))
    enable_gradient_checkpointing(model)
    batch = make_rollouts(rollouts, int(model.config.vocab_size), scale)
    packed = pack_forests(batch.forests, token_budget=OptimConfig().token_budget, share_context=True)[0]  # the largest
    with torch.no_grad():  # touch every weight once (the mapped file), as the rollouts before an update do
        tree_logprobs(model, packed, head_chunk=None)
    base = tree_rss_mb()
    start = time.perf_counter()
    with TreeSampler(every_s=0.01) as sampler:
        out = tree_logprobs(model, packed, head_chunk=head_chunk or None)
        (out.logprobs.sum() + 0.01 * out.entropy.sum()).backward()
    return {
        "seconds": time.perf_counter() - start,
        "peak_added_mb": sampler.peak_mb - base,
        "base_mb": base,
        "tokens": float(packed.num_tokens),
        "targets": float(int(packed.loss_mask.sum())),
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--scale", type=int, default=60, help="tokens per generation/tool result (about)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # internal: one measurement
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.model, args.rollouts, args.scale, args.child)))
        return {}
    from clawgym_env.trajectory.packing import HEAD_CHUNK

    runs: dict[int, list[dict[str, float]]] = {WHOLE: [], HEAD_CHUNK: []}
    for _ in range(args.rounds):
        for mode in runs:
            cmd = [sys.executable, "-m", "benchmarks.head_memory", "--model", args.model, "--child", str(mode)]
            cmd += ["--rollouts", str(args.rollouts), "--scale", str(args.scale)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))

    def median(mode: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    first = runs[WHOLE][0]
    print(
        f"{args.model}, LoRA + gradient checkpointing, one packed forward + backward of {first['tokens']:.0f} "
        f"tokens with {first['targets']:.0f} targets; medians of {args.rounds} alternated rounds, a fresh process each"
    )
    print(f"{'head':<22}{'peak added MB':>15}{'seconds':>10}")
    for mode, label in ((WHOLE, "whole"), (HEAD_CHUNK, f"{HEAD_CHUNK} targets at a time")):
        print(f"{label:<22}{median(mode, 'peak_added_mb'):>15.0f}{median(mode, 'seconds'):>10.1f}")
    result = {
        "memory_ratio": median(WHOLE, "peak_added_mb") / median(HEAD_CHUNK, "peak_added_mb"),
        "time_ratio": median(HEAD_CHUNK, "seconds") / median(WHOLE, "seconds"),
        "saved_mb": median(WHOLE, "peak_added_mb") - median(HEAD_CHUNK, "peak_added_mb"),
    }
    print(
        f"whole / chunked peak added: {result['memory_ratio']:.2f}x ({result['saved_mb']:.0f} MB less); "
        f"chunked / whole time: {result['time_ratio']:.2f}x"
    )
    emit("head_memory", result["memory_ratio"], f"{result['memory_ratio']:.2f}x less memory added by a step")
    return result


if __name__ == "__main__":
    main()
