"""Run a serving proxy as its own process (tests kill it with SIGKILL; also handy for poking at harnesses).

    python -m clawgym_env.proxy --run-dir RUN --port 0 --rollout r1 --engine tiny-qwen3
    python -m clawgym_env.proxy --run-dir RUN --port 0 --rollout r1 --script completions.json

Prints one JSON line {"origin", "unix_socket", "log", "routes": [{rollout_id, path_prefix, api_key}]}
once it listens, then serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
from pathlib import Path

from clawgym_env.interfaces import Policy, RolloutLimits


def build_policy(args: argparse.Namespace) -> Policy:
    """The policy this process serves, built by `make_policy` like every other entry point.

    The renderer uses the engine's own tokenizer and chat template (Qwen2.5's vocabulary differs from
    Qwen3's at the tool tags: rendering one model's prompt with another's tokenizer feeds it [PAD] ids).
    A scripted engine is a test double on the Qwen tokenizer: it shares that tokenizer with its renderer.
    """
    from clawgym_env.policies import make_policy

    if args.script:
        replies = itertools.cycle(json.loads(Path(args.script).read_text()))  # replayed in order, round and round
        return make_policy(engine="scripted", completions=lambda _prompt: next(replies), name=args.model_name)
    return make_policy(args.engine, name=args.model_name, seed=0)


async def _main(args: argparse.Namespace) -> None:
    from clawgym_env.proxy.server import ServingProxy

    proxy = ServingProxy(args.run_dir, port=args.port, unix_socket="auto" if args.unix_socket else None)
    policy = build_policy(args)
    await proxy.start()
    routes = [
        proxy.open_rollout(r, policy, RolloutLimits(max_new_tokens=args.max_new_tokens)).model_dump()
        for r in args.rollout
    ]
    info = {
        "origin": proxy.origin if args.port is not None else None,
        "unix_socket": str(proxy.endpoint.unix_socket) if proxy.endpoint.unix_socket else None,
        "log": str(proxy.log_path),
        "routes": routes,
    }
    print(json.dumps(info), flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await proxy.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m clawgym_env.proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--port", type=int, default=None, help="TCP port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--unix-socket", action="store_true", help="also listen on a Unix socket")
    parser.add_argument("--rollout", action="append", default=[], help="rollout id to open (repeatable)")
    parser.add_argument("--engine", default="tiny-qwen3", help="model zoo name or local model folder")
    parser.add_argument("--script", type=Path, help="JSON list of completions for a ScriptedTestEngine instead")
    parser.add_argument("--model-name", default="policy")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    if args.port is None and not args.unix_socket:
        parser.error("give --port and/or --unix-socket")
    try:
        asyncio.run(_main(args))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
