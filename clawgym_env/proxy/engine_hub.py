"""The engine hub: proxy shards in other processes generate with the engines of the process that made them.

A `ShardedProxy` (clawgym_env.proxy.shards) runs its HTTP front ends in shard processes, but a policy's
engine stays where the trainer made it: a transformers model in this process, or the `VLLMServerPool`
whose weights the trainer updates and whose versions it checks. So the shards do not get engines: each
gets a `HubEngine` that sends the prompt to the `EngineHub` in this process over a private Unix socket
and reads the tokens back as the real engine decodes them. Everything else of a call (HTTP, parsing,
rendering, splicing, recording, streaming the answer) costs the shard's CPU, not this process's.

The wire: each frame is a 4-byte big-endian length and an orjson object. A shard sends
`{"op": "stream" | "generate", "id", "policy", "ids", "sampling", "rid"}`, `{"op": "abort", "id"}` (the
engine stops and answers what it has) and `{"op": "cancel", "id"}` (the shard no longer wants it); the hub
answers `{"id", "chunk": [ids, logprobs, finish, version]}`... (the chunk with a finish reason is the last;
`{"id", "end": 1}` ends a stream that had none), `{"id", "gen": {...}}` or `{"id", "error": [type name,
message, is a timeout], "partial": generation or null}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import struct
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson

from clawgym_env.engines.token_stream import can_abort, generate, stream_tokens
from clawgym_env.interfaces import Generation, Policy, SamplingParams, TokenChunk

log = logging.getLogger(__name__)
_LENGTH = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024  # a prompt of ~30 M ids; anything longer is a broken peer


def frame(value: dict[str, Any]) -> bytes:
    body = orjson.dumps(value)
    return _LENGTH.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next frame, or None when the peer closed the connection."""
    try:
        head = await reader.readexactly(4)
        (length,) = _LENGTH.unpack(head)
        if length > MAX_FRAME:
            raise ConnectionError(f"engine hub frame of {length} bytes is over the {MAX_FRAME} limit")
        return orjson.loads(await reader.readexactly(length))
    except asyncio.IncompleteReadError:
        return None


class HubEngineError(RuntimeError):
    """An engine in the hub's process failed: raised in the shard as a subclass named like the original
    exception (a timeout as a `TimeoutError`), so the call's record reads as it would in one process."""


@functools.cache
def _error_class(name: str, timeout: bool) -> type[Exception]:
    return type(name, (TimeoutError if timeout else HubEngineError,), {"__module__": __name__})


def _error_of(payload: dict[str, Any]) -> Exception:
    name, message, timeout = payload["error"]
    exc = _error_class(name, bool(timeout))(message)
    partial = payload.get("partial")
    exc.generation = Generation.model_validate(partial) if partial else None  # type: ignore[attr-defined]
    return exc


# ------------------------------------------------------------------------------------------- hub side
class EngineHub:
    """Serves the engines of registered policies to shard processes (one connection per shard)."""

    def __init__(self) -> None:
        self._policies: dict[int, Policy] = {}  # id(policy) -> it (held, so its id stays its own)
        self._server: asyncio.AbstractServer | None = None
        self._dir: Path | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.path: Path | None = None
        self.failed_calls = 0  # engine calls that ended in an error (each also reaches its shard's call record)

    def register(self, policy: Policy) -> int:
        """The key shards name this policy by: its id, while the hub holds it."""
        self._policies.setdefault(id(policy), policy)
        return id(policy)

    async def start(self) -> Path:
        # a private folder (0700) under /tmp: sandboxes have their own /tmp, and no other user can connect
        self._dir = Path(tempfile.mkdtemp(prefix="clawgym-hub-"))
        self.path = self._dir / "hub.sock"
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        return self.path

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._connections, return_exceptions=True)
            self._server = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        if self._dir is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self._dir)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(asyncio.current_task())  # type: ignore[arg-type]
        calls: dict[int, tuple[asyncio.Task[None], Any, str | None]] = {}
        try:
            while (request := await read_frame(reader)) is not None:
                op, call_id = request["op"], request["id"]
                if op in ("stream", "generate"):
                    policy = self._policies.get(request["policy"])
                    if policy is None:
                        message = f"the engine hub has no policy {request['policy']!r} (a shard out of step)"
                        writer.write(frame({"id": call_id, "error": ["KeyError", message, False]}))
                        continue
                    task = asyncio.create_task(self._run(op, call_id, policy.engine, request, writer))
                    calls[call_id] = (task, policy.engine, request.get("rid"))
                    task.add_done_callback(lambda _t, i=call_id: calls.pop(i, None))
                elif (entry := calls.get(call_id)) is not None:
                    task, engine, rid = entry
                    if op == "abort" and can_abort(engine) and rid is not None:
                        engine.abort(rid)
                    else:
                        task.cancel()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            for task, _, _ in list(calls.values()):
                task.cancel()  # the shard is gone: nobody reads these tokens
            writer.close()
            self._connections.discard(asyncio.current_task())  # type: ignore[arg-type]

    async def _run(
        self, op: str, call_id: int, engine: Any, request: dict[str, Any], writer: asyncio.StreamWriter
    ) -> None:
        sampling = SamplingParams.model_validate(request["sampling"])
        ids, rid = request["ids"], request.get("rid")
        try:
            if op == "generate":
                writer.write(frame({"id": call_id, "gen": (await generate(engine, ids, sampling, rid)).model_dump()}))
                return
            finished = False
            async for chunk in stream_tokens(engine, ids, sampling, rid):
                body = [chunk.token_ids, chunk.logprobs, chunk.finish_reason, chunk.policy_version]
                writer.write(frame({"id": call_id, "chunk": body}))
                finished = chunk.finish_reason is not None  # the last chunk ends the stream: no frame more
            if not finished:
                writer.write(frame({"id": call_id, "end": 1}))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the shard's proxy records it as the call's engine error
            self.failed_calls += 1
            partial = getattr(exc, "generation", None)
            error = {"id": call_id, "error": [type(exc).__name__, str(exc), isinstance(exc, TimeoutError)]}
            error["partial"] = partial.model_dump() if isinstance(partial, Generation) else None
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.write(frame(error))


