"""Host-side access to a sandbox's workspace folder, safe against what the agent may have left in it.

The agent controls every name in the workspace: a symlink may point at a host file, a FIFO blocks whoever
opens it, a setuid copy of a shell would keep its bit on host disk. So every open here goes through folder
fds with O_NOFOLLOW (a link is never followed), O_NONBLOCK (a FIFO never blocks) and a check that the
result is a regular file; `copy_workspace` copies only folders, regular files (without setuid/setgid/sticky
bits) and links that stay inside the copy, and counts what it skipped. The workspace itself is a tmpfs of
the sandbox's size where the host allows mounting one, so the kernel stops writes at the disk limit.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


class DownloadReport(BaseModel):
    """What `copy_workspace` copied, and what it refused (relative path -> why)."""

    files: int = 0
    links: int = 0
    skipped: dict[str, str] = Field(default_factory=dict)


# ------------------------------------------------------------------------------- the workspace mount
def mount_workspace(path: Path, size_mb: int) -> bool:
    """Mount a tmpfs of `size_mb` (nosuid, nodev) on `path`; False where this process may not mount."""
    options = f"size={size_mb}m,mode=0755".encode()
    return _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options) == 0


def unmount_workspace(path: Path) -> None:
    """Detach a workspace tmpfs (a no-op where none is mounted)."""
    _libc.umount2(os.fsencode(path), MNT_DETACH)


def is_full(path: Path, slack_bytes: int = 1 << 20) -> bool:
    """Whether the file system at `path` has (almost) no room left: the sign of a write stopped by the quota."""
    try:
        info = os.statvfs(path)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize <= slack_bytes


# ----------------------------------------------------------------------------- opens beneath a folder
def split_relative(rel: str) -> list[str]:
    return [p for p in rel.split("/") if p not in ("", ".")]


def open_dir_beneath(root: Path, parts: Sequence[str], create: bool) -> int:
    """An fd of root/parts, refusing any symlink on the way (a link could point at a host path)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise PermissionError(
                    f"{'/'.join(parts)}: {part!r} is a symlink or not a folder ({exc.strerror})"
                ) from None
            os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_regular(name: str, dir_fd: int, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """Open a regular file in `dir_fd` without following a link or blocking on a FIFO; else OSError."""
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{name!r} is not a regular file (a FIFO, socket or device); refused")
    return fd


def read_beneath(root: Path, rel: str) -> bytes:
    parts = split_relative(rel)
    if not parts:
        raise IsADirectoryError(f"{rel!r} is the workspace folder, not a file")
    dir_fd = open_dir_beneath(root, parts[:-1], create=False)
    try:
        fd = open_regular(parts[-1], dir_fd)
    except FileNotFoundError:
        raise FileNotFoundError(f"cannot read {rel!r} in the workspace: no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileNotFoundError(
                f"cannot read {rel!r} in the workspace: it is a link (symlinks are not followed)"
            ) from None
        raise OSError(
            f"cannot read {rel!r} in the workspace: {exc.strerror or exc} (links are not followed, "
            "only regular files are read)"
        ) from None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def write_beneath(root: Path, rel: str, data: bytes) -> None:
    """Write a regular file; whatever else stands at that name (a FIFO, a link, a socket) is replaced."""
    parts = split_relative(rel)
    if not parts:
        raise IsADirectoryError(f"{rel!r} is the workspace folder, not a file")
    dir_fd = open_dir_beneath(root, parts[:-1], create=True)
    try:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISREG(os.lstat(parts[-1], dir_fd=dir_fd).st_mode):
                os.unlink(parts[-1], dir_fd=dir_fd)  # a folder here raises IsADirectoryError: not ours to remove
        try:
            fd = open_regular(parts[-1], dir_fd, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError as exc:
            raise PermissionError(f"cannot write {rel!r} in the workspace: {exc.strerror or exc}") from None
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def list_beneath(root: Path, rel: str) -> list[str]:
    dir_fd = open_dir_beneath(root, split_relative(rel), create=False)
    found: list[str] = []
    try:
        for top, dirs, files, top_fd in os.fwalk(dir_fd=dir_fd):
            for name in files:
                found.append(posixpath.normpath(posixpath.join(top, name)))
            found.extend(
                posixpath.normpath(posixpath.join(top, d))
                for d in dirs
                if os.path.islink(os.path.join(f"/proc/self/fd/{top_fd}", d))
            )
    finally:
        os.close(dir_fd)
    return sorted(found)


# ------------------------------------------------------------------------------------------ download
def copy_workspace(source: Path, dest: Path, mount_path: str) -> DownloadReport:
    """Copy the workspace `source` to `dest`: folders, regular files (mode bits 0o777 only) and links that
    stay inside; FIFOs, sockets, devices and links out of the workspace are skipped and reported.

    `mount_path` is where the workspace is inside the sandbox: an absolute link under it stays inside.
    """
    report = DownloadReport()
    dest.mkdir(parents=True, exist_ok=True)
    root_fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for top, dirs, files, top_fd in os.fwalk(dir_fd=root_fd, follow_symlinks=False):
            for name in [*dirs, *files]:
                rel = posixpath.normpath(posixpath.join(top, name))
                target = dest / rel
                info = os.lstat(name, dir_fd=top_fd)
                if stat.S_ISDIR(info.st_mode):
                    target.mkdir(exist_ok=True)
                    os.chmod(target, (info.st_mode & 0o777) | 0o700)
                elif stat.S_ISREG(info.st_mode):
                    _copy_regular(name, top_fd, target, info.st_mode)
                    report.files += 1
                elif stat.S_ISLNK(info.st_mode):
                    link = os.readlink(name, dir_fd=top_fd)
                    inside = _link_inside(rel, link, mount_path)
                    if inside is None:
                        report.skipped[rel] = "link out of the workspace"
                    else:
                        target.symlink_to(inside)
                        report.links += 1
                else:
                    report.skipped[rel] = _kind(info.st_mode)
    finally:
        os.close(root_fd)
    _drop_links_leaving(dest, report)
    return report


def _copy_regular(name: str, dir_fd: int, target: Path, mode: int) -> None:
    fd = open_regular(name, dir_fd)
    with os.fdopen(fd, "rb") as src, open(target, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    os.chmod(target, mode & 0o777)  # never a setuid, setgid or sticky bit on host disk


def _link_inside(rel: str, link: str, mount_path: str) -> str | None:
    """The link, made relative, if it names something inside the workspace (as seen inside); else None."""
    if posixpath.isabs(link):
        normal = posixpath.normpath(link)
        if normal != mount_path and not normal.startswith(mount_path.rstrip("/") + "/"):
            return None
        link = posixpath.relpath(normal, posixpath.join(mount_path, posixpath.dirname(rel)))
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), link))
    return None if resolved == ".." or resolved.startswith("../") else link


def _drop_links_leaving(dest: Path, report: DownloadReport) -> None:
    """Links through other links may still resolve outside: check each kept one on the (static) copy."""
    real_dest = os.path.realpath(dest)
    for top, dirs, files in os.walk(dest):
        for name in [*dirs, *files]:
            path = os.path.join(top, name)
            if os.path.islink(path):
                real = os.path.realpath(path)
                if real != real_dest and not real.startswith(real_dest + "/"):
                    os.unlink(path)
                    report.links -= 1
                    report.skipped[os.path.relpath(path, dest)] = "link out of the workspace"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "unknown file type"


def disk_usage(root: Path) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def remove_tree(path: Path) -> None:
    """rm -rf that also copes with folders a sandboxed command made read-only."""

    def fix_and_retry(func: Any, target: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
        with contextlib.suppress(OSError):
            func(target)

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=fix_and_retry)
