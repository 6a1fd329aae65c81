"""What routing one call costs `VLLMServerPool` (the engine users train with), and whether a rollout's next
turn still finds the server holding its context when many rollouts are in flight.

    .venv/bin/python -m benchmarks.pool_routing                    # 2 servers, 8k-token sequences, 1,000 rollouts
    .venv/bin/python -m benchmarks.pool_routing --tokens 30000     # long-context agents

Every call through the pool asks which server served the longest recorded sequence (prompt + completion)
the new prompt extends: that server's prefix cache holds the rollout's context. Side by side in one process:
- `StickyRoutes` (the pool's now: a hash chain per 64-id block, one entry per rollout), and the list it
  replaced (the latest 256 sequences per server, each checked at its last 8 ids, then compared whole);
- the cost of one lookup with 2 x 256 recorded sequences of `--tokens` ids, for a rollout's next turn and
  for a new rollout's first call (which extends nothing);
- `--rollouts` rollouts taking 4 turns each on the servers: how many next turns found their server.
No server is started.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque
from collections.abc import Callable

from clawgym_env.engines.sticky_routes import StickyRoutes

TAIL = 8


class ListRoutes:
    """The routing it replaced (`VLLMServerPool._sticky` before): per server a list of the latest 256
    sequences, each checked at its last ids and then compared whole."""

    def __init__(self, servers: list[str], per_server: int = 256) -> None:
        self.recent = {s: deque(maxlen=per_server) for s in servers}

    def find(self, prompt: list[int]) -> str | None:
        best, best_len, n = None, 0, len(prompt)
        for server, seqs in self.recent.items():
            for seq in seqs:
                k = len(seq)
                if (
                    best_len < k <= n
                    and tuple(prompt[max(0, k - TAIL) : k]) == seq[-TAIL:]
                    and tuple(prompt[:k]) == seq
                ):
                    best, best_len = server, k
        return best

    def record(self, seq: list[int], server: str, match: object = None) -> None:
        """`match` is taken (and unused) so both routings record alike."""
        self.recent[server].append(tuple(seq))


def per_call_us(lookup: Callable[[list[int]], object], prompt: list[int], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        lookup(prompt)
    return 1e6 * (time.process_time() - start) / calls


def kept_on_server(servers: list[str], rollouts: int, use_list: bool, seed: int = 0) -> int:
    """Rollouts taking 4 turns in turn (prompt: a shared system prompt, then turns): next turns whose lookup
    found the server of their previous turn."""
    rng = random.Random(seed)
    routes = ListRoutes(servers) if use_list else StickyRoutes[str]()
    system = [rng.randrange(150_000) for _ in range(300)]
    prompts = [system + [rng.randrange(150_000) for _ in range(20)] for _ in range(rollouts)]
    owner: list[str | None] = [None] * rollouts
    served = dict.fromkeys(servers, 0)
    kept = 0
    for turn in range(4):
        for r in range(rollouts):
            if isinstance(routes, ListRoutes):
                server, match = routes.find(prompts[r]), None
            else:
                match = routes.find(prompts[r])
                server = match.found.server if match.found else None
            kept += turn > 0 and server is not None and server == owner[r]  # found, not a lucky fallback
            server = server or min(servers, key=served.__getitem__)
            served[server] += 1
            owner[r] = server
            seq = [*prompts[r], *(rng.randrange(150_000) for _ in range(30))]
            routes.record(seq, server, match)
            prompts[r] = [*seq, *(rng.randrange(150_000) for _ in range(15))]
    return kept


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8000, help="length of each recorded sequence")
    parser.add_argument("--system", type=int, default=2000, help="ids every sequence starts with")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rollouts", type=int, default=1000, help="rollouts in flight for the next-turn count")
    args = parser.parse_args(argv)
    rng = random.Random(0)
    servers = [f"server-{i}" for i in range(args.servers)]
    system = [rng.randrange(150_000) for _ in range(args.system)]
    old, new = ListRoutes(servers), StickyRoutes[str]()
    recorded = []
    for server in servers:
        for _ in range(256):
            seq = system + [rng.randrange(150_000) for _ in range(args.tokens - args.system)]
            old.record(seq, server)
            new.record(seq, server)
            recorded.append(seq)
    next_turn = [*recorded[-100], 13, 14, 15]
    new_rollout = system + [7] * (args.tokens - args.system)
    for name, prompt in (("next turn of a rollout", next_turn), ("first call of a new rollout", new_rollout)):
        found = new.find(prompt).found
        assert (found.server if found else None) == old.find(prompt)
        ours, theirs = per_call_us(new.find, prompt, args.calls), per_call_us(old.find, prompt, args.calls)
        print(
            f"{name:28s}: StickyRoutes {ours:6.0f} µs, the list it replaced {theirs:6.0f} µs per call "
            f"({args.servers} servers x 256 sequences x {args.tokens} ids)",
            flush=True,
        )
    turns = 3 * args.rollouts
    for label, use_list in (("StickyRoutes", False), ("the list it replaced", True)):
        kept = kept_on_server(servers, args.rollouts, use_list)
        print(
            f"{args.rollouts} rollouts x 4 turns, {label:20s}: {kept}/{turns} next turns found their server", flush=True
        )


if __name__ == "__main__":
    main()
