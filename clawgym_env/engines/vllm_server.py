"""vLLM as servers: start (or connect to) N vLLM OpenAI-compatible servers and use them as one engine.

The server and the pool over servers in one module, past 500 lines, because the pool's routing, versions and
weight updates depend on how each server is started and watched.

`VLLMServer` runs `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 with the settings the
in-process engine uses (prefix caching, processed logprobs, ClawGym's worker extension, CPU defaults) and
`VLLM_SERVER_DEV_MODE=1`, which opens `/collective_rpc` and `/reset_prefix_cache`.

`VLLMServerPool` is the `InferenceEngine` over them; each server is reached through a `RemoteEngine`:
- Weights: `update_weights` waits for calls in flight, writes the state dict once as a safetensors file in
  `checkpoint_dir` (a disk every server can read), and asks every live server to load it through
  `/collective_rpc` (`clawgym_load_weights_from_file`, run by the worker extension inside vLLM's worker),
  then to reset its prefix cache. A server that fails is marked dead.
- Versions: every call runs under a policy version read on the server itself (an RPC to the worker
  extension) that is at least the one the trainer asked for; a server behind is brought up to date from the
  newest checkpoint first. A version read stands for the rest of that server life (every answer names its
  life: `server_boot.BootIdMiddleware`) until the pool loads weights: a call answered by another life (the
  server restarted, back at version 0) fails. A server that names no life is read before and after each
  call instead, and a version changed in between fails the call. Calls that read one server's version at
  once share one RPC sent after they asked (`SharedReading`).
- Routing: a call whose prompt extends an earlier call's prompt + completion (the next turn of a rollout)
  goes to the server that served it, whose prefix cache holds that context (`StickyRoutes`: a hash lookup
  per block of the prompt, one entry per rollout, so it holds at any concurrency); other calls go to the live
  server with the fewest calls in flight.
- Adapters: with servers started with LoRA on (`enable_lora=True`), `update_adapter` sends a LoRA policy's
  adapter alone (a PEFT folder in `checkpoint_dir`, about a hundredth of the merged layers), loaded on every
  server under `policy-v<version>` (`/v1/load_lora_adapter`) and served by name; the old one is unloaded.
  A full-weight update drops the adapter. Not with proxy shards that run their own clients (refused).
- Clients elsewhere: a `ShardedProxy` shard runs its own pool over the same servers (`follower_spec`); this
  pool holds every such follower (its calls end, new ones wait) before it loads weights and releases it at
  the new version after, so no call of any process spans an update.
- Failures: a dead server fails only the calls routed to it (counted in `stats.failed_calls`, raised as
  `ServerUnavailable`); new rollouts go to the others; `revive()` (called before each routing of a new
  rollout) takes a restarted server back after bringing its weights up to date.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import aiohttp
import httpx
import orjson
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from clawgym_env.engines.http_connections import Answer, Connections
from clawgym_env.engines.lora_adapter import LoraAdapter
from clawgym_env.engines.remote_engine import RemoteEngine
from clawgym_env.engines.server_boot import BOOT_ENV, BOOT_HEADER, new_boot_id
from clawgym_env.engines.shared_reading import SharedReading
from clawgym_env.engines.sticky_routes import Match, StickyRoutes
from clawgym_env.engines.weight_broadcast import Backend, WeightGroup, default_backend, manifest
from clawgym_env.interfaces import Generation, SamplingParams, TokenChunk
from clawgym_env.loop_thread import LoopThread

log = logging.getLogger(__name__)


def closed_under_request(exc: BaseException) -> bool:
    """The server closed or reset a kept-alive connection as a request went out on it: it is alive (a dead one
    refuses the new connection: a `ClientConnectorError`, not retried)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False
    return isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError)


_JSON = {"content-type": "application/json"}

# what a failed RPC raises: the transport's errors, its timeouts, and a server that answered wrongly
RPC_ERRORS = (aiohttp.ClientError, TimeoutError)


class ServerUnavailable(RuntimeError):
    """The server a call was routed to is down, or could not be brought to the requested policy version."""


