"""The local sandbox backend: one bubblewrap sandbox per rollout.

Each sandbox is one long-lived `bwrap` process whose child, the init (`sandbox_init.c` compiled by
native_init.py, or `sandbox_init.py` where no C compiler exists), holds the namespaces: its own PID, net,
IPC, UTS and user namespaces (loopback only), no capabilities, and a view of the host limited to what a
harness needs (bwrap_args.py says what is shown). The workspace is a host folder, a tmpfs of the task's
disk size where the host may mount one (so the kernel enforces the quota), bound at the task's mount path.
Commands are started by the init on request over a control socket (init_protocol.py); their
stdin/stdout/stderr are host pipes passed along with the request. When a proxy is given, the init relays
127.0.0.1:<relay_port> inside the sandbox to the proxy's Unix socket (handed to the init as an open file);
that relay is the only way out.

Before verification, `end_agent_processes()` kills everything the agent started (the sandbox's cgroup is
checked empty) and starts a fresh init with a new control socket over the same workspace, so nothing
the agent left running can touch the verifier's files or answer for it.

Modules: this one (the backend, its warm pool), local_sandbox.py (one sandbox), host_setup.py (start-up
checks), bwrap_args.py, init_protocol.py, host_files.py, reaper.py, cgroups.py. Host folders: <root>/<sandbox id>/workspace and <root>/<sandbox id>/sandbox.json (owner pid, bwrap pid,
cgroups) so that `reap_leftovers(root)` (reaper.py) can clean up after a crashed run. Host-side file access
(host_files.py) never follows a link and never blocks on a FIFO.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawgym_env.interfaces import ProxyEndpoint, SandboxLimits
from clawgym_env.sandbox import bwrap_args
from clawgym_env.sandbox.cgroups import SandboxCgroup
from clawgym_env.sandbox.host_files import remove_tree
from clawgym_env.sandbox.host_setup import (
    SandboxError,
    check_bubblewrap,
    choose_init,
    default_python,
    default_root,
    host_paths_needed_inside,
)
from clawgym_env.sandbox.init_protocol import MAX_REQUEST
from clawgym_env.sandbox.local_sandbox import LocalSandbox
from clawgym_env.sandbox.reaper import reap_leftovers
from clawgym_env.sandbox.workspace import materialize_workspace

if TYPE_CHECKING:
    from clawgym_env.specs import TaskSpec

__all__ = [
    "MAX_REQUEST",
    "LocalSandbox",
    "LocalSandboxBackend",
    "SandboxError",
    "check_bubblewrap",
    "default_python",
    "default_root",
    "host_paths_needed_inside",
    "reap_leftovers",
    "remove_tree",
]


# ------------------------------------------------------------------------------------------------ backend
class LocalSandboxBackend:
    """Makes bubblewrap sandboxes under `root`; see the module docstring for what each one isolates.

    Options: `root` (host folder of all sandbox dirs), `hidden_paths` (host paths to hide inside, e.g. run
    folders holding recorded calls), `ro_binds` ({host path: sandbox path}, e.g. a harness install),
    `limits` (defaults for every sandbox), `relay_port`, `env` (extra environment of every command),
    `python` (interpreter for the Python init), `use_cgroups`, `bwrap`, `pool_size` (sandboxes kept started
    ahead per mount path, limits and proxy: `create` then only seeds the workspace of a warm one, which
    hides the ~20-30 ms of bwrap + init + cgroup start-up; 0 = start each on demand), `init` ("auto": the
    C init, built once with the machine's C compiler, else the Python one with a logged warning; "c":
    the C init or SandboxUnavailable; "python"; default: $CLAWGYM_SANDBOX_INIT, else "auto").
    `init_kind` says which one runs.
    """

    name = "local"
    sandbox_class: type[LocalSandbox]  # set below the class; a benchmark may swap in a variant

    def __init__(
        self,
        root: Path | str | None = None,
        *,
        hidden_paths: Sequence[Path | str] = (),
        ro_binds: Mapping[str, str] | None = None,
        limits: SandboxLimits | Mapping[str, Any] | None = None,
        relay_port: int = 8080,
        env: Mapping[str, str] | None = None,
        python: str | None = None,
        use_cgroups: bool = True,
        bwrap: str = "bwrap",
        pool_size: int = 0,
        init: str | None = None,
    ) -> None:
        self.bwrap = bwrap
        self.python = python or default_python()
        check_bubblewrap(bwrap, self.python)
        self.root = Path(root or default_root()).absolute()
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.hidden_paths = [Path(p).absolute() for p in hidden_paths]
        self.ro_binds = {
            str(Path(k).absolute()): _absolute_inside(v, "ro_binds target") for k, v in (ro_binds or {}).items()
        }
        self.auto_binds = host_paths_needed_inside()
        self.hidden_roots = bwrap_args.hidden_roots([self.root, *self.hidden_paths])
        self.limits = limits if isinstance(limits, SandboxLimits) else SandboxLimits(**(limits or {}))
        self.relay_port = relay_port
        self.env = dict(env or {})
        self.use_cgroups = use_cgroups
        if pool_size < 0:
            raise ValueError(f"pool_size must be >= 0, got {pool_size}")
        self.pool_size = pool_size
        self.init_binary = choose_init(init or os.environ.get("CLAWGYM_SANDBOX_INIT") or "auto")
        self._sandboxes: set[LocalSandbox] = set()
        # Warm pool: sandboxes started ahead with an empty workspace, per (mount path, limits, proxy).
        self._pool: dict[tuple[str, str, str], list[LocalSandbox]] = {}
        self._refills: dict[tuple[str, str, str], asyncio.Task[None]] = {}

    @property
    def init_kind(self) -> str:
        """'c' (the compiled init) or 'python' (sandbox_init.py run by `python`)."""
        return "c" if self.init_binary is not None else "python"

    @property
    def limit_mode(self) -> str:
        """'cgroup' when memory and process limits bind the whole sandbox, else 'rlimit' (per process)."""
        if not self.use_cgroups:
            return "rlimit"
        probe = SandboxCgroup.create(f"clawgym-probe-{uuid.uuid4().hex[:8]}", 64, 16)
        if probe is None:
            return "rlimit"
        probe.remove()
        return "cgroup"

    async def create(
        self,
        task: TaskSpec,
        *,
        proxy: ProxyEndpoint | None = None,
        limits: SandboxLimits | None = None,
    ) -> LocalSandbox:
        """Seed a workspace, start the sandbox, and return once its relay (if any) is listening."""
        if proxy is not None and proxy.unix_socket is None:
            raise ValueError(
                "the local backend reaches the proxy only through its Unix socket; start the serving proxy with "
                "a unix_socket (ProxyEndpoint.unix_socket), since the sandbox has no network of its own"
            )
        limits = limits or self.limits
        warm = self._take_warm(task.mount_path, limits, proxy) if self.pool_size else None
        sandbox = warm or self._new_sandbox(task.mount_path, limits, proxy)
        try:
            # the workspace is a bound host folder, so a running (warm) sandbox sees it seeded too
            if task.workspace.function is not None or task.workspace.directory is not None:  # may be slow: off the loop
                await asyncio.to_thread(materialize_workspace, task.workspace, sandbox.workspace_dir)
            else:
                materialize_workspace(task.workspace, sandbox.workspace_dir)
            if warm is None:
                await sandbox.start()
            else:
                sandbox.restart_wall_clock()
        except BaseException:
            await sandbox.destroy()
            await sandbox.wait_removed()  # a failed create leaves nothing behind when it raises
            raise
        return sandbox

    def _new_sandbox(self, mount_path: str, limits: SandboxLimits, proxy: ProxyEndpoint | None) -> LocalSandbox:
        sandbox_id = f"sbx-{uuid.uuid4().hex[:12]}"
        host_dir = self.root / sandbox_id
        (host_dir / "workspace").mkdir(parents=True)
        sandbox = self.sandbox_class(self, sandbox_id, host_dir, mount_path, limits, proxy)
        self._sandboxes.add(sandbox)
        sandbox.prepare_workspace()  # before seeding: the tmpfs would hide what was written under it
        return sandbox

    # ------------------------------------------------------------------ warm pool
    @staticmethod
    def _pool_key(mount_path: str, limits: SandboxLimits, proxy: ProxyEndpoint | None) -> tuple[str, str, str]:
        return mount_path, limits.model_dump_json(), str(proxy.unix_socket) if proxy is not None else ""

    def _take_warm(self, mount_path: str, limits: SandboxLimits, proxy: ProxyEndpoint | None) -> LocalSandbox | None:
        """A started sandbox with an empty workspace, if one is ready; always tops the pool up again."""
        key = self._pool_key(mount_path, limits, proxy)
        ready = self._pool.setdefault(key, [])
        warm = None
        while ready and warm is None:
            candidate = ready.pop()
            if candidate.alive:
                warm = candidate
            else:  # died while waiting (e.g. killed from outside): clean it up, try the next
                asyncio.get_running_loop().create_task(candidate.destroy())
        running = self._refills.get(key)
        if running is None or running.done():
            self._refills[key] = asyncio.get_running_loop().create_task(self._refill(key, mount_path, limits, proxy))
        return warm

    async def _refill(
        self, key: tuple[str, str, str], mount_path: str, limits: SandboxLimits, proxy: ProxyEndpoint | None
    ) -> None:
        ready = self._pool[key]
        while len(ready) < self.pool_size:
            sandbox = self._new_sandbox(mount_path, limits, proxy)
            try:
                await sandbox.start()
            except Exception:  # noqa: BLE001 - the pool stays short; create() starts one on demand instead
                await sandbox.destroy()
                return
            ready.append(sandbox)

    @contextlib.asynccontextmanager
    async def sandbox(self, task: TaskSpec, **kwargs: Any):  # -> AsyncIterator[LocalSandbox]
        """`async with backend.sandbox(task) as sb:` destroys it whatever happens inside."""
        box = await self.create(task, **kwargs)
        try:
            yield box
        finally:
            await asyncio.shield(box.destroy())

    async def aclose(self) -> None:
        """Destroy every sandbox this backend made that is still alive (warm ones included)."""
        for task in self._refills.values():
            task.cancel()
        await asyncio.gather(*self._refills.values(), return_exceptions=True)
        self._refills.clear()
        self._pool.clear()
        await asyncio.gather(*(s.destroy() for s in list(self._sandboxes)), return_exceptions=True)
        await self.wait_removed()

    def forget(self, sandbox: LocalSandbox) -> None:
        """A sandbox whose removal finished: the backend no longer waits for it or destroys it at close."""
        self._sandboxes.discard(sandbox)

    async def wait_removed(self) -> None:
        """Wait until every destroyed sandbox's processes are reaped and its cgroup and folder removed."""
        await asyncio.gather(*(s.wait_removed() for s in list(self._sandboxes)), return_exceptions=True)

    async def settle(self) -> None:
        """Wait until the background work is done: warm-pool refills and removals of destroyed sandboxes."""
        await asyncio.gather(*self._refills.values(), return_exceptions=True)
        await self.wait_removed()

    async def __aenter__(self) -> LocalSandboxBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _absolute_inside(path: str, what: str) -> str:
    normal = posixpath.normpath(path)
    if not posixpath.isabs(normal) or normal == "/":
        raise ValueError(f"{what} {path!r} must be an absolute path inside the sandbox, below /")
    return normal


LocalSandboxBackend.sandbox_class = LocalSandbox
