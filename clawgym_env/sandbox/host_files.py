"""Host-side access to a sandbox's workspace folder, safe against what the agent may have left in it.

The agent controls every name in the workspace: a symlink may point at a host file, a FIFO blocks whoever
opens it, a setuid copy of a shell would keep its bit on host disk. So every open here goes through folder
fds with O_NOFOLLOW (a link is never followed), O_NONBLOCK (a FIFO never blocks) and a check that the
result is a regular file; `copy_workspace` copies only folders, regular files (without setuid/setgid/sticky
bits) and links that stay inside the copy, and counts what it skipped. The workspace itself is a tmpfs of
the sandbox's size where the host allows mounting one, so the kernel stops writes at the disk limit.

The copy is bounded too: by apparent size (a sparse file counts at its full length), names, folder depth and
links; what is over a limit is refused, never expanded, and hard links to one file are copied once and
linked again in the copy. Nothing here recurses (Python 3.11's os.fwalk and shutil.rmtree do: a
4,096-deep tree raises RecursionError), and `remove_tree` is `rm -rf`, to be run off the event loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import posixpath
import shutil
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from clawgym_env.interfaces import SandboxLimits

MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


# Bounds of one host copy (besides its size, by default the sandbox's `workspace_mb`).
MAX_ENTRIES = 100_000  # names made on the host: folders, files, links
MAX_DEPTH = 64  # folders below the workspace
MAX_LINKS = 10_000  # symlinks plus further names of a hard-linked file
MAX_PATH_CHARS = 2048  # a copied path relative to the copy (the host's PATH_MAX is 4096)
MAX_LISTED = 1000  # refused paths listed by name in `DownloadReport.skipped`; all are counted in `refused`
LINK_STEPS = 256  # path components walked to resolve one link of the copy that the kernel cannot
DEFAULT_MAX_BYTES = SandboxLimits().workspace_mb << 20


class DownloadReport(BaseModel):
    """What `copy_workspace` copied, and what it refused: `refused` counts every refusal by reason,
    `skipped` names the refused paths (relative path -> why; the first MAX_LISTED). A refused folder is one
    refusal: what is inside it is neither walked nor counted."""

    files: int = 0  # regular files copied (a hard-linked file once)
    links: int = 0  # symlinks kept
    hard_links: int = 0  # further names of a copied file, linked to it in the copy
    folders: int = 0
    bytes: int = 0  # apparent size (st_size) of the files copied
    skipped: dict[str, str] = Field(default_factory=dict)
    refused: dict[str, int] = Field(default_factory=dict)

    def refuse(self, rel: str, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1
        if len(self.skipped) < MAX_LISTED:
            self.skipped[rel] = why


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
def copy_workspace(
    source: Path,
    dest: Path,
    mount_path: str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_entries: int | None = None,
    max_depth: int | None = None,
    max_links: int | None = None,
) -> DownloadReport:
    """Copy the workspace `source` to `dest`: folders, regular files (mode bits 0o777 only) and links that
    stay inside; FIFOs, sockets, devices and links out of the workspace are skipped and reported.

    Bounded: files whose apparent sizes (st_size) would take the copy past `max_bytes`, names past
    `max_entries`, folders deeper than `max_depth` and links past `max_links` are refused (reported, not
    copied); a refused folder is not walked. A file with several names is copied once and its other names
    are hard links to that copy; runs of zeros (a sparse file's holes) stay holes. The walk is iterative
    and holds one fd (two with its listing) per folder level open.

    `mount_path` is where the workspace is inside the sandbox: an absolute link under it stays inside. The
    limits left out are this module's MAX_ENTRIES, MAX_DEPTH and MAX_LINKS.
    """
    max_entries = MAX_ENTRIES if max_entries is None else max_entries
    max_depth = MAX_DEPTH if max_depth is None else max_depth
    max_links = MAX_LINKS if max_links is None else max_links
    report = DownloadReport()
    dest.mkdir(parents=True, exist_ok=True)
    inodes: dict[tuple[int, int], str | None] = {}  # a hard-linked file: its copy (None: refused)
    kept_links: list[tuple[str, str]] = []
    entries = links = 0
    frames: list[tuple[int, Any, str, int]] = []  # (folder fd, its listing, relative path, depth)
    root_fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        frames.append((root_fd, os.scandir(root_fd), "", 0))
    except BaseException:
        os.close(root_fd)
        raise
    try:
        while frames:
            dir_fd, listing, top, depth = frames[-1]
            entry = next(listing, None)
            if entry is None:
                frames.pop()
                listing.close()
                os.close(dir_fd)
                continue
            name = entry.name
            rel = f"{top}/{name}" if top else name
            target = os.path.join(dest, rel)
            is_dir = entry.is_dir(follow_symlinks=False)
            if entries >= max_entries:
                report.refuse(rel, f"over the limit of {max_entries} names")
                continue
            if len(rel) > MAX_PATH_CHARS:
                report.refuse(rel, f"path longer than {MAX_PATH_CHARS} characters")
                continue
            if is_dir and depth + 1 > max_depth:
                report.refuse(rel, f"deeper than {max_depth} folders")
                continue
            try:
                info = os.lstat(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(info.st_mode):
                child_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                try:
                    os.makedirs(target, exist_ok=True)
                    os.chmod(target, (info.st_mode & 0o777) | 0o700)
                    child_listing = os.scandir(child_fd)
                except BaseException:
                    os.close(child_fd)
                    raise
                frames.append((child_fd, child_listing, rel, depth + 1))
                entries += 1
                report.folders += 1
            elif stat.S_ISREG(info.st_mode):
                key = (info.st_dev, info.st_ino)
                if info.st_nlink > 1 and key in inodes:
                    first = inodes[key]
                    if first is None:  # its first name was over the size budget
                        report.refuse(rel, _over_bytes(max_bytes))
                    elif links >= max_links:
                        report.refuse(rel, f"over the limit of {max_links} links")
                    else:
                        os.link(first, target)
                        links += 1
                        entries += 1
                        report.hard_links += 1
                    continue
                if report.bytes + info.st_size > max_bytes:
                    report.refuse(rel, _over_bytes(max_bytes))
                    if info.st_nlink > 1:
                        inodes[key] = None
                    continue
                report.bytes += _copy_regular(name, dir_fd, target, info.st_mode, info.st_size)
                report.files += 1
                entries += 1
                if info.st_nlink > 1:
                    inodes[key] = target
            elif stat.S_ISLNK(info.st_mode):
                link = os.readlink(name, dir_fd=dir_fd)
                inside = _link_inside(rel, link, mount_path)
                if inside is None:
                    report.refuse(rel, "link out of the workspace")
                elif links >= max_links:
                    report.refuse(rel, f"over the limit of {max_links} links")
                else:
                    os.symlink(inside, target)
                    kept_links.append((rel, target))
                    report.links += 1
                    links += 1
                    entries += 1
            else:
                report.refuse(rel, _kind(info.st_mode))
    finally:
        for dir_fd, listing, _, _ in frames:
            listing.close()
            os.close(dir_fd)
    _drop_links_leaving(dest, kept_links, report)
    return report


def _over_bytes(max_bytes: int) -> str:
    return f"over the size budget of {max_bytes} bytes (apparent size)"


ZEROS = bytes(1 << 20)


def _copy_regular(name: str, dir_fd: int, target: str, mode: int, size: int) -> int:
    """Copy at most `size` bytes (what was budgeted; the file cannot grow meanwhile, nothing runs inside),
    leaving runs of zeros as holes; returns the bytes copied."""
    fd = open_regular(name, dir_fd)
    copied = written = 0
    try:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            while copied < size:
                chunk = os.read(fd, min(len(ZEROS), size - copied))
                if not chunk:
                    break
                if chunk == (ZEROS if len(chunk) == len(ZEROS) else bytes(len(chunk))):  # memcmp
                    os.lseek(out, len(chunk), os.SEEK_CUR)  # a hole, not a run of zero blocks on host disk
                else:
                    _write_all(out, chunk)
                    written = copied + len(chunk)
                copied += len(chunk)
            if written < copied:  # ends in a hole
                os.ftruncate(out, copied)
            if mode & 0o7777 != 0o600:
                os.fchmod(out, mode & 0o777)  # never a setuid, setgid or sticky bit on host disk
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return copied


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _link_inside(rel: str, link: str, mount_path: str) -> str | None:
    """The link, made relative, if it names something inside the workspace (as seen inside); else None."""
    if posixpath.isabs(link):
        normal = posixpath.normpath(link)
        if normal != mount_path and not normal.startswith(mount_path.rstrip("/") + "/"):
            return None
        link = posixpath.relpath(normal, posixpath.join(mount_path, posixpath.dirname(rel)))
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), link))
    return None if resolved == ".." or resolved.startswith("../") else link


def _drop_links_leaving(dest: Path, kept: list[tuple[str, str]], report: DownloadReport) -> None:
    """Links through other links may still resolve outside: check each kept one on the (static) copy."""
    real_dest = os.path.realpath(dest)
    for rel, path in kept:
        if not _resolves_inside(real_dest, rel):
            os.unlink(path)
            report.links -= 1
            report.refuse(rel, "link out of the workspace")


def _resolves_inside(real_dest: str, rel: str) -> bool:
    """Whether the link at `rel` in the copy at `real_dest` resolves inside it: by the kernel (at most 40 links
    deep), or where it dangles, component by component as os.path.realpath would (which recurses once per
    link in 3.11), in at most LINK_STEPS steps; a link too deep for either counts as leaving."""
    try:
        fd = os.open(os.path.join(real_dest, rel), os.O_PATH | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        pass  # dangles (somewhere on the way): resolved below as realpath does
    except OSError:
        return False  # ELOOP: more than 40 links deep
    else:
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return real == real_dest or real.startswith(real_dest + "/")
    pending = list(reversed(rel.split("/")))
    resolved: list[str] = []
    for _ in range(LINK_STEPS):
        if not pending:
            return True
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                return False
            resolved.pop()
            continue
        here = os.path.join(real_dest, *resolved, part)
        try:
            target = os.readlink(here)
        except OSError:
            resolved.append(part)  # a folder, a file or nothing: taken as named
            continue
        if os.path.isabs(target):
            return False  # the copy makes only relative links
        pending.extend(reversed(target.split("/")))
    return False


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "unknown file type"


def disk_usage(root: Path) -> int:
    """Bytes on disk under `root` (iterative: os.walk recurses in 3.11; what lies past PATH_MAX is not seen)."""
    total, stack = 0, [os.fspath(root)]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
    return total


def remove_tree(path: Path) -> None:
    """rm -rf, of any depth, also of folders a sandboxed command made read-only; never raises.

    It blocks (a copy of 100,000 files takes seconds): call it off the event loop
    (`await asyncio.to_thread(remove_tree, path)`)."""
    path = Path(path)
    for attempt in ([], ["chmod", "-R", "u+rwx", "--", str(path)]):
        if not _lexists(path):
            return
        try:
            if attempt:  # a folder left without write or search permission (a root caller needs none)
                subprocess.run(attempt, stdin=subprocess.DEVNULL, capture_output=True, check=False)
            subprocess.run(["rm", "-rf", "--", str(path)], stdin=subprocess.DEVNULL, capture_output=True, check=False)
        except OSError:
            with contextlib.suppress(Exception):  # no rm here: a shallow tree still goes
                shutil.rmtree(path, ignore_errors=True)


def _lexists(path: Path) -> bool:
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True
