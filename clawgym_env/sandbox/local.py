"""The local sandbox backend: one bubblewrap sandbox per rollout.

Each sandbox is one long-lived `bwrap` process whose child, the init (`sandbox_init.c` compiled by
native_init.py, or `sandbox_init.py` where no C compiler exists), holds the namespaces: its own PID, net,
IPC, UTS and user namespaces (loopback only), no capabilities, and a view of the host limited to what a
harness needs (bwrap_args.py says what is shown). The workspace is a host folder, a tmpfs of the task's
disk size where the host may mount one (so the kernel enforces the quota), bound at the task's mount path.
Commands are started by the init on request over a control socket (init_protocol.py); their
stdin/stdout/stderr are host pipes passed along with the request. When a proxy is given, the init relays
127.0.0.1:<relay_port> inside the sandbox to the proxy's Unix socket bound at /run/clawgym/proxy.sock;
that relay is the only way out.

Before verification, `end_agent_processes()` kills everything the agent started (the sandbox's cgroup is
checked empty) and starts a fresh init with a new control socket over the same workspace, so nothing
the agent left running can touch the verifier's files or answer for it.

Host folders: <root>/<sandbox id>/workspace and <root>/<sandbox id>/sandbox.json (owner pid, bwrap pid,
cgroups) so that `reap_leftovers(root)` (reaper.py) can clean up after a crashed run. Host-side file access
(host_files.py) never follows a link and never blocks on a FIFO.
"""

from __future__ import annotations

import array
import asyncio
import atexit
import contextlib
import itertools
import json
import logging
import os
import posixpath
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from clawgym_env.interfaces import ExecResult, ProxyEndpoint, SandboxLimits, SandboxUnavailable
from clawgym_env.sandbox import bwrap_args
from clawgym_env.sandbox.bwrap_args import INIT_INSIDE, PRIVATE_DIRS, PROXY_SOCKET_INSIDE, is_under
from clawgym_env.sandbox.cgroups import SandboxCgroup
from clawgym_env.sandbox.host_files import (
    DownloadReport,
    copy_workspace,
    disk_usage,
    is_full,
    list_beneath,
    mount_workspace,
    read_beneath,
    remove_tree,
    unmount_workspace,
    write_beneath,
)
from clawgym_env.sandbox.init_protocol import MAX_REQUEST, exec_request, kill_request, parse_reply
from clawgym_env.sandbox.native_init import build_init
from clawgym_env.sandbox.reaper import reap_leftovers
from clawgym_env.sandbox.workspace import materialize_workspace

if TYPE_CHECKING:
    from clawgym_env.specs import TaskSpec

__all__ = ["LocalSandbox", "LocalSandboxBackend", "SandboxError", "check_bubblewrap", "default_python",
           "default_root", "reap_leftovers", "remove_tree", "MAX_REQUEST"]

INIT_SOURCE = (Path(__file__).with_name("sandbox_init.py")).read_text()
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
READY_TIMEOUT_S = 20.0
OUTPUT_GRACE_S = 1.0  # after a command exits, how long to wait for stragglers still holding its stdout
DISK_CHECK_INTERVAL_S = 1.0  # only where no workspace tmpfs could be mounted (the kernel enforces it otherwise)
HOST_FILE_TIMEOUT_S = 60.0
EMPTY_CGROUP_TIMEOUT_S = 5.0
DISK_HINTS = ("File too large", "File size limit exceeded", "No space left on device")
MEMORY_HINTS = ("MemoryError", "Cannot allocate memory", "out of memory", "std::bad_alloc", "heap out of memory")
# The Python launcher (no C compiler): join the cgroups, then exec bwrap.
PY_LAUNCHER = "import os,sys\ni=sys.argv.index('--')\nfor p in sys.argv[1:i]:\n  open(p,'w').write('0')\nos.execvp(sys.argv[i+1],sys.argv[i+1:])"
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
    raise SandboxUnavailable("no python3 outside /root and /tmp for the sandbox init; install one with `apt-get install -y python3`")


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
    args = [bwrap, "--ro-bind", "/", "/", "--unshare-all", "--unshare-user", "--uid", "0", "--gid", "0",
            "--cap-drop", "ALL", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--die-with-parent",
            python, "-I", "-S", "-c", "import os; os.posix_spawn"]  # the init spawns commands with it (3.8+)
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


