"""Host-side checks in a child process with a memory limit and a time limit, never in a thread of the caller.

A check reads what the policy wrote: a 300 KB .xlsx can inflate to 300 MB of shared string, a 50 MB answer.txt
feeds regular expressions that hold the GIL for seconds. In a worker thread such a check freezes the event loop
(and every other rollout's model calls on it), grows the host's memory, and cannot be stopped at its timeout.

    value = await run_isolated(fn, *args, timeout_s=60, memory_mb=2048)

runs `fn(*args)` in a child process and returns its result, or raises its exception again (the same type where
it can be pickled, so a `VerifierConfigError` still reads as "misconfigured"; the child's traceback is a note):

  * the call travels pickled with cloudpickle: lambdas and closures by value, and so, after one retry, the
    functions and classes of a module the child cannot import (a test module pytest imported under its own name);
  * children are forked by a small server process (`python -m verifiers.isolated_worker`, one per caller process,
    started on first use, `verifiers`, openpyxl and python-docx imported there once): a call costs a fork and a
    few milliseconds, not an interpreter start and those imports (about 0.7 s of a core);
  * the child leads its own process group, takes the caller's sys.path, working folder and environment, and sets
    RLIMIT_AS to `memory_mb` before it unpickles anything (its whole address space: the server's imports take
    about 200 MB of it);
  * at `timeout_s` (counted from the child's start; None: no limit) or when the caller is cancelled, the whole
    process group is killed (SIGKILL); no process of a check outlives its call.

Past a limit, `CheckLimitError` is raised; its message names the limit (for `VerifierResult.failure`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import pickle
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

import cloudpickle

from verifiers.base import VerifierConfigError

DEFAULT_MEMORY_MB = 2048  # a real office file parses in far less; a bomb hits this, not the host
MAX_REPLY_BYTES = 64 << 20
START_TIMEOUT_S = 120.0  # the server's first start imports `verifiers` (about a second)
_PID = struct.Struct("!Q")
_LEN = struct.Struct("!I")
_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # a server that forks


class CheckLimitError(RuntimeError):
    """A host-side check ran past its time limit or out of its memory limit; the message names the limit."""


class _MissingModule(Exception):
    def __init__(self, name: str) -> None:
        self.name = name


# ----------------------------------------------------------------------------------------------------- caller side

_server: tuple[int, subprocess.Popen[bytes], socket.socket] | None = None  # (owner pid, fork server, its socket)
_server_lock = threading.Lock()


def _sys_path() -> list[str]:
    return [os.path.abspath(p) if p else os.getcwd() for p in sys.path if isinstance(p, str)]


def _start_server() -> tuple[int, subprocess.Popen[bytes], socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(_sys_path()), "PYTHONSAFEPATH": "1", **_ONE_THREAD}
    with theirs:
        proc = subprocess.Popen(
            [sys.executable, "-m", "verifiers.isolated_worker", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C meant for the caller does not reach it; it ends when `ours` closes
            env=env,
        )
    return os.getpid(), proc, ours


@atexit.register
def _stop_server() -> None:
    global _server
    with _server_lock:
        if _server is not None and _server[0] == os.getpid():
            _server[2].close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                _server[1].wait(timeout=5)
        _server = None


def _open_child() -> socket.socket:
    """A socket to a child the server forks for this call (it may still be starting)."""
    global _server
    with _server_lock:
        for attempt in range(2):
            if _server is None or _server[0] != os.getpid() or _server[1].poll() is not None:
                if _server is not None and _server[0] == os.getpid():
                    _server[2].close()
                _server = _start_server()
            ours, theirs = socket.socketpair()
            try:
                socket.send_fds(_server[2], [b"j"], [theirs.fileno()])
                return ours
            except OSError:  # the server has died since: start another, once
                ours.close()
                _server = None
                if attempt:
                    raise
            finally:
                theirs.close()
    raise AssertionError("unreachable")


def _dumps(fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    try:
        return cloudpickle.dumps((fn, args))
    except Exception as exc:  # noqa: BLE001 - a lock or an open file captured by a closure, say
        name = getattr(fn, "__qualname__", type(fn).__name__)
        raise VerifierConfigError(f"{name} cannot be sent to a check process: {type(exc).__name__}: {exc}") from exc


async def _recv(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int | None) -> bytes:
    """`n` bytes (fewer at the end of the stream), or with None all of it up to MAX_REPLY_BYTES."""
    data = bytearray()
    while n is None or len(data) < n:
        chunk = await loop.sock_recv(sock, (1 << 20) if n is None else n - len(data))
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REPLY_BYTES:
            raise RuntimeError(f"the check sent back more than {MAX_REPLY_BYTES >> 20} MiB")
    return bytes(data)


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):  # the group; the child alone if it had not made its group yet
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)
            return


async def _call_once(payload: bytes, timeout_s: float | None, memory_mb: int) -> Any:
    header = json.dumps({"memory_mb": memory_mb, "sys_path": _sys_path(), "cwd": os.getcwd(), "env": dict(os.environ)})
    loop = asyncio.get_running_loop()
    sock = _open_child()
    sock.setblocking(False)
    pid: int | None = None
    try:
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                started = await _recv(loop, sock, _PID.size)
        except TimeoutError:
            raise RuntimeError(f"the check process did not start within {START_TIMEOUT_S:g} s") from None
        if len(started) < _PID.size:
            raise RuntimeError("the check process could not be started (its fork server ended)")
        pid = _PID.unpack(started)[0]
        try:
            async with asyncio.timeout(timeout_s):
                with contextlib.suppress(OSError):  # a child that died early is reported below
                    await loop.sock_sendall(sock, _LEN.pack(len(header)) + header.encode() + payload)
                    sock.shutdown(socket.SHUT_WR)
                reply = await _recv(loop, sock, None)
        except TimeoutError:
            raise CheckLimitError(
                f"timed out after {timeout_s:g} s (its time limit); its processes were killed"
            ) from None
    finally:
        sock.close()
        if pid is not None:
            _kill_group(pid)
    if not reply:
        raise CheckLimitError(
            f"ended without an answer: killed, or out of memory (its memory limit is {memory_mb} MiB)"
        )
    status, type_name, message, child_traceback, blob = pickle.loads(reply)
    if status == "missing":
        raise _MissingModule(message)
    try:
        value = pickle.loads(blob) if blob is not None else None
    except Exception as exc:  # noqa: BLE001 - an exception type that cannot be rebuilt here is reported by name
        if status == "ok":
            raise RuntimeError(f"the check's result cannot be read here: {type(exc).__name__}: {exc}") from exc
        value = None
    if status == "ok":
        return value
    if type_name == "MemoryError":
        raise CheckLimitError(f"ran out of memory (its memory limit is {memory_mb} MiB)")
    if not isinstance(value, BaseException):
        value = RuntimeError(f"{type_name}: {message}")
    value.add_note(f"raised in the check process:\n{child_traceback}")
    raise value


async def run_isolated(
    fn: Callable[..., Any], /, *args: Any, timeout_s: float | None, memory_mb: int = DEFAULT_MEMORY_MB
) -> Any:
    """`fn(*args)` in a child process with `memory_mb` MiB of address space, killed with its group at `timeout_s`;
    its result, or its exception raised again; `CheckLimitError` past a limit."""
    payload = _dumps(fn, args)
    sent_by_value: set[str] = set()
    while True:
        try:
            return await _call_once(payload, timeout_s, memory_mb)
        except _MissingModule as missing:  # a module the child cannot import (a test module): send it by value
            module = sys.modules.get(missing.name)
            if module is None or missing.name in sent_by_value:
                raise ModuleNotFoundError(f"the check process cannot import {missing.name!r}") from None
            cloudpickle.register_pickle_by_value(module)
            sent_by_value.add(missing.name)
            payload = _dumps(fn, args)


# ----------------------------------------------------------------------------------------------------- server side


def serve(control_fd: int) -> None:
    """The fork server (`python -m verifiers.isolated_worker FD`): one child per request, until the caller is gone."""
    control = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    for module in ("verifiers", "openpyxl", "docx"):  # what most checks import, once
        with contextlib.suppress(Exception):
            __import__(module)
    while True:
        msg, fds, _, _ = socket.recv_fds(control, 16, 4)
        if not msg:
            return
        if not fds:
            continue
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                control.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _child(socket.socket(fileno=fds[0]))
                code = 0
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)  # no waiting for threads the check left behind
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        for fd in fds:
            os.close(fd)


def _child(sock: socket.socket) -> None:
    os.setpgid(0, 0)  # before the caller learns the pid: killing the group kills all of the check
    sock.sendall(_PID.pack(os.getpid()))
    stream = sock.makefile("rb")
    (size,) = _LEN.unpack(stream.read(_LEN.size))
    header = json.loads(stream.read(size))
    limit = int(header["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # before anything is unpickled
    os.chdir(header["cwd"])
    sys.path[:] = header["sys_path"]
    os.environ.clear()
    os.environ.update(header["env"])
    payload = stream.read()
    try:
        fn, args = pickle.loads(payload)
    except ModuleNotFoundError as exc:
        sock.sendall(pickle.dumps(("missing", "ModuleNotFoundError", exc.name, "", None)))
        return
    try:
        reply = ("ok", "", "", "", cloudpickle.dumps(fn(*args)))
    except BaseException as exc:  # noqa: BLE001 - every outcome goes back to the caller
        if not isinstance(exc, Exception):  # SystemExit, KeyboardInterrupt: must not end the caller's process
            exc = RuntimeError(f"the check raised {type(exc).__name__}: {exc}")
        blob = None
        with contextlib.suppress(Exception):
            blob = cloudpickle.dumps(exc)
        reply = ("raised", type(exc).__name__, str(exc)[:4000], traceback.format_exc()[-4000:], blob)
    sock.sendall(pickle.dumps(reply))