class ServerChanged(ServerUnavailable):
    """The server's policy changed under a call (a restart, a reload): the server is taken out until revived."""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What torchrun tells its workers: a server started from a trainer rank must not inherit them (vLLM would
# read the trainer's rank, world size and rendezvous address as its own).
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")
LAUNCHER_VARS += ("ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _is_launcher_var(name: str) -> bool:
    return name in LAUNCHER_VARS or name.startswith("TORCHELASTIC_")


class VLLMServer:
    """One vLLM OpenAI-compatible server process on loopback (started here; `stop()` ends it)."""

    def __init__(
        self,
        model: str,
        *,
        port: int | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        served_model_name: str = "policy",
        max_batch_size: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        enable_lora: bool = False,
        max_lora_rank: int = 16,
        extra_args: Sequence[str] = (),
        log_path: str | os.PathLike[str] | None = None,
        python: str = sys.executable,
    ) -> None:
        """enable_lora: the server loads LoRA adapters at run time (`/v1/load_lora_adapter`), each served under
        its own model name; `max_lora_rank` must be at least the adapters' rank."""
        from clawgym_env.engines.cache import cache_root
        from clawgym_env.engines.models import KNOWN_MODELS, ensure_model

        self.model_path = str(ensure_model(model)) if model in KNOWN_MODELS else model
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.served_model_name = served_model_name
        self.log_path = Path(log_path) if log_path else Path(tempfile.gettempdir()) / f"clawgym-vllm-{self.port}.log"
        self.cmd = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model_path,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            served_model_name,
            "--dtype",
            dtype,
            "--enable-prefix-caching",
            "--logprobs-mode",
            "processed_logprobs",
            "--worker-extension-cls",
            "clawgym_env.engines.vllm_engine.ClawGymWorkerExtension",
            "--middleware",  # every answer names the server life (the pool checks versions without an RPC)
            "clawgym_env.engines.server_boot.BootIdMiddleware",
        ]
        if max_model_len:
            self.cmd += ["--max-model-len", str(max_model_len)]
        if max_batch_size:
            self.cmd += ["--max-num-seqs", str(max_batch_size)]
        self.enable_lora = enable_lora
        if enable_lora:  # two adapters at once: the one being served and the next, loaded before the old goes
            self.cmd += ["--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", "2"]
        self.cmd += list(extra_args) or self._device_args(kv_cache_memory_bytes)
        repo = str(Path(__file__).resolve().parents[2])
        self.env = {
            **{k: v for k, v in os.environ.items() if not _is_launcher_var(k)},
            "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc and /reset_prefix_cache
            "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(cache_root().parent / "vllm")),
            "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p),
            "HF_HUB_OFFLINE": "1",
        }
        if enable_lora:
            self.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # opens /v1/load_lora_adapter
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def _device_args(kv_cache_memory_bytes: int | None) -> list[str]:
        from clawgym_env.engines.vllm_engine import CPU_KV_CACHE_BYTES, on_cpu

        if on_cpu():  # see vllm_engine.device_defaults
            kv_bytes = str(kv_cache_memory_bytes or CPU_KV_CACHE_BYTES)
            return ["--kv-cache-memory-bytes", kv_bytes, "--enforce-eager", "--no-enable-chunked-prefill"]
        if kv_cache_memory_bytes:
            return ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)]
        return []

    def start(self) -> VLLMServer:
        env = {**self.env, BOOT_ENV: new_boot_id()}  # a new life: its answers carry a new id
        from clawgym_env.engines.vllm_engine import on_cpu

        if on_cpu():  # several servers share the cores: no pinning of every server's threads to core 0
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            env.setdefault("OMP_NUM_THREADS", "1")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return self

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise ServerUnavailable(f"vLLM server on port {self.port} exited with {self.proc.returncode}:\n{tail}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise ServerUnavailable(
            f"vLLM server on port {self.port} not ready after {timeout_s:.0f} s; log: {self.log_path}"
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Kill the server at once (its process group: vLLM's engine-core process goes too)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


# VLLMServerPool's own options
POOL_OPTIONS = ("checkpoint_dir", "timeout_s", "policy_version", "supports_adapters")
POOL_OPTIONS += ("weight_transfer", "broadcast_backend", "broadcast_host", "broadcast_timeout_s")


class _AnsweredBy:
    """Told a generation's answer headers (`RemoteEngine`'s `answered`): keeps the server life that answered."""

    boot: str | None = None

    def __call__(self, headers: Mapping[str, str]) -> None:
        self.boot = headers.get(BOOT_HEADER)


class PoolFollower(Protocol):
    """A client of the pool's servers in another process (a proxy shard's own `VLLMServerPool`), which the
    pool holds before it loads weights and releases after (called from a worker thread; each may block)."""

    def hold(self) -> None: ...

    def release(self, version: int, checkpoint: Path | None) -> None: ...

    def report(self) -> list[dict[str, Any]]: ...


@dataclass
class ServerSlot:
    url: str
    client: RemoteEngine
    version: SharedReading[tuple[int, str | None]]  # (its policy version, its life's id): one RPC shared by the
    # calls that check it at once
    life: tuple[str, int] | None = None  # (this life's id, the version read in it): no RPC per call while it holds
    alive: bool = True
    in_flight: int = 0
    served: int = 0


@dataclass
class PoolStats:
    calls: int = 0
    failed_calls: int = 0  # calls that hit a dead server or a version check
    routed_by_context: int = 0  # calls sent to the server holding the context they continue (next turns)
    servers_lost: int = 0
    servers_revived: int = 0
    weight_updates: int = 0
    weight_update_s: float = 0.0
    broadcast_failures: int = 0  # broadcast updates that fell back to the disk checkpoint


class VLLMServerPool:
    """One `InferenceEngine` over N vLLM servers (see the module docstring for routing and versions)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        model: str = "policy",
        timeout_s: float = 600.0,
        policy_version: int = 0,
        servers: Sequence[VLLMServer] = (),
        weight_transfer: Literal["disk", "broadcast"] = "disk",
        broadcast_backend: Backend | None = None,
        broadcast_host: str = "127.0.0.1",
        broadcast_timeout_s: float = 120.0,
        down: Sequence[str] = (),
        supports_adapters: bool = False,
    ) -> None:
        """down: servers to start as lost (a follower of a pool that lost them; `revive` takes them back).
        supports_adapters: the servers were started with LoRA enabled (`VLLMServer(enable_lora=True)`)."""
        if weight_transfer not in ("disk", "broadcast"):
            raise ValueError(f"weight_transfer must be 'disk' or 'broadcast', got {weight_transfer!r}")
        if not urls:
            raise ValueError("VLLMServerPool needs at least one server URL")
        self.slots = [
            ServerSlot(
                url,
                RemoteEngine(url, api="vllm", model=model, timeout_s=timeout_s, retries=1),
                SharedReading(functools.partial(self._read_version, url)),
            )
            for url in urls
        ]
        for slot in self.slots:
            slot.alive = slot.url not in down
        # without a shared folder the checkpoints go to a temporary one, removed on close or at exit (each
        # holds a full model: gigabytes per run otherwise left behind in /tmp)
        self._temp_dir = None if checkpoint_dir else tempfile.TemporaryDirectory(prefix="clawgym-weights-")
        self.checkpoint_dir = Path(checkpoint_dir or self._temp_dir.name)  # type: ignore[union-attr]
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.latest_checkpoint: Path | None = None
        self.policy_version = policy_version
        self.served_version = policy_version  # that of the last weight update that finished
        self.routes: StickyRoutes[ServerSlot] = StickyRoutes()  # which server holds each rollout's context
        self.servers = list(servers)  # the processes this pool started (closed with it)
        self.stats = PoolStats()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._resume = asyncio.Event()
        self._resume.set()
        self._timeout_s = timeout_s
        self._http: Connections | None = None  # opened on the pool's loop (`_connections`)
        # its HTTP clients work on the loop that first uses them only; callers come from many (clawgym_env/loop_thread.py)
        self._engine_loop = LoopThread("clawgym-vllm-pool")
        self._revive_lock = asyncio.Lock()
        self.weight_transfer = weight_transfer
        self.broadcast_backend: Backend = broadcast_backend or default_backend()
        self.broadcast_host = broadcast_host  # the address the servers' workers reach this process at
        self.broadcast_timeout_s = broadcast_timeout_s  # joining, and each tensor's broadcast
        self._group: WeightGroup | None = None
        self._group_urls: list[str] = []  # the servers in the group, in rank order
        self._checkpoint_written: asyncio.Task[None] | None = None
        self.model = model
        self._followers: list[PoolFollower] = []  # shard clients of these servers, held around weight updates
        self.supports_adapters = supports_adapters
        self.adapter: tuple[str, Path] | None = None  # the LoRA adapter served on the base weights: (name, folder)

    @classmethod
    def launch(cls, model: str, n: int = 1, *, ready_timeout_s: float = 900.0, **server_options: Any) -> VLLMServerPool:
        """Start `n` servers of `model` on free loopback ports and wait until all answer.

        `checkpoint_dir` and `timeout_s` go to the pool; the other options to each `VLLMServer`."""
        pool_options = {k: server_options.pop(k) for k in POOL_OPTIONS if k in server_options}
        pool_options.setdefault("supports_adapters", bool(server_options.get("enable_lora")))
        servers = [VLLMServer(model, **server_options).start() for _ in range(n)]
        try:
            for server in servers:
                server.wait_ready(ready_timeout_s)
        except BaseException:
            for server in servers:
                server.stop()
            raise
        return cls([s.url for s in servers], servers=servers, **pool_options)

    # ------------------------------------------------------------------------------------ server RPCs
    def _connections(self) -> Connections:
        """The RPCs' connections (aiohttp's: no cap, O(1) per request; weight loads and broadcasts to every
        server go out at once, and the version checks of one server's calls, shared), on the pool's own loop."""
        if self._http is None:
            self._http = Connections(connect_timeout_s=5.0, read_timeout_s=self._timeout_s)
        return self._http

    async def _post(self, url: str, body: Any = None) -> Answer:
        """POST to a server, again if the kept-alive connection it went out on was closed under it.

        A server may close a connection right after an error answer; a request already sent on it then fails
        with a read or protocol error although the server is alive, and the server would be counted lost
        (seen in CI, after a failed broadcast join). The pool's RPCs are idempotent (versions, loads of a
        file, leaving a group, resetting the prefix cache); a dead server refuses the new connection, which
        is not retried.
        """
        retrying = AsyncRetrying(
            stop=stop_after_attempt(3),
            wait=wait_exponential(multiplier=0.05, max=0.5),
            retry=retry_if_exception(closed_under_request),
            reraise=True,
        )
        content = orjson.dumps(body) if body is not None else b""
        return await retrying(self._connections().request, "POST", url, headers=_JSON, content=content)

    async def _rpc(self, url: str, method: str, *args: str) -> list[Any]:
        return orjson.loads((await self._rpc_answer(url, method, *args)).content)["results"]

    async def _rpc_answer(self, url: str, method: str, *args: str) -> Answer:
        response = await self._post(f"{url}/collective_rpc", {"method": method, "args": list(args)})
        if response.status != 200:
            raise ServerUnavailable(
                f"{url}/collective_rpc {method} answered {response.status}: "
                f"{response.content[:300].decode(errors='replace')}"
            )
        return response

    async def server_version(self, url: str) -> int:
        """The policy version loaded in every worker of the server (the lowest, if they differ)."""
        return await self._engine_loop.call(self._server_version(url))

    async def _server_version(self, url: str) -> int:
        return (await self._read_version(url))[0]

    async def _read_version(self, url: str) -> tuple[int, str | None]:
        """(the server's policy version, the id of the server life that answered, if it sends one)."""
        answer = await self._rpc_answer(url, "clawgym_get_policy_version")
        versions = orjson.loads(answer.content)["results"]
        return min(int(v) for v in versions), answer.headers.get(BOOT_HEADER)

    async def _load(self, slot: ServerSlot, checkpoint: Path, version: int) -> None:
        slot.life = None  # its version is read again before the next call
        await self._rpc(slot.url, "clawgym_load_weights_from_file", str(checkpoint), str(version))
        response = await self._post(f"{slot.url}/reset_prefix_cache")
        if response.status != 200:
            raise ServerUnavailable(f"{slot.url}/reset_prefix_cache answered {response.status}")
        self.routes.forget_server(slot)  # its prefix cache is reset: no context is left there

    def _lose(self, slot: ServerSlot) -> None:
        slot.life = None
        if slot.alive:
            slot.alive = False
            self.stats.servers_lost += 1

    async def _ensure_version(self, slot: ServerSlot) -> int:
        """The server's version, after loading the newest checkpoint if it is behind the requested one; kept
        as the version of the server life that answered (`slot.life`), when the server names it."""
        version, boot = await slot.version.fresh()
        if version < self.policy_version:
            if self._checkpoint_written is not None:  # a broadcast update's file, written after it
                await self._checkpoint_written
            if self.latest_checkpoint is None and self.adapter is None:
                raise ServerUnavailable(
                    f"{slot.url} has policy version {version} < {self.policy_version} and no checkpoint"
                )
            if self.latest_checkpoint is not None:
                await self._load(slot, self.latest_checkpoint, self.policy_version)
            if self.adapter is not None:  # a LoRA policy: its adapter on the base weights (or on the checkpoint's)
                await self._load_adapter(slot, *self.adapter, self.policy_version, None)
            version, boot = await slot.version.fresh()
        slot.life = (boot, version) if boot is not None else None
        return version

    async def revive(self) -> None:
        """Take back dead servers that answer again (restarted), once their weights are up to date."""
        await self._engine_loop.call(self._revive())

    async def _revive(self) -> None:
        async with self._revive_lock:  # concurrent new rollouts probe once
            await self._revive_unlocked()

    async def _revive_unlocked(self) -> None:
        for slot in self.slots:
            if slot.alive:
                continue
            try:
                if (await self._connections().request("GET", f"{slot.url}/health", timeout_s=2)).status != 200:
                    continue
                if await self._ensure_version(slot) >= self.policy_version:
                    slot.alive = True
                    self.routes.forget_server(slot)
                    self.stats.servers_revived += 1
            except (*RPC_ERRORS, ServerUnavailable):
                continue

    # ------------------------------------------------------------------------------------------ routing
    async def _route(self, prompt_ids: list[int]) -> tuple[ServerSlot, Match[ServerSlot]]:
        """The server holding the context this prompt continues (`StickyRoutes`), else the least busy live one;
        with the lookup, which the call's own sequence is recorded with."""
        match = self.routes.find(prompt_ids)
        if match.found is not None:
            slot = match.found.server
            if not slot.alive:
                raise ServerUnavailable(f"{slot.url} holding this rollout is down")
            self.stats.routed_by_context += 1
            return slot, match
        if not all(s.alive for s in self.slots):
            await self._revive()
        live = [s for s in self.slots if s.alive]
        if not live:
            raise ServerUnavailable(f"all {len(self.slots)} vLLM servers are down")
        return min(live, key=lambda s: (s.in_flight, s.served)), match

    @contextlib.asynccontextmanager
    async def _one_call(self, prompt_ids: list[int]) -> AsyncIterator[tuple[ServerSlot, int, Match[ServerSlot]]]:
        """Route one call and hold its server: (the server, the policy version it serves, the routing lookup
        to record the call's sequence with). The server must serve at least the version the trainer last
        pushed; a failure inside is counted and, when it is the server's fault (unreachable, or its version
        changed during the call), the server is lost."""
        await self._resume.wait()  # a weight update is in progress
        self.stats.calls += 1
        try:
            slot, match = await self._route(prompt_ids)
        except ServerUnavailable:
            self.stats.failed_calls += 1
            raise
        required = self.policy_version
        slot.in_flight += 1
        self._in_flight += 1
        self._idle.clear()
        try:
            life = slot.life
            # a version read in this server life stands until the pool loads weights (each answer's life id is
            # checked after the call); otherwise it is read now
            before = life[1] if life is not None and life[1] >= required else await self._ensure_version(slot)
            if before < required:
                raise ServerUnavailable(
                    f"{slot.url} serves policy version {before}, older than the requested {required}"
                )
            yield slot, before, match
        except (*RPC_ERRORS, ServerUnavailable, OSError) as exc:
            self.stats.failed_calls += 1
            if not isinstance(exc, ServerUnavailable) or isinstance(exc, ServerChanged):
                self._lose(slot)
            if isinstance(exc, ServerUnavailable):
                raise
            raise ServerUnavailable(f"{slot.url} failed: {exc!r}") from exc
        finally:
            slot.in_flight -= 1
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
        slot.served += 1

    async def _check_unchanged(self, slot: ServerSlot, before: int, answered_by: str | None) -> None:
        """A server restarted (or reloaded) while generating did not give one policy's output.

        answered_by: the life id on the generation's answer. The same life as the version's: the same version
        (only the pool loads weights, and not during calls). Another: the server restarted. None (a server
        without `BootIdMiddleware`): the version is read again.
        """
        life = slot.life
        if answered_by is not None and life is not None:
            if answered_by != life[0]:
                raise ServerChanged(
                    f"{slot.url} restarted: the call was answered by another server life than its version's "
                    "(during the call or before it)"
                )
            if life[1] != before:  # the pool loaded weights since the call began (it may have begun on a revive)
                raise ServerChanged(f"{slot.url} changed policy version {before} -> {life[1]} during the call")
            return
        after, _ = await slot.version.fresh()
        if after != before:
            raise ServerChanged(f"{slot.url} changed policy version {before} -> {after} during the call")

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        return await self._engine_loop.call(self._generate(prompt_ids, sampling))

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        async with self._one_call(prompt_ids) as (slot, version, match):
            answer = _AnsweredBy()
            gen = await slot.client.generate(prompt_ids, sampling, answered=answer)
            await self._check_unchanged(slot, version, answer.boot)
        self.routes.record([*prompt_ids, *gen.token_ids], slot, match)
        return gen.model_copy(update={"policy_version": version})

    async def stream(
        self, prompt_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> AsyncIterator[TokenChunk]:
        """`generate()` with the server's `stream: true`: same routing and version checks; the check after
        the call runs before the last chunk goes out, so a version change mid-stream fails the stream."""
        async for chunk in self._engine_loop.stream(lambda: self._stream(prompt_ids, sampling)):
            yield chunk

    async def _stream(self, prompt_ids: list[int], sampling: SamplingParams) -> AsyncIterator[TokenChunk]:
        ids: list[int] = []
        async with self._one_call(prompt_ids) as (slot, version, match):
            answer = _AnsweredBy()
            async for chunk in slot.client.stream(prompt_ids, sampling, answered=answer):
                ids += chunk.token_ids
                if chunk.finish_reason is not None:
                    await self._check_unchanged(slot, version, answer.boot)
                yield TokenChunk(chunk.token_ids, chunk.logprobs, chunk.finish_reason, version)
        self.routes.record([*prompt_ids, *ids], slot, match)

    def report(self) -> dict[str, Any]:
        """The pool's counts and each server's share of the calls (for a run's summary)."""
        servers = [{"url": s.url, "alive": s.alive, "served": s.served} for s in self.slots]
        report = {"policy_version": self.policy_version, "servers": servers, **asdict(self.stats)}
        report["adapter"] = self.adapter[0] if self.adapter is not None else None
        if self._followers:  # the clients in other processes (proxy shards): their own counts, one report each
            report["followers"] = [r for f in self._followers for r in f.report()]
        return report

    # ------------------------------------------------------------------------------ clients elsewhere
    def follower_spec(self) -> dict[str, Any]:
        """How another process (a `ShardedProxy` shard) builds its own client of these servers: a pool that
        never updates weights itself; this pool holds and releases it around each update (`add_follower`)."""
        options = {"urls": [s.url for s in self.slots], "model": self.model, "timeout_s": self._timeout_s}
        # the version of the last finished update: one made during an update must not load a checkpoint older
        # than the version it is asked for (the update's own file is not written yet)
        options |= {"policy_version": self.served_version, "checkpoint_dir": str(self.checkpoint_dir)}
        options["down"] = [s.url for s in self.slots if not s.alive]  # it takes them back as this pool does
        return {"factory": "clawgym_env.engines.vllm_server:VLLMServerPool", "options": options}

    def add_follower(self, follower: PoolFollower) -> None:
        self._followers.append(follower)

    def remove_follower(self, follower: PoolFollower) -> None:
        with contextlib.suppress(ValueError):
            self._followers.remove(follower)

    async def hold(self) -> None:
        """Pause: new calls wait, and this returns once the calls in flight have ended (what an update does
        to its own calls, done to a follower by the pool that updates)."""
        await self._engine_loop.call(self._hold())

    async def _hold(self) -> None:
        """Pause this pool (an update's first step): new calls wait for `_resume`, the ones in flight end, and
        every server's version is read again before its next call."""
        self._resume.clear()
        await self._idle.wait()
        for slot in self.slots:
            slot.life = None

    async def release(self, version: int, checkpoint: str | os.PathLike[str] | None = None) -> None:
        """Go on at `version` (the servers now serve it); `checkpoint`: the file a restarted server loads."""
        await self._engine_loop.call(self._release(version, checkpoint))

    async def _release(self, version: int, checkpoint: str | os.PathLike[str] | None) -> None:
        self.policy_version = version
        self.latest_checkpoint = Path(checkpoint) if checkpoint else self.latest_checkpoint
        for slot in self.slots:
            slot.life = None  # read again in this life: the version it names is the new one
        self._resume.set()

    # ---------------------------------------------------------------------------------------- weights
    async def aupdate_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Send the weights to every live server, reset their prefix caches, bump the version.

        `weight_transfer="disk"`: one checkpoint file that every server loads. `"broadcast"`: a process-group
        broadcast from this process to every server's workers (NCCL on GPUs, gloo on CPU); the checkpoint
        file is still written, after the servers resume, for servers that come back later. A failed
        broadcast falls back to the file (counted in `stats.broadcast_failures`)."""
        await self._engine_loop.call(self._update_weights(state_dict, version))

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Blocking form for a trainer thread (not for the pool's own loop)."""
        self._engine_loop.run(self._update_weights(state_dict, version), "use `await pool.aupdate_weights(...)`")

    async def checkpoint_written(self) -> Path | None:
        """Wait for the checkpoint file a broadcast update writes after it; the newest checkpoint."""

        async def wait() -> None:
            if self._checkpoint_written is not None:
                await self._checkpoint_written

        await self._engine_loop.call(wait())
        return self.latest_checkpoint

    @contextlib.asynccontextmanager
    async def _updating(self, version: int) -> AsyncIterator[None]:
        """Around one update (weights or adapter): new calls wait and the ones in flight end, here and in every
        follower; once it succeeded it is counted and `version` is served; calls go on either way."""
        try:
            await self._hold()  # new calls wait, the ones in flight end; every version is read again after
            started = time.perf_counter()
            for follower in self._followers:  # clients in other processes: their calls end and wait too
                await asyncio.to_thread(follower.hold)
            yield
            self.stats.weight_updates += 1
            self.stats.weight_update_s += time.perf_counter() - started
            self.served_version = version
        finally:
            self._resume.set()
            for follower in self._followers:  # also after a failed update: no follower stays held
                await asyncio.to_thread(follower.release, self.policy_version, self.latest_checkpoint)

    async def _update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        from clawgym_env.engines.vllm_engine import dedup_tied

        async with self._updating(version):
            if self._checkpoint_written is not None:
                await self._checkpoint_written
            path = self.checkpoint_dir / f"policy-v{version}.safetensors"
            old, live = self.latest_checkpoint, [s for s in self.slots if s.alive]
            tensors = await asyncio.to_thread(dedup_tied, state_dict)
            self.policy_version = version
            if self.adapter is not None:  # full weights replace base + adapter: the adapter would apply twice
                await asyncio.gather(*(self._unload_adapter(s, self.adapter[0]) for s in live), return_exceptions=True)
                self._serve_as(self.model)
                await asyncio.to_thread(shutil.rmtree, self.adapter[1], True)
                self.adapter = None
            done: list[ServerSlot] = []
            if self.weight_transfer == "broadcast" and live:
                live = await self._reachable(live)  # a dead member would stall the broadcast until its timeout
                try:
                    await self._broadcast(tensors, version, live)
                    done = live
                except Exception:
                    log.warning("weight broadcast failed; loading the checkpoint file instead", exc_info=True)
                    self.stats.broadcast_failures += 1
                    await self._leave_group()
            if done:  # the file is for servers that come back later: off the step's critical path
                self._checkpoint_written = asyncio.create_task(self._write_checkpoint(tensors, path, old))
            else:
                await self._write_checkpoint(tensors, path, old)
                results = await asyncio.gather(*(self._load(s, path, version) for s in live), return_exceptions=True)
                for slot, result in zip(live, results):
                    if isinstance(result, BaseException):
                        log.warning("%s could not load %s: %s: %s", slot.url, path.name, type(result).__name__, result)
                        self._lose(slot)

    # ---------------------------------------------------------------------------------------- adapters
    async def aupdate_adapter(self, adapter: LoraAdapter, version: int) -> None:
        """Serve `adapter` (a LoRA policy's low-rank tensors, on the base weights) from every live server as
        `version`: see `update_adapter`."""
        await self._engine_loop.call(self._update_adapter(adapter, version))

    def update_adapter(self, adapter: LoraAdapter, version: int) -> None:
        """Write the adapter once as a PEFT folder in `checkpoint_dir`, load it on every live server under
        the name `policy-v<version>` (`/v1/load_lora_adapter`), serve every later call under that name, and
        unload the previous one. vLLM keys its prefix cache by adapter, so no cached prompt of the old
        adapter is reused. Calls in flight end first and new ones wait, as for full weights. Needs servers
        started with `enable_lora=True`; a server that comes back later loads the newest adapter."""
        self._engine_loop.run(self._update_adapter(adapter, version), "use `await pool.aupdate_adapter(...)`")

    async def _update_adapter(self, adapter: LoraAdapter, version: int) -> None:
        if not self.supports_adapters:
            raise RuntimeError(
                "update_adapter needs vLLM servers started with enable_lora=True (VLLMServerPool.launch(..., "
                "enable_lora=True, max_lora_rank=R), or supports_adapters=True for servers started so)"
            )
        if self._followers:
            raise RuntimeError(
                "adapter sync is not supported when proxy shards run their own clients of these servers: start "
                "the ShardedProxy with engines_in_shards=False, or push merged weights (model.lora.sync=merged)"
            )
        async with self._updating(version):
            name, folder = f"policy-v{version}", self.checkpoint_dir / f"adapter-v{version}"
            await asyncio.to_thread(adapter.save, folder)
            old, live = self.adapter, [s for s in self.slots if s.alive]
            self.policy_version = version
            results = await asyncio.gather(
                *(self._load_adapter(s, name, folder, version, old) for s in live), return_exceptions=True
            )
            for slot, result in zip(live, results):
                if isinstance(result, BaseException):
                    log.warning("%s could not load adapter %s: %s: %s", slot.url, name, type(result).__name__, result)
                    self._lose(slot)
            self._serve_as(name)
            self.adapter = (name, folder)
            if old is not None and old[1] != folder:
                await asyncio.to_thread(shutil.rmtree, old[1], True)

    async def _load_adapter(
        self, slot: ServerSlot, name: str, folder: Path, version: int, old: tuple[str, Path] | None
    ) -> None:
        """Load adapter `name` on one server, unload `old`, and set the version the server serves."""
        slot.life = None  # its version is read again before the next call
        response = await self._post(f"{slot.url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
        already = response.status == 400 and b"already" in response.content  # a server that kept it (not restarted)
        if response.status != 200 and not already:
            raise ServerUnavailable(
                f"{slot.url}/v1/load_lora_adapter answered {response.status}: "
                f"{response.content[:300].decode(errors='replace')}"
            )
        if old is not None:
            await self._unload_adapter(slot, old[0])
        await self._rpc(slot.url, "clawgym_set_policy_version", str(version))
        self.routes.forget_server(slot)  # the contexts it holds were computed with the old adapter

    async def _unload_adapter(self, slot: ServerSlot, name: str) -> None:
        """Unload one adapter from a server; one it does not hold (it restarted since) is not an error."""
        response = await self._post(f"{slot.url}/v1/unload_lora_adapter", {"lora_name": name})
        if response.status not in (200, 400, 404):
            raise ServerUnavailable(f"{slot.url}/v1/unload_lora_adapter answered {response.status}")

    def _serve_as(self, name: str) -> None:
        """Every later call asks the servers for model `name` (an adapter's name, or the base model's)."""
        for slot in self.slots:
            slot.client.model = name

    async def _write_checkpoint(self, tensors: Mapping[str, Any], path: Path, old: Path | None) -> None:
        from clawgym_env.engines.vllm_engine import save_weights

        await asyncio.to_thread(save_weights, tensors, path)
        self.latest_checkpoint = path
        if old is not None and old != path:
            old.unlink(missing_ok=True)

    async def _reachable(self, slots: list[ServerSlot]) -> list[ServerSlot]:
        """The servers that answer an RPC now; the others are lost."""
        answers = await asyncio.gather(*(self.server_version(s.url) for s in slots), return_exceptions=True)
        for slot, answer in zip(slots, answers):
            if isinstance(answer, BaseException):
                self._lose(slot)
        return [s for s in slots if s.alive]

    async def _join_group(self, live: list[ServerSlot]) -> None:
        """A broadcast group of this process (rank 0) and every worker of the live servers."""
        await self._leave_group()
        workers = [len(await self._rpc(s.url, "clawgym_get_policy_version")) for s in live]  # one result per worker
        world, port = 1 + sum(workers), free_port()
        offsets = [1 + sum(workers[:i]) for i in range(len(live))]
        joins = [
            asyncio.create_task(
                self._rpc(
                    s.url,
                    "clawgym_join_weight_group",
                    self.broadcast_host,
                    str(port),
                    str(o),
                    str(world),
                    self.broadcast_backend,
                )
            )
            for s, o in zip(live, offsets)
        ]
        try:
            self._group = await asyncio.to_thread(
                WeightGroup, self.broadcast_host, port, 0, world, self.broadcast_backend, self.broadcast_timeout_s
            )
        finally:
            await asyncio.gather(*joins)
        self._group_urls = [s.url for s in live]

    async def _leave_group(self) -> None:
        if self._group is None:
            return
        for url in self._group_urls:
            with contextlib.suppress(*RPC_ERRORS, ServerUnavailable):
                await self._rpc(url, "clawgym_leave_weight_group")
        self._group.close()
        self._group, self._group_urls = None, []

    async def _broadcast(self, tensors: Mapping[str, Any], version: int, live: list[ServerSlot]) -> None:
        if self._group is None or self._group_urls != [s.url for s in live]:  # membership changed: a new group
            await self._join_group(live)
        assert self._group is not None
        specs = manifest(tensors)
        receives = [asyncio.create_task(self._rpc(s.url, "clawgym_receive_weights", specs, str(version))) for s in live]
        try:
            await asyncio.to_thread(self._group.send, tensors)
        finally:
            await asyncio.gather(*receives)
        for slot in live:
            response = await self._post(f"{slot.url}/reset_prefix_cache")
            if response.status != 200:
                raise ServerUnavailable(f"{slot.url}/reset_prefix_cache answered {response.status}")
            self.routes.forget_server(slot)

    async def aclose(self) -> None:
        """Close the HTTP clients and stop the servers this pool started."""
        if not self._engine_loop.loop.is_closed():
            await self._engine_loop.call(self._close_clients())
            self._engine_loop.close()
        for server in self.servers:
            server.stop()

    def close(self) -> None:
        """Blocking `aclose` (from any thread but the pool's own loop)."""
        if not self._engine_loop.loop.is_closed():
            self._engine_loop.run(self._close_clients())
            self._engine_loop.close()
        for server in self.servers:
            server.stop()

    async def _close_clients(self) -> None:
        if self._checkpoint_written is not None:  # a broadcast's file, still being written into the folder
            with contextlib.suppress(Exception):
                await self._checkpoint_written
        for slot in self.slots:
            await slot.client.aclose()
        if self._http is not None:
            await self._http.aclose()
        if self._temp_dir is not None:
            self._temp_dir.cleanup()
