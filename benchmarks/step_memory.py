"""Memory of one training step, two settings side by side: the output head whole or in chunks
(`--compare head`), and glibc's default allocator against mapping large allocations on their own
(`--compare malloc`, the trainer's `mmap_threshold_mb`).

    .venv/bin/python -m benchmarks.step_memory --compare malloc      # Qwen2.5-Coder-0.5B, the main job's recipe
    .venv/bin/python -m benchmarks.step_memory --compare head
    .venv/bin/python -m benchmarks.step_memory --model tiny-qwen3 --rounds 1   # a smoke run

One packed forward and backward of the policy's log-probs and entropies (what a GRPO update does per
micro-batch), LoRA and gradient checkpointing as the main job trains, on synthetic harness-shaped rollouts
(`benchmarks.trainer_bench.make_rollouts`), the first micro-batch at the trainer's token budget, after one
no-grad forward (the log-probs the trainer records before it updates). Each measurement runs in a fresh
process (so one setting's freed memory cannot hide the other's peak), the two settings alternating for
`--rounds`; reported: the peak RSS the step adds over the loaded model (sampled every 10 ms), the RSS it
leaves behind, its wall time, and the ratios. The setting not compared is the trainer's default.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from benchmarks.headline import emit

# Per comparison: (label, head_chunk (0 = whole head), mmap_threshold_mb (0 = glibc's default)) of the
# baseline, then of the setting measured against it; None = the trainer's default.
COMPARISONS: dict[str, tuple[tuple[str, int | None, float | None], tuple[str, int | None, float | None]]] = {
    "head": (("whole head", 0, None), ("head in chunks", None, None)),
    "malloc": (("glibc default", None, 0.0), ("mapped from 1 MiB", None, 1.0)),
}


def child(model_name: str, rollouts: int, scale: int, head_chunk: int, mmap_threshold_mb: float) -> dict[str, float]:
    """One measurement, in this process: load, pack, then time and sample one forward + backward."""
    from trainers.process_memory import TreeSampler, map_large_allocations, tree_rss_mb

    map_large_allocations(mmap_threshold_mb)  # before anything large is allocated, as the trainer does
    import torch

    from benchmarks.trainer_bench import make_rollouts
    from clawgym_env.engines.models import load_policy_model
    from clawgym_env.trajectory.packing import pack_forests, tree_logprobs
    from trainers.core import OptimConfig
    from trainers.model import LoraSettings, apply_lora, enable_gradient_checkpointing

    torch.set_num_threads(2)
    model, _ = load_policy_model(model_name)
    model = apply_lora(model.train(), LoraSettings(enabled=True))
    enable_gradient_checkpointing(model)
    batch = make_rollouts(rollouts, int(model.config.vocab_size), scale)
    packed = pack_forests(batch.forests, token_budget=OptimConfig().token_budget, share_context=True)[0]  # the largest
    with torch.no_grad():  # touch every weight once (the mapped file), as the trainer's recorded log-probs do
        tree_logprobs(model, packed, head_chunk=head_chunk or None)
    base = tree_rss_mb()
    start = time.perf_counter()
    with TreeSampler(every_s=0.01) as sampler:
        out = tree_logprobs(model, packed, head_chunk=head_chunk or None)
        (out.logprobs.sum() + 0.01 * out.entropy.sum()).backward()
    seconds = time.perf_counter() - start
    del out
    return {
        "seconds": seconds,
        "peak_added_mb": sampler.peak_mb - base,
        "left_mb": tree_rss_mb() - base,
        "base_mb": base,
        "tokens": float(packed.num_tokens),
        "targets": float(int(packed.loss_mask.sum())),
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="malloc")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--scale", type=int, default=60, help="tokens per generation/tool result (about)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", nargs=2, type=float, help=argparse.SUPPRESS)  # internal: head_chunk, threshold
    args = parser.parse_args(argv)
    if args.child is not None:
        head_chunk, threshold = args.child
        print(json.dumps(child(args.model, args.rollouts, args.scale, int(head_chunk), threshold)))
        return {}
    from clawgym_env.trajectory.packing import HEAD_CHUNK
    from trainers.config import TrainConfig

    default_threshold = TrainConfig.model_fields["mmap_threshold_mb"].default
    settings = [
        (label, HEAD_CHUNK if chunk is None else chunk, default_threshold if mb is None else mb)
        for label, chunk, mb in COMPARISONS[args.compare]
    ]
    runs: list[list[dict[str, float]]] = [[], []]
    for _ in range(args.rounds):
        for i, (_, chunk, mb) in enumerate(settings):
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.step_memory",
                "--model",
                args.model,
                "--child",
                str(chunk),
                str(mb),
            ]
            cmd += ["--rollouts", str(args.rollouts), "--scale", str(args.scale)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[i].append(json.loads(out.stdout.strip().splitlines()[-1]))

    def median(i: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[i])

    first = runs[0][0]
    print(
        f"{args.model}, LoRA + gradient checkpointing, one packed forward + backward of {first['tokens']:.0f} "
        f"tokens with {first['targets']:.0f} targets; medians of {args.rounds} alternated rounds, a fresh process each"
    )
    print(f"{'setting':<48}{'peak added MB':>15}{'left MB':>10}{'seconds':>10}")
    for i, (label, chunk, mb) in enumerate(settings):
        detail = f"{label} (head_chunk={chunk or 'whole'}, mmap {mb:g} MiB)"
        print(
            f"{detail:<48}{median(i, 'peak_added_mb'):>15.0f}{median(i, 'left_mb'):>10.0f}{median(i, 'seconds'):>10.1f}"
        )
    result = {
        "memory_ratio": median(0, "peak_added_mb") / median(1, "peak_added_mb"),
        "time_ratio": median(1, "seconds") / median(0, "seconds"),
        "saved_mb": median(0, "peak_added_mb") - median(1, "peak_added_mb"),
    }
    print(
        f"{settings[0][0]} / {settings[1][0]} peak added: {result['memory_ratio']:.2f}x ({result['saved_mb']:.0f} MB less); "
        f"time {settings[1][0]} / {settings[0][0]}: {result['time_ratio']:.2f}x"
    )
    emit(
        f"step_memory_{args.compare}",
        result["memory_ratio"],
        f"{result['memory_ratio']:.2f}x less memory added by a step",
    )
    return result


if __name__ == "__main__":
    main()
