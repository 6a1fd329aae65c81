"""One running local sandbox: start (bwrap + init in the sandbox's cgroup), commands over the init's
control socket, host-side file access, the restart before verification, and destruction.

See local_backend.py for the backend and the overall picture, bwrap_args.py for what is shown inside. Past 500
lines because a sandbox's whole life (start, exec, files, restart, destroy) shares its process, cgroup and
control socket, and is read best as one class.
"""

from __future__ import annotations

import array
import asyncio
import atexit
import contextlib
import functools
import itertools
import json
import logging
import os
import posixpath
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import psutil

from clawgym_env.interfaces import ExecResult, OutputCap, ProxyEndpoint, SandboxLimits
from clawgym_env.sandbox import bwrap_args
from clawgym_env.sandbox.bwrap_args import (
    INIT_INSIDE,
    PRIVATE_DIRS,
    is_under,
)
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
from clawgym_env.sandbox.host_setup import SandboxError
from clawgym_env.sandbox.init_protocol import exec_request, kill_request, parse_reply
from clawgym_env.sandbox.pipes import drain, feed, finish_pipes

if TYPE_CHECKING:
    from clawgym_env.sandbox.local_backend import LocalSandboxBackend


INIT_SOURCE = (Path(__file__).with_name("sandbox_init.py")).read_text()
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BWRAP_ENV = {"PATH": DEFAULT_PATH}  # all that the launcher and bwrap get; commands get `_command_env`
READY_TIMEOUT_S = 20.0
STDERR_KEPT_BYTES = 64 * 1024  # of bwrap's and the init's stderr, for error messages (the agent can write there)
OUTPUT_GRACE_S = 1.0  # after a command exits, how long to wait for stragglers still holding its stdout
DISK_CHECK_INTERVAL_S = 1.0  # only where no workspace tmpfs could be mounted (the kernel enforces it otherwise)
HOST_FILE_TIMEOUT_S = 60.0
EMPTY_CGROUP_TIMEOUT_S = 5.0
DISK_HINTS = ("File too large", "File size limit exceeded", "No space left on device")
MEMORY_HINTS = ("MemoryError", "Cannot allocate memory", "out of memory", "std::bad_alloc", "heap out of memory")
# The Python launcher (no C compiler): join the cgroups, then exec bwrap.
PY_LAUNCHER = "import os,sys\ni=sys.argv.index('--')\nfor p in sys.argv[1:i]:\n  open(p,'w').write('0')\nos.execvp(sys.argv[i+1],sys.argv[i+1:])"
log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------- process-exit cleanup
_LIVE: weakref.WeakSet[LocalSandbox] = weakref.WeakSet()


