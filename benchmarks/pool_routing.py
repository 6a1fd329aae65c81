"""What routing one call costs `VLLMServerPool` (the engine users train with): its sticky-server lookup.

    .venv/bin/python -m benchmarks.pool_routing                    # 2 servers x 256 recorded 8k-token sequences
    .venv/bin/python -m benchmarks.pool_routing --tokens 30000     # long-context agents

Every call through the pool asks which server served the longest recorded sequence (prompt + completion)
the new prompt extends: that server's prefix cache holds the rollout's context. The pool keeps 256 such
sequences per server, each sharing the run's system prompt. This runs the pool's own `_sticky` and, side by
side in the same process, the whole comparison of every recorded sequence it replaced, on the same prompts
(a rollout's next turn, and a new rollout's first call that extends nothing). No server is started.
"""

from __future__ import annotations

import argparse
import random
import time

from clawgym_env.engines.vllm_server import VLLMServerPool


def compare_whole(pool: VLLMServerPool, prompt_ids: list[int]) -> object:
    """The lookup as it was: every recorded sequence compared whole with the prompt's start."""
    best, best_len = None, 0
    for slot in pool.slots:
        for seq in slot.recent:
            if best_len < len(seq) <= len(prompt_ids) and tuple(prompt_ids[: len(seq)]) == seq:
                best, best_len = slot, len(seq)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8000, help="length of each recorded sequence")
    parser.add_argument("--system", type=int, default=2000, help="ids every sequence starts with")
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args(argv)
    rng = random.Random(0)
    system = [rng.randrange(150_000) for _ in range(args.system)]
    pool = VLLMServerPool([f"http://127.0.0.1:{9 + i}" for i in range(args.servers)])  # nothing listens: none called
    try:
        for slot in pool.slots:
            for _ in range(slot.recent.maxlen or 0):
                slot.recent.append(tuple(system + [rng.randrange(150_000) for _ in range(args.tokens - args.system)]))
        next_turn = [*pool.slots[-1].recent[100], 13, 14, 15]
        new_rollout = system + [7] * (args.tokens - args.system)
        for name, prompt in (("next turn of a rollout", next_turn), ("first call of a new rollout", new_rollout)):
            assert pool._sticky(prompt) is compare_whole(pool, prompt)
            timings = {}
            for how, lookup in (("_sticky", pool._sticky), ("whole comparison", lambda p: compare_whole(pool, p))):
                start = time.process_time()
                for _ in range(args.calls):
                    lookup(prompt)
                timings[how] = (time.process_time() - start) / args.calls
            print(
                f"{name:28s}: _sticky {1e6 * timings['_sticky']:8.0f} µs, whole comparison "
                f"{1e6 * timings['whole comparison']:8.0f} µs per call ({timings['whole comparison'] / timings['_sticky']:.0f}x; "
                f"{args.servers} servers x {pool.slots[0].recent.maxlen} sequences x {args.tokens} ids)",
                flush=True,
            )
    finally:
        pool.close()


if __name__ == "__main__":
    main()