# ------------------------------------------------------------------------------------- process-exit cleanup
_LIVE: weakref.WeakSet[LocalSandbox] = weakref.WeakSet()


@atexit.register
def _destroy_all_at_exit() -> None:
    """Kill and remove every sandbox not yet removed, including those whose background removal was cut
    short when the event loop closed."""
    for sandbox in list(_LIVE):
        sandbox.destroy_now()


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
        self.ro_binds = {str(Path(k).absolute()): _absolute_inside(v, "ro_binds target") for k, v in (ro_binds or {}).items()}
        self.auto_binds = host_paths_needed_inside()
        self.hidden_roots = bwrap_args.hidden_roots([self.root, *self.hidden_paths])
        self.limits = limits if isinstance(limits, SandboxLimits) else SandboxLimits(**(limits or {}))
        self.relay_port = relay_port
        self.env = dict(env or {})
        self.use_cgroups = use_cgroups
        if pool_size < 0:
            raise ValueError(f"pool_size must be >= 0, got {pool_size}")
        self.pool_size = pool_size
        self.init_binary = _choose_init(init or os.environ.get("CLAWGYM_SANDBOX_INIT") or "auto")
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
                await sandbox._start()
            else:
                sandbox._restart_wall_clock()
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
        _LIVE.add(sandbox)
        sandbox._prepare_workspace()  # before seeding: the tmpfs would hide what was written under it
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

    async def _refill(self, key: tuple[str, str, str], mount_path: str, limits: SandboxLimits,
                      proxy: ProxyEndpoint | None) -> None:  # fmt: skip
        ready = self._pool[key]
        while len(ready) < self.pool_size:
            sandbox = self._new_sandbox(mount_path, limits, proxy)
            try:
                await sandbox._start()
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


def _choose_init(init: str) -> Path | None:
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


def _absolute_inside(path: str, what: str) -> str:
    normal = posixpath.normpath(path)
    if not posixpath.isabs(normal) or normal == "/":
        raise ValueError(f"{what} {path!r} must be an absolute path inside the sandbox, below /")
    return normal


