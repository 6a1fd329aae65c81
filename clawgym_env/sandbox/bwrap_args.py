"""What a local sandbox shows, as bubblewrap arguments: only what a harness needs, read-only.

Shown: the system folders (/usr, /etc, /opt ... minus the host's secrets: files under /etc that only root
may read are covered), the Python environment, the harness CLIs under <cache>/harnesses and the code a
harness runs inside (clawgym_env, harness_adapters, verifiers) read-only; private sized tmpfs for /tmp,
/root, /run and /dev/shm; the workspace read-write. Not shown: /home, /var, /srv, /mnt, /root's host
contents, the rest of the checkout (tests, suites, run folders), the suite and model caches, other
checkouts sharing the checkout's top folder, and the sandboxes' root. /proc is the sandbox's own, with
/proc/sys, /proc/sysrq-trigger and the other kernel knobs read-only and kernel memory views masked, as
Docker does. The arguments go to bwrap through a memfd (`--args`), so no host path shows in
/proc/1/cmdline inside.
"""

from __future__ import annotations

import os
import posixpath
import stat
import sys
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The namespaces and privileges of every sandbox: all namespaces new, root inside with no capabilities and
# no further user namespaces. The host check at start-up (host_setup) runs a sandbox with exactly these.
ISOLATION = ("--unshare-all", "--unshare-user", "--uid", "0", "--gid", "0", "--disable-userns", "--cap-drop", "ALL")
SYSTEM_FOLDERS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "nix")
PRIVATE_DIRS = ("/tmp", "/root", "/run")  # fresh sized tmpfs in every sandbox
CODE_SHOWN = ("clawgym_env", "harness_adapters", "verifiers")  # what harnesses run from the checkout
READ_ONLY_PROC = ("/proc/sys", "/proc/sysrq-trigger", "/proc/bus", "/proc/fs", "/proc/irq")
MASKED_PROC = (
    "/proc/kcore",
    "/proc/keys",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/latency_stats",
    "/proc/kallsyms",
    "/proc/kmsg",
)
INIT_INSIDE = "/run/clawgym/init"


def cache_dir() -> Path:
    return Path(os.environ.get("CLAWGYM_CACHE") or REPO / ".cache").resolve()


def shown_host_paths() -> list[Path]:
    """Host folders bound read-only at the same path: the Python environment, the harness CLIs and the
    checkout's code (not its tests, suites or run folders)."""
    candidates = [
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.executable).resolve().parent.parent,
        cache_dir() / "harnesses",
        *(REPO / name for name in CODE_SHOWN),
    ]
    shown: list[Path] = []
    for path in candidates:
        path = path.absolute()
        if path.is_dir() and path not in shown and not any(_is_under(str(path), str(s)) for s in shown):
            shown.append(path)
    return shown


def hidden_roots(extra: Iterable[Path]) -> list[Path]:
    """Host folders whose top folder is not shown at all: the checkout (and the checkout a worktree
    belongs to), the cache, and `extra` (the sandboxes' root, run folders)."""
    is_checkout = (REPO / "pyproject.toml").is_file() or (REPO / ".git").exists()  # not an installed package
    roots = [*([REPO] if is_checkout else []), cache_dir(), *extra]
    git = REPO / ".git"
    if git.is_file():  # a worktree: .git names <main checkout>/.git/worktrees/<name>
        text = git.read_text().strip()
        if text.startswith("gitdir:"):
            roots.append(Path(text.split(":", 1)[1].strip()).resolve().parents[2])
    return [Path(p).resolve() for p in roots]


def system_binds(hidden: Sequence[Path]) -> list[str]:
    """--ro-bind (or --symlink) for each system folder, except a top folder that holds a hidden one."""
    args: list[str] = []
    for name in SYSTEM_FOLDERS:
        path = "/" + name
        if not os.path.lexists(path) or any(_is_under(str(h), path) for h in hidden):
            continue
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args + [arg for path in root_only_in_etc() for arg in _mask(path)]


@lru_cache(maxsize=1)
def root_only_in_etc() -> tuple[str, ...]:
    """Files and folders under /etc that others may not read (/etc/shadow, private keys, sudoers ...)."""
    found: list[str] = []
    for top, dirs, files in os.walk("/etc"):
        for name in list(dirs):
            path = os.path.join(top, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISLNK(info.st_mode) and not info.st_mode & stat.S_IXOTH:
                found.append(path)
                dirs.remove(name)  # covered whole
        for name in files:
            path = os.path.join(top, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and not info.st_mode & stat.S_IROTH:
                found.append(path)
    return tuple(sorted(found))


def _mask(path: str) -> list[str]:
    return ["--tmpfs", path] if os.path.isdir(path) and not os.path.islink(path) else ["--ro-bind", "/dev/null", path]


def proc_args() -> list[str]:
    args = ["--proc", "/proc"]
    for path in READ_ONLY_PROC:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for path in MASKED_PROC:
        if os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    return args


def private_dirs(size_bytes: int) -> list[str]:
    args = ["--dev", "/dev", "--size", str(size_bytes), "--tmpfs", "/dev/shm"]
    for private in PRIVATE_DIRS:
        args += ["--size", str(size_bytes), "--tmpfs", private]
    return args


def args_memfd(args: Sequence[str]) -> int:
    """A memfd holding `args` NUL-separated, for `bwrap --args <fd>` (inheritable, positioned at 0)."""
    fd = os.memfd_create("clawgym-bwrap-args", 0)
    os.write(fd, b"".join(os.fsencode(a) + b"\0" for a in args))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _is_under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def is_under(path: str, parent: str) -> bool:
    """Whether `path` is `parent` or below it (both normalised absolute paths)."""
    return _is_under(posixpath.normpath(path), posixpath.normpath(parent))
