"""What the local backend needs from the host, checked once: bubblewrap with user namespaces, a Python for
the fallback init, the C init built where a compiler exists, and the folder that holds the sandboxes."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from clawgym_env.interfaces import SandboxUnavailable
from clawgym_env.sandbox import bwrap_args
from clawgym_env.sandbox.native_init import build_init

log = logging.getLogger(__name__)


class SandboxError(RuntimeError):
    """A sandbox failed to start, or was used after it was destroyed."""


def default_root() -> Path:
    return Path(tempfile.gettempdir()) / f"clawgym-sandboxes-{os.getuid()}"


def host_paths_needed_inside() -> list[Path]:
    """Host folders shown read-only inside (the Python environment, harness CLIs, the checkout's code)."""
    return bwrap_args.shown_host_paths()


def default_python() -> str:
    """An interpreter that stays visible inside the sandbox (not under /root or /tmp, which are private)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("python3")
    if found:
        return found
    raise SandboxUnavailable(
        "no python3 outside /root and /tmp for the sandbox init; install one with `apt-get install -y python3`"
    )


# ------------------------------------------------------------------------------------------- start-up check
_PROBED: dict[tuple[str, str], str | None] = {}


def check_bubblewrap(bwrap: str = "bwrap", python: str | None = None) -> None:
    """Raise SandboxUnavailable, saying how to fix it, if bubblewrap sandboxes cannot start here."""
    python = python or default_python()
    key = (bwrap, python)
    if key not in _PROBED:
        _PROBED[key] = _probe(bwrap, python)
    if _PROBED[key] is not None:
        raise SandboxUnavailable(_PROBED[key])


def _probe(bwrap: str, python: str) -> str | None:
    if shutil.which(bwrap) is None:
        return (
            f"bubblewrap ({bwrap!r}) is not installed; install it with `apt-get install -y bubblewrap` "
            "(Debian/Ubuntu) or `dnf install bubblewrap`, or pass backend_options={'bwrap': '/path/to/bwrap'}"
        )
    args = [
        bwrap,
        "--ro-bind",
        "/",
        "/",
        *bwrap_args.ISOLATION,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--die-with-parent",
        python,
        "-I",
        "-S",
        "-c",
        "import os; os.posix_spawn",
    ]  # the init spawns commands with it (3.8+)
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not start a test sandbox: {exc}"
    if done.returncode == 0:
        return None
    return (
        f"bubblewrap cannot create a sandbox here: {done.stderr.strip() or done.returncode}. It needs user and mount "
        "namespaces: enable them with `sysctl -w kernel.unprivileged_userns_clone=1` (Debian), "
        "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (Ubuntu 24.04+) or "
        "`sysctl -w user.max_user_namespaces=15000`; inside Docker run the container with "
        "`--security-opt seccomp=unconfined --security-opt apparmor=unconfined` (or --privileged). "
        f"Also check that {python} runs and is Python 3.8 or newer (pass backend_options={{'python': ...}} otherwise)."
    )


def choose_init(init: str) -> Path | None:
    """The C init binary for "auto"/"c", or None for the Python init."""
    if init not in ("auto", "c", "python"):
        raise ValueError(f"init must be 'auto', 'c' or 'python', got {init!r}")
    if init == "python":
        return None
    try:
        return build_init()
    except RuntimeError as exc:
        if init == "c":
            raise SandboxUnavailable(f"the C sandbox init is not available: {exc}") from None
        log.warning("using the Python sandbox init (each sandbox start ~15 ms slower): %s", exc)
        return None
