"""Style: `ruff check` (lint) and `ruff format --check` over every Python folder, with pyproject.toml's rules.

Marked `style` so a failure here reads as what it is: run `ruff format . && ruff check --fix .` (ruff is in
the dev extra that scripts/setup.sh installs) and fix what `ruff check` still reports by hand.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clawgym_env.layers import LAYERS

pytestmark = pytest.mark.style

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = [*LAYERS, "tests", "examples"]


def run_ruff(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        import ruff  # noqa: F401 - the package only ships the binary
    except ImportError:
        pytest.fail(
            "ruff is not installed: it is in the dev extra (`bash scripts/setup.sh` or `pip install -e '.[dev]'`)"
        )
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *FOLDERS], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_ruff_check_is_clean():
    result = run_ruff("check", "--no-cache", "--output-format", "concise")
    assert result.returncode == 0, (
        f"ruff check found problems (try `ruff check --fix .`):\n{result.stdout}{result.stderr}"
    )


def test_ruff_format_is_clean():
    result = run_ruff("format", "--check", "--no-cache")
    assert result.returncode == 0, f"files ruff would reformat (run `ruff format .`):\n{result.stdout}{result.stderr}"
