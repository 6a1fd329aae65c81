"""Builds the C sandbox init (sandbox_init.c) once per machine, where a C compiler is available.

The C init starts in ~1 ms where the Python init (sandbox_init.py) pays ~15 ms of interpreter start-up,
which is most of what starting a sandbox costs beyond bubblewrap itself. The binary is cached under
`$CLAWGYM_INIT_CACHE` (default `$XDG_CACHE_HOME/clawgym`, else `~/.cache/clawgym`), named by a hash of the
source and compiler, so an edit rebuilds it and concurrent builders do not clash (build to a temporary
name, then rename). Without a compiler, or if the build fails, callers fall back to the Python init.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("sandbox_init.c")
COMPILERS = ("cc", "gcc", "clang")
FLAGS = ("-O2", "-Wall")
log = logging.getLogger(__name__)


def find_compiler() -> str | None:
    """$CC, else the first of cc, gcc, clang on PATH."""
    for name in filter(None, (os.environ.get("CC"), *COMPILERS)):
        found = shutil.which(name)
        if found:
            return found
    return None


def cache_dir() -> Path:
    if os.environ.get("CLAWGYM_INIT_CACHE"):
        return Path(os.environ["CLAWGYM_INIT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "clawgym"


def build_init(compiler: str | None = None, cache: Path | None = None) -> Path:
    """The compiled init binary (built now if not cached); raises RuntimeError saying why it cannot be built."""
    compiler = compiler or find_compiler()
    if compiler is None:
        raise RuntimeError(
            f"no C compiler found (tried $CC, {', '.join(COMPILERS)}); install one with `apt-get install -y gcc`"
        )
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(
        source + compiler.encode() + " ".join(FLAGS).encode() + os.uname().machine.encode()
    ).hexdigest()[:16]
    folder = cache or cache_dir()
    target = folder / f"sandbox-init-{digest}"
    if os.access(target, os.X_OK):
        _check_owned(target)
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, partial = tempfile.mkstemp(prefix=target.name + ".", dir=folder)
    except OSError as exc:
        raise RuntimeError(f"cannot write the C init to {folder}: {exc} (set $CLAWGYM_INIT_CACHE)") from exc
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *FLAGS, "-o", partial, str(SOURCE)], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} could not build {SOURCE.name}: {done.stderr.strip()[-2000:]}")
        os.chmod(partial, 0o755)
        os.replace(partial, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{compiler} could not build {SOURCE.name}: {exc}") from exc
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    log.info("built the C sandbox init at %s", target)
    return target


def _check_owned(path: Path) -> None:
    """The binary also runs on the host (it launches bwrap): refuse one that someone else could have put there."""
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise RuntimeError(f"{path} is not owned by this user or is writable by others; remove it to rebuild")
