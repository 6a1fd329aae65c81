"""Per-sandbox memory and process-count limits through a cgroup, where this process may create one.

rlimits alone cannot cap the memory of a whole process tree, and RLIMIT_NPROC does not bind a root user,
so the local backend puts each sandbox into its own cgroup when it can (cgroup v1 `memory` + `pids`
hierarchies, or a v2 cgroup whose parent delegates both controllers). Where it cannot, it falls back to
rlimits (see local.py) and says so in `LocalSandboxBackend.limit_mode`.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroups() -> dict[str, str]:
    """controller name ('' for the v2 unified hierarchy) -> this process's cgroup path."""
    result: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                result[controller] = path
    return result


class SandboxCgroup:
    """The cgroup folders of one sandbox; `join(pid)` puts a process (and its future children) into them."""

    def __init__(self, memory_dir: Path, pids_dir: Path, version: int) -> None:
        self.memory_dir = memory_dir
        self.pids_dir = pids_dir
        self.version = version

    @property
    def dirs(self) -> list[Path]:
        return list(dict.fromkeys([self.memory_dir, self.pids_dir]))

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    @classmethod
    def create(cls, name: str, memory_mb: int, max_processes: int) -> SandboxCgroup | None:
        """Make the cgroup with its limits, or return None where this process may not."""
        for version in (1, 2):
            dirs = cls._parents(version)
            if dirs is None:
                continue
            memory_dir, pids_dir = (parent / name for parent in dirs)
            group = cls(memory_dir, pids_dir, version)
            try:
                for d in group.dirs:
                    d.mkdir()
                group._set_limits(memory_mb, max_processes)
                return group
            except OSError:
                group.remove()
        return None

    @staticmethod
    def _parents(version: int) -> tuple[Path, Path] | None:
        own = _own_cgroups()
        if version == 1:
            if "memory" not in own or "pids" not in own:
                return None
            memory = CGROUP_ROOT / "memory" / own["memory"].lstrip("/")
            pids = CGROUP_ROOT / "pids" / own["pids"].lstrip("/")
            if not memory.is_dir() or not pids.is_dir():
                return None
            return (memory, pids) if os.access(memory, os.W_OK) and os.access(pids, os.W_OK) else None
        if "" not in own or not (CGROUP_ROOT / "cgroup.controllers").exists():
            return None
        parent = CGROUP_ROOT / own[""].lstrip("/")
        try:
            delegated = (parent / "cgroup.subtree_control").read_text().split()
        except OSError:
            return None
        if "memory" in delegated and "pids" in delegated and os.access(parent, os.W_OK):
            return parent, parent
        return None

    def _set_limits(self, memory_mb: int, max_processes: int) -> None:
        limit = str(memory_mb * 1024 * 1024)
        if self.version == 1:
            (self.memory_dir / "memory.limit_in_bytes").write_text(limit)
            with contextlib.suppress(OSError):  # only where swap accounting is on
                (self.memory_dir / "memory.memsw.limit_in_bytes").write_text(limit)
            (self.pids_dir / "pids.max").write_text(str(max_processes))
        else:
            (self.memory_dir / "memory.max").write_text(limit)
            with contextlib.suppress(OSError):
                (self.memory_dir / "memory.swap.max").write_text("0")
            (self.pids_dir / "pids.max").write_text(str(max_processes))

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding the memory limit so far."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        return _read_counter(self.memory_dir / name, "oom_kill")

    def fork_refusals(self) -> int:
        """How many forks the process-count limit refused so far."""
        return _read_counter(self.pids_dir / "pids.events", "max")

    def members(self) -> list[int]:
        """The pids still in the sandbox's cgroups (empty once every process of the sandbox is gone)."""
        pids: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
        return sorted(pids)

    def kill_all(self) -> None:
        """SIGKILL every process in the sandbox at once, rather than one after the other as the PID
        namespace unwinds once its first process is gone."""
        _kill_members(self.pids_dir)

    def remove(self) -> None:
        """Remove the folders. The kernel refuses while a killed process is still exiting (usually well
        under a millisecond), so retry, with waits growing from 0.25 ms to 20 ms, for up to ~1 s."""
        for d in self.dirs:
            wait = 0.00025
            for _ in range(60):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    _kill_members(d)
                    time.sleep(wait)
                    wait = min(wait * 2, 0.02)


def _read_counter(path: Path, key: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == key:
                return int(parts[1])
    return 0


def _kill_members(d: Path) -> None:
    with contextlib.suppress(OSError):
        for pid in (d / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), 9)
