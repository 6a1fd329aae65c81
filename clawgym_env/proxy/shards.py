"""`ShardedProxy`: one proxy made of several processes, for more calls per second than one process serves.

One `ServingProxy` is one Python process; its CPU per call is spread thin over HTTP, parsing, rendering,
splicing, recording and streaming (docs/proxy.md), so past ~2,000 calls per second the way up is more
processes. A `ShardedProxy` starts N shard processes, each a whole `ServingProxy` on its own socket (and
port) with its own durable log (`run_dir/shard-K/calls.jsonl`), and one route table here: which shard
serves which rollout. A rollout's calls all go to its shard, so everything a call needs from the
rollout's earlier calls (splicing, the prefix check, budgets) stays in one process.

- The sandbox of a rollout is created before its route opens, so the shard is chosen first:
  `endpoint_for(rollout_id)` picks the live shard with the fewest open rollouts and gives its endpoint;
  `open_rollout` then opens the route on that shard.
- Engines stay in this process (clawgym_env.proxy.engine_hub): a shard's calls generate with the
  policy object the trainer made and updates, through the `EngineHub` here. An engine that is a client of
  servers anyway (`VLLMServerPool`) gets a client in each shard instead (`follower_spec`), which the
  engine holds and releases around its weight updates (`ShardsFollowing`).
- Control calls (open, close, stats, the white-box loop's in-process records) go over a socket per shard
  and wait for the shard's answer, so they keep `ServingProxy`'s synchronous API; each carries an id, so
  calls from several threads do not wait behind each other.
- A shard that dies is counted (`shard_failures`), gets no new rollouts, and its open rollouts' calls are
  read back from its durable log when they close: nothing it recorded is lost. A new process takes its
  place (`respawned`, at most `max_respawns`), with a log of its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import pickle
import subprocess
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from clawgym_env.chat.renderers.base import check_renderer_fits_engine
from clawgym_env.engines.token_stream import can_abort
from clawgym_env.interfaces import InProcessAdmission, Policy, ProxyEndpoint, RolloutLimits, RolloutRoute
from clawgym_env.proxy.engine_hub import EngineHub
from clawgym_env.proxy.guards import GuardStats
from clawgym_env.proxy.rollout_state import RolloutStats
from clawgym_env.proxy.shard_handle import Answer, Shard, ShardLost
from clawgym_env.records import ModelCall, read_calls

log = logging.getLogger(__name__)
MAX_PENDING = 10_000  # rollouts given an endpoint but not opened yet, remembered (oldest dropped first)
SHARD_OPTIONS = (
    "host",
    "engine_timeout_s",
    "fsync",
    "keep_closed",
    "guards",
    "live_streaming",
    "stream_keepalive_s",
    "stream_min_gap_s",
)


class ShardDown(RuntimeError):
    """A proxy shard process died or stopped answering its control pipe."""


class ShardedProxy:
    """N `ServingProxy` processes behind one route table; the same API as `ServingProxy` (see module doc).

    shards: how many processes. proxy_options: `ServingProxy`'s (engine_timeout_s, fsync, guards, ...); `port`
    None (Unix sockets only) or 0 (each shard also listens on a free loopback port). control_timeout_s: how
    long a control call waits for a shard before the shard counts as dead. engines_in_shards: an engine that
    is a client of servers anyway (`VLLMServerPool`: `follower_spec()`) gets a client in each shard, so its
    client's CPU is spread over the shards too; False: every shard generates through the hub. max_respawns:
    how many dead shards are replaced by new processes over the proxy's life (each is counted first).
    """

    def __init__(
        self,
        run_dir: str | Path,
        shards: int = 2,
        *,
        port: int | None = None,
        control_timeout_s: float = 30.0,
        start_timeout_s: float = 120.0,
        engines_in_shards: bool = True,
        max_respawns: int = 8,
        **proxy_options: Any,
    ) -> None:
        if shards < 1:
            raise ValueError(f"shards={shards}: a sharded proxy needs at least one shard process")
        if port not in (None, 0):
            raise ValueError(f"port={port}: each shard listens on its own port, so pass 0 (free ports) or None")
        unknown = set(proxy_options) - set(SHARD_OPTIONS)
        if unknown:
            raise ValueError(
                f"ShardedProxy does not take {sorted(unknown)}: each shard has its own socket and log; "
                f"it takes {list(SHARD_OPTIONS)} (public_url: put one ServingProxy behind a tunnel instead)"
            )
        self.run_dir = Path(run_dir)
        self.shard_count = shards
        self._options = {**proxy_options, "unix_socket": "auto", "port": port}
        self.control_timeout_s = control_timeout_s
        self.start_timeout_s = start_timeout_s
        self.keep_closed = int(proxy_options.get("keep_closed", 1024))
        self.shards: list[Shard] = []
        self._hub = EngineHub()
        self._route_table: dict[str, Shard] = {}  # open rollout -> its shard
        self._pending: collections.OrderedDict[str, Shard] = collections.OrderedDict()  # endpoint given, not open
        self._limits: dict[str, RolloutLimits] = {}
        self.shard_failures: collections.Counter[str] = collections.Counter()  # reason -> shards lost to it
        self.recovered_rollouts = 0  # rollouts of dead shards whose calls were read back from the log
        self.closed_count = 0
        self.engines_in_shards = engines_in_shards
        self._stopping = False
        self._renderers: dict[int, tuple[Any, bytes]] = {}  # id(renderer) -> (it, pickled)
        self._following: dict[int, tuple[Any, ShardsFollowing]] = {}  # id(engine) -> (it, what it tells)
        self.max_respawns = max_respawns
        self.respawned = 0  # shard processes started in place of dead ones
        self._replacing: set[Future[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hub_path: Path | None = None

    # ------------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        if self.shards:
            return
        self._hub_path = await self._hub.start()
        launched = [self._launch(index, f"shard-{index}") for index in range(self.shard_count)]
        self.shards = [shard for shard, _ in launched]
        try:
            for shard, ready in launched:
                shard.endpoint = await self._wait_ready(shard, ready)
        except BaseException:
            await self.stop()
            raise
        self._loop = asyncio.get_running_loop()  # from now on a dead shard is replaced (on this loop)
        log.info("sharded proxy: %d shards at %s", len(self.shards), [str(s.endpoint) for s in self.shards])

    def _launch(self, index: int, folder: str) -> tuple[Shard, Future[Answer]]:
        assert self._hub_path is not None
        return Shard.launch(index, self.run_dir / folder, self._options, self._hub_path)

    async def _wait_ready(self, shard: Shard, ready: Future[Answer]) -> ProxyEndpoint:
        try:
            return await asyncio.to_thread(shard.wait_ready, ready, self.start_timeout_s)
        except ShardLost as lost:
            raise self._lose(shard, lost.why) from None

    async def _replace(self, dead: Shard) -> None:
        """A new process in a dead shard's place, with a log of its own (`shard-K.N`); the dead one's
        rollouts keep reading theirs back from its log."""
        with contextlib.suppress(subprocess.TimeoutExpired):  # reap it (killed by _lose), close its socket
            await asyncio.to_thread(dead.process.wait, 5)
        dead.conn.close()
        generation = self.respawned + 1
        if generation > self.max_respawns:
            log.error("proxy shard %d is not replaced: %d shards replaced already", dead.index, self.respawned)
            return
        self.respawned = generation
        shard, ready = self._launch(dead.index, f"shard-{dead.index}.{generation}")
        try:
            shard.endpoint = await self._wait_ready(shard, ready)
        except ShardDown:
            return  # counted by _lose
        if self._stopping or dead not in self.shards:
            shard.process.kill()
            return
        self.shards[self.shards.index(dead)] = shard
        log.warning("proxy shard %d replaced by pid %d (log %s)", dead.index, shard.process.pid, shard.log_path)

    async def stop(self) -> None:
        self._stopping = True  # shards that go now are not failures, nor replaced
        for replacing in list(self._replacing):
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(replacing)
        for shard in self.shards:
            if shard.down is None and shard.process.poll() is None:
                with contextlib.suppress(ShardDown):
                    self._call(shard, "stop", timeout_s=10)
        for shard in self.shards:
            try:
                await asyncio.to_thread(shard.process.wait, 10)
            except subprocess.TimeoutExpired:
                shard.process.kill()
                await asyncio.to_thread(shard.process.wait, 5)
            shard.conn.close()
        self.shards = []
        for engine, following in self._following.values():
            engine.remove_follower(following)
        self._following.clear()
        self._renderers.clear()
        await self._hub.stop()
        self._stopping = False

    async def __aenter__(self) -> ShardedProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ----------------------------------------------------------------------------- the control pipe
    def _call(self, shard: Shard, *message: Any, timeout_s: float | None = None) -> Any:
        """A control call to the shard, answered (from any thread); a lost shard is counted, `ShardDown`."""
        if shard.down is not None:
            raise ShardDown(f"proxy shard {shard.index} is down: {shard.down}")
        try:
            return shard.call(message, timeout_s or self.control_timeout_s)
        except ShardLost as lost:
            raise self._lose(shard, lost.why) from None

    def _lose(self, shard: Shard, why: str) -> ShardDown:
        if shard.down is None:
            shard.down = why
            if not self._stopping:
                self.shard_failures[why.split(":", 1)[0][:80]] += 1
            log.error(
                "proxy shard %d is down (%s); its %d open rollouts are read back from %s at close",
                shard.index,
                why,
                len(shard.open_rollouts),
                shard.log_path,
            )
            if shard.process.poll() is None:
                shard.process.kill()
            if not self._stopping and self._loop is not None and shard in self.shards:
                replacing = asyncio.run_coroutine_threadsafe(self._replace(shard), self._loop)
                self._replacing.add(replacing)
                replacing.add_done_callback(self._replacing.discard)
        return ShardDown(f"proxy shard {shard.index} is down: {why}")

    # -------------------------------------------------------------------------------- rollouts
    def endpoint_for(self, rollout_id: str) -> ProxyEndpoint:
        """Where the rollout's sandbox reaches the proxy: the live shard with the fewest rollouts (in turn).

        The choice is kept (among the latest `MAX_PENDING` not yet opened) so `open_rollout` opens the
        route on the shard the sandbox was bound to; a rollout whose sandbox failed never opens, and its
        entry ages out.
        """
        shard = self._route_table.get(rollout_id) or self._pending.get(rollout_id)
        if shard is None:
            for exited in [s for s in self.shards if s.down is None and s.process.poll() is not None]:
                self._lose(exited, f"exited with code {exited.process.returncode}")  # counted, replaced
            live = [s for s in self.shards if s.down is None]
            if not live:
                why = "; ".join(f"{s.index}: {s.down}" for s in self.shards) or "the proxy is not started"
                raise ShardDown(f"no live proxy shard ({why})")
            shard = min(live, key=lambda s: (len(s.open_rollouts) + s.pending, s.assigned))
            self._pending[rollout_id] = shard
            shard.pending += 1
            shard.assigned += 1
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)[1].pending -= 1
        assert shard.endpoint is not None
        return shard.endpoint

    def open_rollout(self, rollout_id: str, policy: Policy, limits: RolloutLimits | None = None) -> RolloutRoute:
        if policy.renderer is None:
            raise ValueError("policy.renderer is None: pass a renderer, e.g. ChatMLRenderer(load_qwen_tokenizer())")
        check_renderer_fits_engine(policy.renderer, policy.engine)
        if rollout_id in self._route_table:
            raise ValueError(f"rollout {rollout_id!r} was already opened on this proxy; rollout ids must be unique")
        self.endpoint_for(rollout_id)
        shard = self._pending.pop(rollout_id)
        shard.pending -= 1
        limits = limits or RolloutLimits()
        try:
            key = self._hub.register(policy)
            if key not in shard.policies:
                renderer = self._renderer_for(shard, policy.renderer)
                follower = self._follower_for(shard, policy.engine)
                abortable = can_abort(policy.engine)
                args = (key, renderer, policy.name, policy.max_context, policy.version, abortable, follower)
                self._call(shard, "policy", *args)
                shard.policies.add(key)
            route = self._call(shard, "open", rollout_id, key, limits)
        except BaseException:
            self._forget(rollout_id)
            raise
        self._route_table[rollout_id] = shard
        shard.open_rollouts.add(rollout_id)
        self._limits[rollout_id] = limits
        return route

    def _renderer_for(self, shard: Shard, renderer: Any) -> tuple[int, bytes | None]:
        """(the renderer's key, its pickled bytes unless the shard has it already). Policies made per rollout
        (a scripted engine each) share one renderer: ~8 MB pickled with a Qwen tokenizer, ~0.5 s to load, so
        it is pickled once and sent to each shard once."""
        key = id(renderer)
        if key not in self._renderers:
            self._renderers[key] = (renderer, pickle.dumps(renderer))  # the object kept: its id stays its own
        if key in shard.renderers:
            return key, None
        shard.renderers.add(key)
        return key, self._renderers[key][1]

    def _follower_for(self, shard: Shard, engine: Any) -> tuple[int, dict[str, Any] | None] | None:
        """None: the shard generates with `engine` through the hub. Else (the engine's key, how the shard builds
        its own client of it, unless it has one already): for an engine that is a client of servers anyway,
        with `engines_in_shards` on. One client per engine and shard, whatever the policies over it; the engine
        holds and releases the shards around its weight updates (`ShardsFollowing`)."""
        follower_spec = getattr(engine, "follower_spec", None)
        if not self.engines_in_shards or not callable(follower_spec):
            return None
        key = id(engine)
        if key not in self._following:  # the engine kept: its id stays its own
            following = ShardsFollowing(self, key)
            engine.add_follower(following)
            self._following[key] = (engine, following)
        if key in shard.followers:
            return key, None
        shard.followers.add(key)
        return key, follower_spec()

    def _forget(self, rollout_id: str) -> Shard | None:
        shard = self._route_table.pop(rollout_id, None)
        if shard is not None:
            shard.open_rollouts.discard(rollout_id)
        self._limits.pop(rollout_id, None)
        return shard

    def _shard_of(self, rollout_id: str) -> Shard:
        shard = self._route_table.get(rollout_id)
        if shard is None:
            raise KeyError(f"rollout {rollout_id!r} is not open on this proxy; open it with open_rollout() first")
        return shard

    def close_rollout(self, rollout_id: str) -> list[ModelCall]:
        """Close the route and return the rollout's calls; a dead shard's are read back from its log."""
        shard = self._shard_of(rollout_id)
        try:
            calls = self._call(shard, "close_rollout", rollout_id)
        except ShardDown:
            calls = sorted(read_calls(shard.log_path, rollout_id), key=lambda c: c.call_index)
            self.recovered_rollouts += 1
        self._forget(rollout_id)
        self.closed_count += 1
        return calls

    def stats(self, rollout_id: str) -> RolloutStats:
        shard = self._route_table.get(rollout_id)
        if shard is None:  # closed: ask every live shard (one of them kept it among its latest keep_closed)
            for candidate in self.shards:
                with contextlib.suppress(KeyError, ShardDown):
                    return self._call(candidate, "stats", rollout_id)
            raise KeyError(f"rollout {rollout_id!r} is unknown to this proxy (closed ones are kept for a while only)")
        try:
            return self._call(shard, "stats", rollout_id)
        except ShardDown as exc:
            raise KeyError(f"rollout {rollout_id!r}: {exc}") from exc

    def base_url(self, route: RolloutRoute) -> str:
        """The route on its shard's loopback port (for SDK clients on this machine; start with port=0)."""
        endpoint = self._shard_of(route.rollout_id).endpoint
        if endpoint is None or endpoint.port is None:
            raise RuntimeError("this sharded proxy has no TCP listeners; start it with port=0")
        return route.base_url(f"http://{endpoint.host}:{endpoint.port}")

    def limits(self, rollout_id: str) -> RolloutLimits:
        self._shard_of(rollout_id)
        return self._limits[rollout_id]

    def calls(self, rollout_id: str) -> list[ModelCall]:
        return self._call(self._shard_of(rollout_id), "calls", rollout_id)

    def admit_in_process(self, rollout_id: str, prompt_ids: list[int]) -> InProcessAdmission:
        return self._call(self._shard_of(rollout_id), "admit_in_process", rollout_id, prompt_ids)

    def record_inprocess_call(self, rollout_id: str, call: ModelCall) -> ModelCall:
        return self._call(self._shard_of(rollout_id), "record_inprocess_call", rollout_id, call)

    def guard_stats(self) -> GuardStats:
        """The guards' counts summed over the live shards."""
        total = GuardStats()
        for shard in self.shards:
            with contextlib.suppress(ShardDown):
                part = self._call(shard, "guard_stats")
                for name, value in part.model_dump().items():
                    setattr(total, name, getattr(total, name) + value if name != "open_file_limit" else value)
        return total

    def table_sizes(self) -> dict[str, int]:
        sizes = collections.Counter({"open": 0, "closed_stats": 0})
        for shard in self.shards:
            with contextlib.suppress(ShardDown):
                sizes.update(self._call(shard, "table_sizes"))
        return {**sizes, "route_table": len(self._route_table)}

    def report(self) -> dict[str, Any]:
        """`ServingProxy.report()` summed over the shards, with each shard's row and the shards lost."""
        return {
            "closed_rollouts": self.closed_count,
            "guards": self.guard_stats().model_dump(),
            "tables": self.table_sizes(),
            "shards": self.shard_report(),
            "shard_failures": dict(self.shard_failures),
            "recovered_rollouts": self.recovered_rollouts,
            "respawned": self.respawned,
        }

    def shard_report(self) -> list[dict[str, Any]]:
        """Each shard: its index, pid, resident memory, endpoint, open rollouts and, for a dead one, why."""
        return [
            {
                "index": s.index,
                "pid": s.process.pid,
                "rss_mb": s.rss_mb(),
                "unix_socket": str(s.endpoint.unix_socket) if s.endpoint else None,
                "port": s.endpoint.port if s.endpoint else None,
                "open_rollouts": len(s.open_rollouts),
                "down": s.down,
            }
            for s in self.shards
        ]


class ShardsFollowing:
    """Told by an engine with shard clients (`VLLMServerPool.add_follower`) around each weight update: `hold`
    pauses each shard's client once its calls in flight end (new calls wait), `release` lets them go on at
    the new version. Called from the engine's own thread; a dead shard is skipped."""

    def __init__(self, proxy: ShardedProxy, key: int) -> None:
        self.proxy, self.key = proxy, key

    def _each(self, op: str, *args: Any, timeout_s: float | None = None) -> list[Any]:
        answers = []
        for shard in list(self.proxy.shards):
            if self.key in shard.followers and shard.down is None:
                with contextlib.suppress(ShardDown):
                    answers.append(self.proxy._call(shard, op, self.key, *args, timeout_s=timeout_s))
        return answers

    def hold(self) -> None:
        self._each("hold", timeout_s=float(self.proxy._options.get("engine_timeout_s", 600.0)) + 60)

    def release(self, version: int, checkpoint: Path | None) -> None:
        self._each("release", version, checkpoint)

    def report(self) -> list[dict[str, Any]]:
        return self._each("report")
