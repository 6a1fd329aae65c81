"""Trajectory-forest benchmark: reconstruction throughput, packed vs per-branch tokens and wall time.

    .venv/bin/python -m benchmarks.forest_bench            # full run (about 1-2 minutes on 2 CPU cores)
    .venv/bin/python -m benchmarks.forest_bench --quick    # smaller sizes, for a smoke test

(a) reconstruction: 64 rollouts of ~30k unique tokens shaped like Claude Code sessions (append-only,
    occasional retries); target > 1M unique tokens/s.
(b) tokens computed by packed tree training / tokens computed by per-branch training, on harness-shaped
    rollouts (the physical limit of the saving is unique tokens / total branch tokens).
(c) forward+backward wall time, packed vs per-branch, for a 3,000-token shared prefix with 4 branches of
    500 tokens on a small Qwen3-architecture model (float32, sdpa); target >= 1.4x on CPU.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.headline import emit
from clawgym_env.records import ModelCall
from clawgym_env.specs import ForestOptions
from clawgym_env.trajectory.packing import pack_forest, tree_logprobs
from clawgym_env.trajectory.reconstruct import build_forest
from clawgym_env.trajectory.synthetic_recordings import realistic_rollout, synthetic_rollout
from clawgym_env.trajectory.trie import PreparedCall


def bench_reconstruction(rollouts: int, tokens: int) -> dict[str, float]:
    data = [realistic_rollout(i, rollout_id=f"r{i}", total_tokens=tokens) for i in range(rollouts)]
    start = time.perf_counter()
    forests = [build_forest(r.calls, rollout_id=r.rollout_id) for r in data]
    seconds = time.perf_counter() - start
    unique = sum(f.num_tokens for f in forests)
    call_tokens = sum(r.total_call_tokens for r in data)
    # for scale: what parsing the same calls from JSON lines costs (not part of reconstruction)
    lines = [c.model_dump_json() for r in data[:4] for c in r.calls]
    t0 = time.perf_counter()
    parsed = [ModelCall.model_validate_json(line) for line in lines]
    parse_s = (time.perf_counter() - t0) * len(data) / 4
    t0 = time.perf_counter()
    for c in parsed:
        PreparedCall.from_call(c)
    prepare_s = (time.perf_counter() - t0) * len(data) / 4
    return {
        "rollouts": rollouts,
        "unique_tokens": unique,
        "call_tokens": call_tokens,
        "seconds": seconds,
        "unique_tokens_per_s": unique / seconds,
        "call_tokens_per_s": call_tokens / seconds,
        "json_parse_seconds_same_calls": parse_s,
        "of_which_list_to_numpy_seconds": prepare_s,
    }


def bench_token_ratio(rollouts: int) -> dict[str, dict[str, float]]:
    shapes = {
        "claude_code_like (append, retries 20%)": dict(mode="append", retry_prob=0.2),
        "claude_code_like, retries kept": dict(mode="append", retry_prob=0.2, keep=True),
        "openclaw_chat_like (trailing context)": dict(mode="openclaw_chat", retry_prob=0.2),
    }
    out = {}
    for name, shape in shapes.items():
        keep = shape.pop("keep", False)
        unique = branch = 0
        for seed in range(rollouts):
            r = synthetic_rollout(
                seed,
                turns=12,
                system_tokens=3000,
                tools_tokens=6000,
                gen_tokens=(100, 400),
                tool_tokens=(100, 600),
                **shape,
            )
            f = build_forest(r.calls, rollout_id="r0", options=ForestOptions(drop_dead_leaves=not keep, max_leaves=64))
            unique += f.stats.unique_tokens
            branch += f.stats.branch_tokens
        out[name] = {"unique_tokens": unique, "branch_tokens": branch, "packed_over_per_branch": unique / branch}
    return out


def tree_forest(prefix: int, branches: int, branch_len: int, vocab: int):
    """A forest with one shared prefix and `branches` generated continuations."""
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(100, vocab, (prefix,), generator=g).tolist()
    calls = []
    for b in range(branches):
        gen = torch.randint(100, vocab, (branch_len,), generator=g).tolist()
        calls.append(
            ModelCall(
                rollout_id="bench",
                call_index=b,
                api_style="openai-chat",
                request={},
                prompt_ids=shared,
                generated_ids=gen,
                logprobs=[-1.0] * branch_len,
            )
        )
    return build_forest(calls, rollout_id="bench", options=ForestOptions(max_leaves=branches))


def bench_training(prefix: int, branches: int, branch_len: int, repeats: int) -> dict[str, float]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    vocab = 32_000
    config = Qwen3Config(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        vocab_size=vocab,
        max_position_embeddings=8192,
        attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(config).float()
    batch = pack_forest(tree_forest(prefix, branches, branch_len, vocab))
    branch_ids = torch.stack([batch.input_ids[0, nodes] for nodes in batch.unpack(torch.arange(batch.num_tokens))])

    def packed_step() -> None:
        model.zero_grad(set_to_none=True)
        lp = tree_logprobs(model, batch, batch.parent_index >= 0).logprobs  # every row, like the per-branch layout
        lp[batch.loss_mask].sum().backward()

    def per_branch_step() -> None:  # the usual layout: every branch a full sequence, in one batch
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=branch_ids).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, branch_ids[:, 1:, None])[..., 0]
        lp[:, prefix - 1 :].sum().backward()

    # alternate the two (the CPU is shared: load changes over time) and keep each one's best run
    packed_step()
    per_branch_step()
    packed_runs, per_branch_runs = [], []
    for _ in range(repeats):
        for fn, runs in ((packed_step, packed_runs), (per_branch_step, per_branch_runs)):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
    packed_s, per_branch_s = min(packed_runs), min(per_branch_runs)
    return {
        "packed_tokens": batch.num_tokens,
        "per_branch_tokens": int(branch_ids.numel()),
        "packed_s": packed_s,
        "per_branch_s": per_branch_s,
        "speedup": per_branch_s / packed_s,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    q = args.quick
    results = {
        "a_reconstruction": bench_reconstruction(rollouts=8 if q else 64, tokens=30_000),
        "b_packed_over_per_branch_tokens": bench_token_ratio(rollouts=4 if q else 16),
        "c_train_step_cpu": bench_training(
            prefix=600 if q else 3000, branches=4, branch_len=100 if q else 500, repeats=1 if q else 3
        ),
    }
    a, c = results["a_reconstruction"], results["c_train_step_cpu"]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        report(results)
    rate = a["unique_tokens_per_s"] / 1e6
    emit("forest_reconstruction", rate, f"{rate:.1f} M unique tokens/s ({a['rollouts']} rollouts of 30k tokens)")
    emit("forest_packed", c["speedup"], f"packed {c['speedup']:.2f}x faster than per branch")


def report(results: dict) -> None:
    a, c = results["a_reconstruction"], results["c_train_step_cpu"]
    print(
        f"(a) reconstruction: {a['rollouts']} rollouts, {a['unique_tokens']:,} unique tokens "
        f"({a['call_tokens']:,} tokens across all calls) in {a['seconds']:.2f} s"
    )
    print(
        f"    {a['unique_tokens_per_s'] / 1e6:.2f} M unique tokens/s  (target > 1 M/s)   "
        f"{a['call_tokens_per_s'] / 1e6:.1f} M call tokens/s"
    )
    print(
        f"    for scale, JSON parsing of the same calls: {a['json_parse_seconds_same_calls']:.2f} s; "
        f"list->numpy inside reconstruction: {a['of_which_list_to_numpy_seconds']:.2f} s"
    )
    print("(b) tokens computed, packed / per-branch:")
    for name, row in results["b_packed_over_per_branch_tokens"].items():
        print(
            f"    {name:42s} {row['unique_tokens']:>9,} / {row['branch_tokens']:>9,} = {row['packed_over_per_branch']:.3f}"
        )
    print(
        f"(c) forward+backward on CPU ({c['threads']} threads), prefix + 4 branches: packed {c['packed_tokens']:,} tokens "
        f"{c['packed_s']:.2f} s vs per-branch {c['per_branch_tokens']:,} tokens {c['per_branch_s']:.2f} s "
        f"-> {c['speedup']:.2f}x (target >= 1.4x)"
    )


if __name__ == "__main__":
    main()