@atexit.register
def _destroy_all_at_exit() -> None:
    """Kill and remove every sandbox not yet removed, including those whose background removal was cut
    short when the event loop closed."""
    for sandbox in list(_LIVE):
        sandbox.destroy_now()


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
        self._stderr = OutputCap(STDERR_KEPT_BYTES)  # what bwrap and the init wrote to stderr, bounded
        self._stderr_reader: asyncio.Task[None] | None = None
        self._quota: bool | None = None  # whether the workspace is a sized tmpfs (None: not tried yet)
        self._commands_since_start = 0
        self.last_download: DownloadReport | None = None
        _LIVE.add(self)  # removed at process exit if nobody removed it before

    # ------------------------------------------------------------------ start
    def _bwrap_args(self, init_data_fd: int | None = None) -> list[str]:
        """bwrap's options (they go through a memfd, see bwrap_args.py); the init's argv follows them.
        `init_data_fd`: an open file of the compiled init, copied to /run/clawgym/init."""
        b = self._backend
        args = [
            *bwrap_args.ISOLATION,
            "--hostname",
            self.id,
            "--die-with-parent",
            "--new-session",
        ]
        args += bwrap_args.system_binds(b.hidden_roots)
        args += bwrap_args.proc_args()
        args += bwrap_args.private_dirs(self.limits.workspace_mb * 1024 * 1024)
        for path in b.auto_binds:
            args += ["--ro-bind", str(path), str(path)]
        for host_path, inside in b.ro_binds.items():
            args += ["--ro-bind", host_path, inside]
        hidden = list(b.hidden_paths)
        if self._proxy is not None and self._proxy.unix_socket is not None:  # other rollouts' sockets may sit there
            hidden.append(Path(self._proxy.unix_socket).absolute().parent)
        for path in hidden:  # after the binds, so a hidden folder inside a bound one stays hidden
            if path.exists() and self._visible_inside(path):
                args += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
        if init_data_fd is not None:  # a copy, not a bind: the mount table would name the cached binary's path
            args += ["--perms", "0555", "--ro-bind-data", str(init_data_fd), INIT_INSIDE]
        args += ["--bind", str(self.workspace_dir), self.workspace_path, "--chdir", self.workspace_path, "--clearenv"]
        return args

    def _init_argv(self, control_fd: int, relay_fd: int | None) -> list[str]:
        b = self._backend
        init = [INIT_INSIDE] if b.init_binary is not None else [b.python, "-I", "-S", "-c", INIT_SOURCE]
        return init + [str(control_fd), *self._init_args(relay_fd)]

    def _visible_inside(self, path: Path) -> bool:
        """Whether a host path would be visible inside without hiding (a system folder or a bound one)."""
        bound = [str(p) for p in self._backend.auto_binds] + list(self._backend.ro_binds)
        if any(is_under(str(path), b) or is_under(b, str(path)) for b in bound):
            return True
        top = "/" + str(path).strip("/").split("/")[0]
        return top.lstrip("/") in bwrap_args.SYSTEM_FOLDERS

    def _init_args(self, relay_fd: int | None) -> list[str]:
        """The init's arguments after the control fd: rlimits, then the relay's port and the proxy socket's fd.

        The socket goes in as an open file (O_PATH), not a bind mount: the mount table inside would name its
        host folder. The init connects through /proc/self/fd/<fd>, and no command inherits the fd."""
        mb = 1024 * 1024
        rlimits = {"core": 0, "fsize": self.limits.workspace_mb * mb, "nproc": self.limits.max_processes}
        if self._cgroup is None:  # no cgroup: cap each process's writable memory instead
            rlimits["data"] = self.limits.memory_mb * mb
        args = [",".join(f"{name}={value}" for name, value in rlimits.items())]
        if relay_fd is not None:
            args += [str(self._backend.relay_port), str(relay_fd)]
        return args

    def prepare_workspace(self) -> None:
        """Mount the workspace tmpfs of the sandbox's disk size (once; it outlives restarts)."""
        if self._quota is None:
            self._quota = mount_workspace(self.workspace_dir, self.limits.workspace_mb)
            if not self._quota:
                log.debug("no workspace tmpfs for %s (cannot mount here): the disk limit is polled", self.id)

    async def start(self) -> None:
        self.prepare_workspace()
        if self._backend.use_cgroups and self._cgroup is None:
            self._cgroup = SandboxCgroup.create(f"clawgym-{self.id}", self.limits.memory_mb, self.limits.max_processes)
        host_end, init_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._control = host_end
        passed = [init_end.fileno()]
        init_data_fd = relay_fd = None
        try:
            if self._backend.init_binary is not None:
                init_data_fd = os.open(self._backend.init_binary, os.O_RDONLY | os.O_CLOEXEC)
                passed.append(init_data_fd)
            if self._proxy is not None and self._proxy.unix_socket is not None:
                relay_fd = os.open(Path(self._proxy.unix_socket).absolute(), os.O_PATH | os.O_CLOEXEC)
                passed.append(relay_fd)
            passed.append(bwrap_args.args_memfd(self._bwrap_args(init_data_fd)))
        except OSError:
            for fd in passed[1:]:
                os.close(fd)
            init_end.close()
            raise
        bwrap = shutil.which(self._backend.bwrap) or self._backend.bwrap
        args = [bwrap, "--args", str(passed[-1]), *self._init_argv(init_end.fileno(), relay_fd)]
        procs = [str(f) for f in self._cgroup.procs_files] if self._cgroup is not None else []
        if procs:  # join the cgroup before bwrap starts, so every descendant is in it
            if self._backend.init_binary is not None:  # the C init doubles as the launcher: no shell to start
                args = [str(self._backend.init_binary), "--in-cgroup", *procs, "--", *args]
            else:
                args = [sys.executable, "-I", "-S", "-c", PY_LAUNCHER, *procs, "--", *args]
        stderr_read, stderr_write = os.pipe2(os.O_CLOEXEC)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr_write,  # a pipe, not a host file: /proc/1/fd/2 inside is writable by the agent
                pass_fds=passed,
                start_new_session=True,
                env=BWRAP_ENV,  # bwrap is PID 1 inside: its /proc/1/environ must hold nothing of the host's
            )
        except BaseException:
            os.close(stderr_read)
            raise
        finally:
            os.close(stderr_write)
            init_end.close()
            for fd in passed[1:]:
                os.close(fd)
        if self._stderr_reader is not None:  # the previous start's bwrap is gone (a restart)
            self._stderr_reader.cancel()
        self._stderr = OutputCap(STDERR_KEPT_BYTES)
        self._stderr_reader = asyncio.create_task(drain(stderr_read, self._stderr))
        self._write_state()
        host_end.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            ready = await asyncio.wait_for(loop.sock_recv(host_end, 1 << 16), READY_TIMEOUT_S)
        except (TimeoutError, OSError) as exc:
            ready = repr(exc).encode()
        if not ready.startswith(b"ready "):
            with contextlib.suppress(TimeoutError):  # bwrap's own message, if it exited
                await asyncio.wait_for(asyncio.shield(self._stderr_reader), 1.0)
            code = self._process.returncode
            raise SandboxError(
                f"sandbox {self.id} did not start ({ready!r}, exit {code}): {self._stderr_tail() or 'no output from bwrap'}"
            )
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
        await self.start()

    def _wait_cgroup_empty(self) -> None:
        if self._cgroup is None:
            return  # the PID namespace ended with bwrap: the kernel killed everything in it
        deadline = time.monotonic() + EMPTY_CGROUP_TIMEOUT_S
        while self._cgroup.members():
            if time.monotonic() > deadline:
                raise SandboxError(f"sandbox {self.id}: processes {self._cgroup.members()} survived the kill")
            self._cgroup.kill_all()
            time.sleep(0.002)

    def restart_wall_clock(self) -> None:
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
        return self._stderr.result()[0].decode(errors="replace").strip()[-2000:]

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
            exit_code=code,
            stdout=out.data.decode(errors="replace"),
            stderr=err.data.decode(errors="replace"),
            duration_s=duration,
            timed_out=reason in ("timeout", "wall_time"),
            killed_reason=reason,
            stdout_dropped_bytes=out.dropped,
            stderr_dropped_bytes=err.dropped,
        )

    async def _run(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        stdin: bytes | None = None,
        max_output: int | None = None,
    ) -> tuple[int, _Output, _Output, float, str | None]:
        """(exit code, stdout, stderr, seconds, killed reason); each stream kept to `max_output` bytes (default:
        the sandbox's `max_output_bytes`), its head and tail, the rest drained and dropped as it comes."""
        self._check_alive()
        if isinstance(command, str):
            argv = ["/bin/sh", "-c", command]
        else:
            argv = [str(part) for part in command]
            if not argv:
                raise ValueError("exec needs a non-empty command")
        request_id = next(self._ids)
        self._commands_since_start += 1
        request = exec_request(
            request_id,
            posixpath.join(self.workspace_path, cwd) if cwd else self.workspace_path,
            argv,
            self._command_env(env),
        )
        wall_left = self._deadline - time.monotonic()
        budget = min(timeout_s, wall_left) if timeout_s is not None else wall_left
        reason_if_late = "timeout" if timeout_s is not None and timeout_s <= wall_left else "wall_time"
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[request_id] = future

        oom_before = self._cgroup.oom_kills() if self._cgroup else 0
        forks_before = self._cgroup.fork_refusals() if self._cgroup else 0
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        in_read, in_write = os.pipe() if stdin is not None else (os.open(os.devnull, os.O_RDONLY), None)
        started = time.monotonic()
        try:
            assert self._control is not None
            self._control.sendmsg(
                [request],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [in_read, out_write, err_write]))],
            )
        except OSError as exc:
            self._pending.pop(request_id, None)
            for fd in (out_read, err_read, in_write):
                if fd is not None:
                    os.close(fd)
            raise SandboxError(f"sandbox {self.id} is not running ({exc})") from exc
        finally:
            for fd in (in_read, out_write, err_write):
                os.close(fd)
        cap = max_output or self.limits.max_output_bytes
        out_buf, err_buf = OutputCap(cap), OutputCap(cap)
        pipes = [asyncio.create_task(drain(out_read, out_buf)), asyncio.create_task(drain(err_read, err_buf))]
        if in_write is not None:
            pipes.append(asyncio.create_task(feed(in_write, stdin or b"")))  # in the background: never blocks us

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
        await finish_pipes(pipes, OUTPUT_GRACE_S)
        duration = time.monotonic() - started

        if message["op"] == "error":
            err_buf.add(f"clawgym sandbox: cannot run {argv[0]!r}: {message['error']}\n".encode())
        out, err = _Output(*out_buf.result()), _Output(*err_buf.result())
        if message["op"] == "error":
            return 127, out, err, duration, reason
        if message["op"] == "gone":
            if reason is None and self._cgroup is not None and self._cgroup.oom_kills() > oom_before:
                reason = "memory"  # the kernel's OOM killer ended the sandbox's init
            return 137, out, err, duration, reason or message["reason"]
        code = int(message["code"])
        if reason is None and code != 0:
            reason = self._explain_failure(message, err.data, oom_before, forks_before)
        return code, out, err, duration, reason

    def _explain_failure(
        self, message: dict[str, Any], stderr: bytes, oom_before: int, forks_before: int
    ) -> str | None:
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
        if self._quota and is_full(self.workspace_dir):
            return True
        if not self._quota and disk_usage(self.workspace_dir) >= self.limits.workspace_mb * 1024 * 1024 * 0.95:
            return True
        with contextlib.suppress(psutil.Error, AttributeError):
            inner = psutil.Process(self._process.pid).children(recursive=True)  # type: ignore[union-attr]
            if inner:
                root = f"/proc/{inner[0].pid}/root"
                return any(is_full(Path(root + d)) for d in ("/dev/shm", *PRIVATE_DIRS))
        return False

    def _command_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = {
            "PATH": DEFAULT_PATH,
            "HOME": "/root",
            "USER": "root",
            "LOGNAME": "root",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PWD": self.workspace_path,
        }
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
        # /tmp is a tmpfs of workspace_mb: no file there is larger
        largest = self.limits.workspace_mb * 1024 * 1024
        code, out, err, _, _ = await self._run(["cat", "--", target], timeout_s=60, max_output=largest + 2)
        if code != 0:
            raise FileNotFoundError(f"cannot read {path} in sandbox {self.id}: {err.text.strip()}")
        if out.dropped:
            raise OSError(f"cannot read {path} in sandbox {self.id}: larger than {largest} bytes")
        return out.data

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
            raise OSError(f"cannot write {path} in sandbox {self.id}: {err.text.strip()}")

    async def list_files(self, path: str | None = None) -> list[str]:
        """Files (recursively, not folders) under `path` (default: the workspace), relative to it, sorted."""
        self._check_alive()
        where, target = self._resolve(path or self.workspace_path)
        if where == "workspace":
            return await self._on_host(list_beneath, self.workspace_dir, target)
        code, out, err, _, _ = await self._run(
            ["find", target, "-mindepth", "1", "-not", "-type", "d", "-printf", "%P\\n"], timeout_s=60
        )
        if code != 0:
            raise FileNotFoundError(f"cannot list {path} in sandbox {self.id}: {err.text.strip()}")
        if out.dropped:
            raise OSError(f"cannot list {path} in sandbox {self.id}: the listing is over {len(out.data)} bytes")
        return sorted(line for line in out.text.splitlines() if line)

    async def download_workspace(self, dest: Path) -> Path:
        """Copy the workspace to `dest` on the host: folders, regular files without setuid/setgid bits, and
        links that stay inside; FIFOs, sockets, devices and links out are skipped and counted in
        `last_download` (a DownloadReport). Bounded by the workspace's size in apparent bytes (sparse files at
        their full length) and host_files' limits on names, depth and links: what is over is refused."""
        self._check_alive()
        dest = Path(dest)
        copy = functools.partial(copy_workspace, max_bytes=self.limits.workspace_mb * 1024 * 1024)
        self.last_download = await self._on_host(copy, self.workspace_dir, dest, self.workspace_path)
        if self.last_download.refused:
            log.info("download of %s refused %s", self.id, self.last_download.refused)
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
            if self._stderr_reader is not None:
                self._stderr_reader.cancel()
                await asyncio.gather(self._stderr_reader, return_exceptions=True)
            await asyncio.to_thread(self._remove_host_state)
        finally:
            # also when cancelled (the event loop is closing): finish here rather than leave it for atexit
            if not self._removed:
                self._remove_host_state()
            self._backend.forget(self)

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
class _Output(NamedTuple):
    """One stream of a command as kept: its bytes (a marker where the middle was dropped), bytes dropped."""

    data: bytes
    dropped: int

    @property
    def text(self) -> str:
        return self.data.decode(errors="replace")
