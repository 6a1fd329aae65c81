"""A proxy shard as its caller sees it: the process, its control socket, and the calls waiting on it.

`Shard.launch` starts `python -m clawgym_env.proxy.shard_process FD` (a fresh interpreter: not
multiprocessing's spawn, which re-runs the user's `__main__` module) with one end of a socket pair as FD,
and a thread that reads the shard's answers, each `(id, answer)`, to the call waiting for it; so calls from
several threads (a pool's `hold` waits for a shard's calls to end) do not wait behind each other. A shard
that exits, breaks its socket or does not answer in time raises `ShardLost`, which `ShardedProxy` counts.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from clawgym_env.interfaces import ProxyEndpoint

Answer = tuple[Any, ...]  # ("ok", value) | ("error", type name, message) | ("lost", why)


class ShardLost(Exception):
    """The shard process is gone or stopped answering; `why` says how."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def same_code_env() -> dict[str, str]:
    """The environment with this checkout first on PYTHONPATH: a shard runs the code its caller runs,
    whatever its working directory and whatever else is installed."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


@dataclass
class Shard:
    index: int
    process: subprocess.Popen[bytes]
    conn: Connection
    log_path: Path
    endpoint: ProxyEndpoint | None = None
    policies: set[int] = field(default_factory=set)  # policy keys this shard was sent
    renderers: set[int] = field(default_factory=set)  # renderer keys this shard was sent
    followers: set[int] = field(default_factory=set)  # engines it runs its own client of (their keys)
    open_rollouts: set[str] = field(default_factory=set)
    pending: int = 0  # rollouts given its endpoint that have not opened yet
    assigned: int = 0  # rollouts ever given its endpoint (ties go to the shard given fewest)
    down: str | None = None  # why it is out of service
    waiting: dict[int, Future[Answer]] = field(default_factory=dict)  # control calls sent, by id
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    send_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def launch(cls, index: int, run_dir: Path, options: dict[str, Any], hub_path: Path) -> tuple[Shard, Future[Answer]]:
        """Start the process; (its handle, the future of its first answer: its endpoint once it listens)."""
        ours, theirs = socket.socketpair()
        command = [sys.executable, "-m", "clawgym_env.proxy.shard_process", str(theirs.fileno())]
        process = subprocess.Popen(command, pass_fds=[theirs.fileno()], env=same_code_env())
        theirs.close()
        shard = cls(index, process, Connection(ours.detach()), run_dir / "calls.jsonl")
        shard.waiting[0] = ready = Future()
        threading.Thread(target=shard.read_answers, name=f"clawgym-shard-{index}-answers", daemon=True).start()
        shard.conn.send((index, run_dir, options, str(hub_path)))
        return shard, ready

    def wait_ready(self, ready: Future[Answer], timeout_s: float) -> ProxyEndpoint:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                answer = ready.result(timeout=0.1)
            except FutureTimeout:
                answer = None
            if answer is not None and answer[0] == "ok":
                return answer[1]
            if answer is not None or self.process.poll() is not None:
                raise ShardLost(f"did not start: exited with code {self.process.wait(timeout=5)}")
            if time.monotonic() > deadline:
                raise ShardLost(f"did not start within {timeout_s:g} s")

    def read_answers(self) -> None:
        """The shard's answers, each to the control call that waits for it (runs in a thread of its own)."""
        why = "control socket closed"
        try:
            while True:
                call_id, answer = self.conn.recv()
                future = self.waiting.pop(call_id, None)
                if future is not None:
                    future.set_result(answer)
        except (EOFError, OSError) as exc:
            why = f"control socket closed ({type(exc).__name__})"
        for future in list(self.waiting.values()):
            future.set_result(("lost", why))
        self.waiting.clear()

    def call(self, message: tuple[Any, ...], timeout_s: float) -> Any:
        """Send a control call and wait for its answer (from any thread); the shard's own error is raised
        again here (KeyError and ValueError as themselves), a lost shard as `ShardLost`."""
        if self.process.poll() is not None:
            raise ShardLost(f"exited with code {self.process.returncode}")
        call_id, answer = next(self.ids), Future()
        self.waiting[call_id] = answer
        try:
            with self.send_lock:
                self.conn.send((call_id, message))
        except (EOFError, OSError) as exc:
            self.waiting.pop(call_id, None)
            raise ShardLost(f"control socket broke: {exc!r}") from exc
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                result = answer.result(timeout=0.5)
                break
            except FutureTimeout:
                if self.process.poll() is not None:
                    raise ShardLost(f"exited with code {self.process.returncode}") from None
                if time.monotonic() > deadline:
                    self.waiting.pop(call_id, None)
                    raise ShardLost(f"did not answer {message[0]!r} within {timeout_s:g} s") from None
        if result[0] == "lost":
            code = self.process.wait(timeout=5) if self.process.poll() is None else self.process.returncode
            raise ShardLost(f"exited with code {code}" if code is not None else result[1])
        if result[0] == "error":
            _, name, text = result
            raise {"KeyError": KeyError, "ValueError": ValueError}.get(name, RuntimeError)(text)
        return result[1]

    def rss_mb(self) -> float | None:
        """Its resident memory now (None once it has exited)."""
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return None
        line = next((x for x in status.splitlines() if x.startswith("VmRSS:")), None)
        return int(line.split()[1]) / 1024 if line and self.process.poll() is None else None