# ----------------------------------------------------------------------------------------- shard side
class HubLink:
    """A shard's one connection to the hub; answers are sorted to their calls by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Queue[dict[str, Any]]] = {}
        self._reading = asyncio.create_task(self._read())
        self.lost: str | None = None  # why the link broke, once it has
        self.on_lost: Callable[[str], None] | None = None  # told once, when it breaks (not when closed here)

    @classmethod
    async def connect(cls, path: str | Path) -> HubLink:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=2**20)
        return cls(reader, writer)

    async def _read(self) -> None:
        try:
            while (answer := await read_frame(self._reader)) is not None:
                queue = self._waiting.get(answer["id"])
                if queue is not None:
                    queue.put_nowait(answer)
            self.lost = "the engine hub closed the connection"
        except Exception as exc:  # noqa: BLE001
            self.lost = f"the engine hub connection broke: {exc!r}"
        for call_id, queue in self._waiting.items():
            queue.put_nowait({"id": call_id, "error": ["ConnectionError", self.lost, False], "partial": None})
        if self.on_lost is not None:
            self.on_lost(self.lost)

    def send(self, request: dict[str, Any]) -> tuple[int, asyncio.Queue[dict[str, Any]]]:
        if self.lost is not None:
            raise ConnectionError(self.lost)
        call_id = next(self._ids)
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._waiting[call_id] = queue
        self._writer.write(frame({**request, "id": call_id}))
        return call_id, queue

    def tell(self, op: str, call_id: int) -> None:
        if self.lost is None and call_id in self._waiting:
            self._writer.write(frame({"op": op, "id": call_id}))

    def done(self, call_id: int) -> None:
        self._waiting.pop(call_id, None)

    async def aclose(self) -> None:
        self._reading.cancel()
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


class HubEngine:
    """The engine of a policy in the hub's process, as an `InferenceEngine` inside a shard."""

    def __init__(self, link: HubLink, policy_key: int, policy_version: int, abortable: bool) -> None:
        self._link, self._key = link, policy_key
        self.policy_version = policy_version  # the latest version an answer named
        self._calls: dict[str, int] = {}  # request id -> hub call id, for abort
        if abortable:
            self.abort = self._abort  # only then: the proxy asks `can_abort(engine)` before it aborts

    def _send(self, op: str, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None) -> Any:
        request = {
            "op": op,
            "policy": self._key,
            "ids": prompt_ids,
            "sampling": sampling.model_dump(),
            "rid": request_id,
        }
        call_id, queue = self._link.send(request)
        if request_id is not None:
            self._calls[request_id] = call_id
        return call_id, queue

    def _abort(self, request_id: str) -> bool:
        call_id = self._calls.get(request_id)
        if call_id is None:
            return False
        self._link.tell("abort", call_id)
        return True

    def _finish(self, call_id: int, request_id: str | None, ended: bool) -> None:
        if not ended:
            self._link.tell("cancel", call_id)
        self._link.done(call_id)
        if request_id is not None:
            self._calls.pop(request_id, None)

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None = None
    ) -> Generation:
        call_id, queue = self._send("generate", prompt_ids, sampling, request_id)
        ended = False
        try:
            answer = await queue.get()
            ended = True
            if "error" in answer:
                raise _error_of(answer)
            generation = Generation.model_validate(answer["gen"])
            self.policy_version = max(self.policy_version, generation.policy_version)
            return generation
        finally:
            self._finish(call_id, request_id, ended)

    async def stream(
        self, prompt_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> AsyncIterator[TokenChunk]:
        call_id, queue = self._send("stream", prompt_ids, sampling, request_id)
        ended = False
        try:
            while True:
                answer = await queue.get()
                if "chunk" in answer:
                    ids, logprobs, finish, version = answer["chunk"]
                    self.policy_version = max(self.policy_version, version)
                    ended = finish is not None
                    yield TokenChunk(ids, logprobs, finish, version)
                    if ended:
                        return
                    continue
                ended = True
                if "error" in answer:
                    raise _error_of(answer)
                return
        finally:
            self._finish(call_id, request_id, ended)