# ------------------------------------------------------------------------------------------------ sandbox
class LocalSandbox:
    """One running bubblewrap sandbox. Use `async with` (or call `destroy()`) to release it."""

    def __init__(
        self,
        backend: LocalSandboxBackend,
        sandbox_id: str,
        host_dir: Path,
        mount_path: str,
        limits: SandboxLimits,
        proxy: ProxyEndpoint | None,
    ) -> None:
        self.id = sandbox_id
        self.workspace_path = mount_path
        self.proxy_base_url: str | None = f"http://127.0.0.1:{backend.relay_port}" if proxy else None
        self.host_dir = host_dir
        self.workspace_dir = host_dir / "workspace"
        self.limits = limits
        self._backend = backend
        self._proxy = proxy
        self._process: asyncio.subprocess.Process | None = None
        self._control: socket.socket | None = None
        self._cgroup: SandboxCgroup | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._deadline = time.monotonic() + limits.wall_time_s
        self._wall_timer: asyncio.TimerHandle | None = None
        self._destroyed = False
        self._removal: asyncio.Task[None] | None = None  # reaping + host clean-up after destroy()
        self._removed = False
        self._remove_lock = threading.Lock()
        self._gone_reason: str | None = None
        self._stderr_path = host_dir / "init.stderr"
        self._quota: bool | None = None  # whether the workspace is a sized tmpfs (None: not tried yet)
        self._commands_since_start = 0
        self.last_download: DownloadReport | None = None

    # ------------------------------------------------------------------ start
    def _bwrap_args(self, init_fd: int) -> list[str]:
        """bwrap's options (they go through a memfd, see bwrap_args.py); the init's argv follows them."""
        b = self._backend
        args = ["--unshare-all", "--unshare-user", "--uid", "0", "--gid", "0", "--disable-userns", "--cap-drop", "ALL",
                "--hostname", self.id, "--die-with-parent", "--new-session"]
        args += bwrap_args.system_binds(b.hidden_roots)
        args += bwrap_args.proc_args()
        args += bwrap_args.private_dirs(self.limits.workspace_mb * 1024 * 1024)
        for path in b.auto_binds:
            args += ["--ro-bind", str(path), str(path)]
        for host_path, inside in b.ro_binds.items():
            args += ["--ro-bind", host_path, inside]
        hidden = list(b.hidden_paths)
        for path in hidden:  # after the binds, so a hidden folder inside a bound one stays hidden
            if path.exists() and self._visible_inside(path):
                args += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
        if self._proxy is not None and self._proxy.unix_socket is not None:
            args += ["--ro-bind", str(Path(self._proxy.unix_socket).absolute()), PROXY_SOCKET_INSIDE]
        if b.init_binary is not None:
            args += ["--ro-bind", str(b.init_binary), INIT_INSIDE]
        args += ["--bind", str(self.workspace_dir), self.workspace_path, "--chdir", self.workspace_path, "--clearenv"]
        return args

    def _init_argv(self, init_fd: int) -> list[str]:
        b = self._backend
        init = [INIT_INSIDE] if b.init_binary is not None else [b.python, "-I", "-S", "-c", INIT_SOURCE]
        return init + [str(init_fd), *self._init_args()]

    def _visible_inside(self, path: Path) -> bool:
        """Whether a host path would be visible inside without hiding (a system folder or a bound one)."""
        bound = [str(p) for p in self._backend.auto_binds] + list(self._backend.ro_binds)
        if any(is_under(str(path), b) or is_under(b, str(path)) for b in bound):
            return True
        top = "/" + str(path).strip("/").split("/")[0]
        return top.lstrip("/") in bwrap_args.SYSTEM_FOLDERS

    def _init_args(self) -> list[str]:
        """The init's arguments after the control fd: rlimits, then the relay's port and socket if any."""
        mb = 1024 * 1024
        rlimits = {"core": 0, "fsize": self.limits.workspace_mb * mb, "nproc": self.limits.max_processes}
        if self._cgroup is None:  # no cgroup: cap each process's writable memory instead
            rlimits["data"] = self.limits.memory_mb * mb
        args = [",".join(f"{name}={value}" for name, value in rlimits.items())]
        if self._proxy is not None:
            args += [str(self._backend.relay_port), PROXY_SOCKET_INSIDE]
        return args

    def _prepare_workspace(self) -> None:
        """Mount the workspace tmpfs of the sandbox's disk size (once; it outlives restarts)."""
        if self._quota is None:
            self._quota = mount_workspace(self.workspace_dir, self.limits.workspace_mb)
            if not self._quota:
                log.debug("no workspace tmpfs for %s (cannot mount here): the disk limit is polled", self.id)

    async def _start(self) -> None:
        self._prepare_workspace()
        if self._backend.use_cgroups and self._cgroup is None:
            self._cgroup = SandboxCgroup.create(f"clawgym-{self.id}", self.limits.memory_mb, self.limits.max_processes)
        host_end, init_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._control = host_end
        options_fd = bwrap_args.args_memfd(self._bwrap_args(init_end.fileno()))
        args = [self._backend.bwrap, "--args", str(options_fd), *self._init_argv(init_end.fileno())]
        procs = [str(f) for f in self._cgroup.procs_files] if self._cgroup is not None else []
        if procs:  # join the cgroup before bwrap starts, so every descendant is in it
            if self._backend.init_binary is not None:  # the C init doubles as the launcher: no shell to start
                args = [str(self._backend.init_binary), "--in-cgroup", *procs, "--", *args]
            else:
                args = [sys.executable, "-I", "-S", "-c", PY_LAUNCHER, *procs, "--", *args]
        try:
            with open(self._stderr_path, "wb") as stderr:
                self._process = await asyncio.create_subprocess_exec(
                    *args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                    pass_fds=[init_end.fileno(), options_fd], start_new_session=True,
                )
        finally:
            init_end.close()
            os.close(options_fd)
        self._write_state()
        host_end.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            ready = await asyncio.wait_for(loop.sock_recv(host_end, 1 << 16), READY_TIMEOUT_S)
        except (TimeoutError, OSError) as exc:
            ready = repr(exc).encode()
        if not ready.startswith(b"ready "):
            code = self._process.returncode
            raise SandboxError(f"sandbox {self.id} did not start ({ready!r}, exit {code}): {self._stderr_tail() or 'no output from bwrap'}")
        self._reader = asyncio.create_task(self._read_control())
        if self._wall_timer is None:
            self._wall_timer = loop.call_at(loop.time() + self.limits.wall_time_s, self._wall_time_up)
        self._commands_since_start = 0

    async def end_agent_processes(self) -> None:
        """Kill every process in the sandbox, check that none is left, then start a fresh init.

        Called before verification: whatever the agent left running (a `setsid` loop, a process holding
        the old control socket) is gone, and the verifier's commands go over a control channel the agent
        never had. The workspace stays as the agent left it. A no-op when nothing ran since the last start.
        """
        self._check_alive()
        if self._commands_since_start == 0:
            return
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self._fail_pending("sandbox_restarted")
        self._kill()
        if self._process is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._process.wait(), 10)
        await asyncio.to_thread(self._wait_cgroup_empty)
        await self._start()

    def _wait_cgroup_empty(self) -> None:
        if self._cgroup is None:
            return  # the PID namespace ended with bwrap: the kernel killed everything in it
        deadline = time.monotonic() + EMPTY_CGROUP_TIMEOUT_S
        while self._cgroup.members():
            if time.monotonic() > deadline:
                raise SandboxError(f"sandbox {self.id}: processes {self._cgroup.members()} survived the kill")
            self._cgroup.kill_all()
            time.sleep(0.002)

    def _restart_wall_clock(self) -> None:
        """A warm sandbox's wall-time limit counts from when a task takes it, not from its start."""
        self._deadline = time.monotonic() + self.limits.wall_time_s
        if self._wall_timer is not None:
            self._wall_timer.cancel()
        loop = asyncio.get_running_loop()
        self._wall_timer = loop.call_at(loop.time() + self.limits.wall_time_s, self._wall_time_up)

    @property
    def alive(self) -> bool:
        return not self._destroyed and self._process is not None and self._process.returncode is None

    def _write_state(self) -> None:
        me = psutil.Process()
        state = {
            "id": self.id,
            "owner_pid": me.pid,
            "owner_started": me.create_time(),
            "bwrap_pid": self._process.pid if self._process else None,
            "cgroups": [str(d) for d in self._cgroup.dirs] if self._cgroup else [],
            "created": time.time(),
        }
        (self.host_dir / "sandbox.json").write_text(json.dumps(state))

    def _stderr_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self._stderr_path.read_text(errors="replace").strip()[-2000:]
        return ""

    async def _read_control(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._control is not None
        try:
            while True:
                data = await loop.sock_recv(self._control, 1 << 16)
                if not data:
                    break
                message = parse_reply(data)
                future = self._pending.pop(message.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(message)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._fail_pending(self._gone_reason or "sandbox_exited")

    def _fail_pending(self, reason: str) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_result({"op": "gone", "reason": reason})
        self._pending.clear()

    def _wall_time_up(self) -> None:
        self._gone_reason = "wall_time"
        asyncio.ensure_future(self.destroy())

    # ------------------------------------------------------------------ exec
    async def exec(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run a command (argv, or a shell string for /bin/sh -c) inside the sandbox and wait for it."""
        code, out, err, duration, reason = await self._run(command, cwd=cwd, env=env, timeout_s=timeout_s, stdin=stdin)
        return ExecResult(
            exit_code=code, stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"),
            duration_s=duration, timed_out=reason in ("timeout", "wall_time"), killed_reason=reason,
        )

    async def _run(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        stdin: bytes | None = None,
    ) -> tuple[int, bytes, bytes, float, str | None]:
        self._check_alive()
        if isinstance(command, str):
            argv = ["/bin/sh", "-c", command]
        else:
            argv = [str(part) for part in command]
            if not argv:
                raise ValueError("exec needs a non-empty command")
        request_id = next(self._ids)
        self._commands_since_start += 1
        request = exec_request(request_id, posixpath.join(self.workspace_path, cwd) if cwd else self.workspace_path,
                                argv, self._command_env(env))
        wall_left = self._deadline - time.monotonic()
        budget = min(timeout_s, wall_left) if timeout_s is not None else wall_left
        reason_if_late = "timeout" if timeout_s is not None and timeout_s <= wall_left else "wall_time"
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[request_id] = future

        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        in_read, in_write = os.pipe() if stdin is not None else (os.open(os.devnull, os.O_RDONLY), None)
        out_buf, err_buf = bytearray(), bytearray()
        readers = [asyncio.create_task(_drain(out_read, out_buf)), asyncio.create_task(_drain(err_read, err_buf))]
        oom_before = self._cgroup.oom_kills() if self._cgroup else 0
        forks_before = self._cgroup.fork_refusals() if self._cgroup else 0
        started = time.monotonic()
        try:
            assert self._control is not None
            self._control.sendmsg(
                [request],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [in_read, out_write, err_write]))],
            )
        except OSError as exc:
            self._pending.pop(request_id, None)
            for task in readers:
                task.cancel()
            raise SandboxError(f"sandbox {self.id} is not running ({exc})") from exc
        finally:
            for fd in (in_read, out_write, err_write):
                os.close(fd)
        if in_write is not None:
            await _feed(in_write, stdin or b"")

        reason: str | None = None
        # where the kernel enforces the quota (a sized tmpfs) there is nothing to poll
        watcher = asyncio.create_task(self._watch_disk(request_id) if not self._quota else asyncio.sleep(0, False))
        try:
            message = await asyncio.wait_for(asyncio.shield(future), max(budget, 0.0))
        except TimeoutError:
            reason = reason_if_late
            self._send_kill(request_id)
            try:
                message = await asyncio.wait_for(asyncio.shield(future), 10.0)
            except TimeoutError:
                message = {"op": "gone", "reason": reason}
        except asyncio.CancelledError:
            self._send_kill(request_id)
            raise
        finally:
            disk_full = watcher.done() and not watcher.cancelled() and watcher.result()
            watcher.cancel()
        if disk_full:
            reason = reason or "disk"
        await _finish_readers(readers, OUTPUT_GRACE_S)
        duration = time.monotonic() - started

        if message["op"] == "error":
            err_buf += f"clawgym sandbox: cannot run {argv[0]!r}: {message['error']}\n".encode()
            return 127, bytes(out_buf), bytes(err_buf), duration, reason
        if message["op"] == "gone":
            if reason is None and self._cgroup is not None and self._cgroup.oom_kills() > oom_before:
                reason = "memory"  # the kernel's OOM killer ended the sandbox's init
            return 137, bytes(out_buf), bytes(err_buf), duration, reason or message["reason"]
        code = int(message["code"])
        if reason is None and code != 0:
            reason = self._explain_failure(message, err_buf, oom_before, forks_before)
        return code, bytes(out_buf), bytes(err_buf), duration, reason

    def _explain_failure(self, message: dict[str, Any], stderr: bytes, oom_before: int, forks_before: int) -> str | None:
        text = stderr[-4000:].decode(errors="replace")
        if message.get("signal") == signal.SIGXFSZ or message.get("code") == 128 + signal.SIGXFSZ:
            return "disk"
        if any(hint in text for hint in DISK_HINTS) and self._a_disk_is_full():
            return "disk"  # ENOSPC alone is not enough: `unshare -U` says so when user namespaces are off
        if self._cgroup is not None:
            if self._cgroup.oom_kills() > oom_before:
                return "memory"
            if self._cgroup.fork_refusals() > forks_before:
                return "pids"
            return None
        # rlimit mode: the allocation failed inside the process, which usually says so on stderr
        if any(hint in text for hint in MEMORY_HINTS):
            return "memory"
        return None

    async def _watch_disk(self, request_id: int) -> bool:
        """Kill the command once the workspace outgrows its limit; True if it did."""
        limit = self.limits.workspace_mb * 1024 * 1024
        while True:
            await asyncio.sleep(DISK_CHECK_INTERVAL_S)
            used = await asyncio.to_thread(disk_usage, self.workspace_dir)
            if used > limit:
                self._send_kill(request_id)
                return True

    def _send_kill(self, request_id: int) -> None:
        with contextlib.suppress(OSError, AttributeError):
            self._control.send(kill_request(request_id))  # type: ignore[union-attr]

    def _a_disk_is_full(self) -> bool:
        """Whether the workspace or one of the sandbox's sized tmpfs (/dev/shm, /tmp, /root, /run) is full."""
        if (self._quota or not self._backend.use_cgroups) and is_full(self.workspace_dir):
            return True
        if self._quota is False and disk_usage(self.workspace_dir) >= self.limits.workspace_mb * 1024 * 1024 * 0.95:
            return True
        with contextlib.suppress(psutil.Error, AttributeError):
            inner = psutil.Process(self._process.pid).children(recursive=True)  # type: ignore[union-attr]
            if inner:
                root = f"/proc/{inner[0].pid}/root"
                return any(is_full(Path(root + d)) for d in ("/dev/shm", *PRIVATE_DIRS))
        return False

    def _command_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = {"PATH": DEFAULT_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root", "TMPDIR": "/tmp",
                  "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PWD": self.workspace_path}
        merged.update(self._backend.env)
        merged.update({str(k): str(v) for k, v in (env or {}).items()})
        return merged

    def _check_alive(self) -> None:
        if self._destroyed:
            raise SandboxError(f"sandbox {self.id} was destroyed ({self._gone_reason or 'destroy() was called'})")

    # ------------------------------------------------------------------ files
    def _resolve(self, path: str) -> tuple[str, str]:
        """('workspace', relative path) or ('tmp', absolute path); anything else is refused."""
        inside = posixpath.normpath(posixpath.join(self.workspace_path, path))
        if is_under(inside, self.workspace_path):
            return "workspace", posixpath.relpath(inside, self.workspace_path)
        if is_under(inside, "/tmp"):
            return "tmp", inside
        raise PermissionError(
            f"path {path!r} is outside the sandbox's workspace ({self.workspace_path}) and /tmp; "
            "only those can be read or written"
        )

    async def read_file(self, path: str) -> bytes:
        self._check_alive()
        where, target = self._resolve(path)
        if where == "workspace":
            return await self._on_host(read_beneath, self.workspace_dir, target)
        code, out, err, _, _ = await self._run(["cat", "--", target], timeout_s=60)
        if code != 0:
            raise FileNotFoundError(f"cannot read {path} in sandbox {self.id}: {err.decode(errors='replace').strip()}")
        return out

    async def write_file(self, path: str, data: bytes | str) -> None:
        self._check_alive()
        payload = data.encode() if isinstance(data, str) else bytes(data)
        where, target = self._resolve(path)
        if where == "workspace":
            await self._on_host(write_beneath, self.workspace_dir, target, payload)
            return
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
        code, _, err, _, _ = await self._run(["/bin/sh", "-c", script, "sh", target], stdin=payload, timeout_s=60)
        if code != 0:
            raise OSError(f"cannot write {path} in sandbox {self.id}: {err.decode(errors='replace').strip()}")

    async def list_files(self, path: str | None = None) -> list[str]:
        """Files (recursively, not folders) under `path` (default: the workspace), relative to it, sorted."""
        self._check_alive()
        where, target = self._resolve(path or self.workspace_path)
        if where == "workspace":
            return await self._on_host(list_beneath, self.workspace_dir, target)
        code, out, err, _, _ = await self._run(["find", target, "-mindepth", "1", "-not", "-type", "d", "-printf", "%P\\n"], timeout_s=60)
        if code != 0:
            raise FileNotFoundError(f"cannot list {path} in sandbox {self.id}: {err.decode(errors='replace').strip()}")
        return sorted(line for line in out.decode(errors="replace").splitlines() if line)

    async def download_workspace(self, dest: Path) -> Path:
        """Copy the workspace to `dest` on the host: folders, regular files without setuid/setgid bits, and
        links that stay inside; FIFOs, sockets, devices and links out are skipped and counted in
        `last_download` (a DownloadReport)."""
        self._check_alive()
        dest = Path(dest)
        self.last_download = await self._on_host(copy_workspace, self.workspace_dir, dest, self.workspace_path)
        if self.last_download.skipped:
            log.info("download of %s skipped %s", self.id, self.last_download.skipped)
        return dest

    async def _on_host(self, func: Any, *args: Any) -> Any:
        """Host file work off the event loop, with a time limit (a slow or odd file cannot stall the loop)."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(func, *args), HOST_FILE_TIMEOUT_S)
        except TimeoutError:
            raise SandboxError(f"sandbox {self.id}: host file access took over {HOST_FILE_TIMEOUT_S:g} s") from None

    # ------------------------------------------------------------------ lifecycle
    async def destroy(self) -> None:
        """Kill everything in the sandbox; safe to call twice.

        Returns once SIGKILL is sent (to bwrap's process group and to every process in the sandbox's
        cgroup): its control socket is closed and the sandbox refuses further use. Reaping, removing its
        cgroup and host folder (a few ms: the kernel finishing the kill, folder removal on disk) continue in
        a background task: `wait_removed()` waits for it, `backend.aclose()` for all of them; cancelled
        (the event loop closing) it finishes synchronously, and the atexit hook covers the rest.
        """
        if self._destroyed:
            return
        self._destroyed = True
        if self._wall_timer is not None:
            self._wall_timer.cancel()
        self._fail_pending(self._gone_reason or "destroyed")
        if self._reader is not None:
            # stop reading before closing the socket: a reader left registered on the fd number would
            # steal the messages of the next sandbox that gets the same number
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self._kill()
        self._removal = asyncio.get_running_loop().create_task(self._remove())

    async def wait_removed(self) -> None:
        """Wait until a destroyed sandbox's processes are reaped and its cgroup and host folder are gone."""
        if self._removal is not None:
            await asyncio.shield(self._removal)

    async def _remove(self) -> None:
        try:
            if self._process is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._process.wait(), 10)
            await asyncio.to_thread(self._remove_host_state)
        finally:
            # also when cancelled (the event loop is closing): finish here rather than leave it for atexit
            if not self._removed:
                self._remove_host_state()
            self._backend._sandboxes.discard(self)

    def destroy_now(self) -> None:
        """Synchronous destroy for interpreter exit (no event loop); also finishes a pending removal."""
        if self._removed:
            return
        self._destroyed = True
        self._kill()
        if self._process is not None:
            with contextlib.suppress(Exception):
                os.waitpid(self._process.pid, 0)
        self._remove_host_state()

    def _kill(self) -> None:
        if self._control is not None:
            with contextlib.suppress(OSError):
                self._control.close()
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)
        if self._cgroup is not None:
            self._cgroup.kill_all()

    def _remove_host_state(self) -> None:
        with self._remove_lock:  # the background thread and an exit-time call may race
            if self._removed:
                return
            if self._cgroup is not None:
                self._cgroup.remove()
            if self._quota:
                unmount_workspace(self.workspace_dir)
            remove_tree(self.host_dir)
            self._removed = True
            _LIVE.discard(self)

    async def __aenter__(self) -> LocalSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.shield(self.destroy())

    def __repr__(self) -> str:
        return f"LocalSandbox({self.id}, workspace={self.workspace_path}, destroyed={self._destroyed})"




# ------------------------------------------------------------------------------------------- pipes
async def _drain(fd: int, buffer: bytearray) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
    try:
        while chunk := await reader.read(1 << 16):
            buffer += chunk
    finally:
        transport.close()


async def _feed(fd: int, data: bytes) -> None:
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(fd, "wb", 0))
    transport.write(data)
    transport.close()  # flushes in the background, then closes: the command sees EOF


async def _finish_readers(readers: list[asyncio.Task[None]], grace_s: float) -> None:
    _, pending = await asyncio.wait(readers, timeout=grace_s)
    for task in pending:  # a background process still holds the pipe: keep what came so far
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)


LocalSandboxBackend.sandbox_class = LocalSandbox
