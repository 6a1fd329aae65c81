"""Run a serving proxy as its own process (tests kill it with SIGKILL; also handy for poking at harnesses).

    python -m clawgym_env.proxy --run-dir RUN --port 0 --rollout r1 --engine tiny-qwen3
    python -m clawgym_env.proxy --run-dir RUN --port 0 --rollout r1 --script completions.json

Prints one JSON line {"origin", "unix_socket", "log", "routes": [{rollout_id, path_prefix, api_key}]}
once it listens, then serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from clawgym_env.interfaces import Policy, RolloutLimits


def _policy(args: argparse.Namespace) -> Policy:
    from clawgym_env.engines.tokenizer import load_qwen_tokenizer
    from clawgym_env.proxy.renderers import ChatMLRenderer

    tokenizer = load_qwen_tokenizer()
    if args.script:
        from clawgym_env.engines.scripted import ScriptedTestEngine

        completions = json.loads(Path(args.script).read_text())
        engine = ScriptedTestEngine(tokenizer, lambda _prompt, it=iter(completions * 1000): next(it))
    else:
        from clawgym_env.engines.transformers_engine import TransformersEngine

        engine = TransformersEngine.from_pretrained(args.engine, seed=0)
    return Policy(engine=engine, renderer=ChatMLRenderer(tokenizer), name=args.model_name)


async def _main(args: argparse.Namespace) -> None:
    from clawgym_env.proxy.server import ServingProxy

    proxy = ServingProxy(args.run_dir, port=args.port, unix_socket="auto" if args.unix_socket else None)
    policy = _policy(args)
    await proxy.start()
    routes = [proxy.open_rollout(r, policy, RolloutLimits(max_new_tokens=args.max_new_tokens)).model_dump() for r in args.rollout]
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
