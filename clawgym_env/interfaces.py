"""The small typed contracts between the parts of a rollout.

`env.step` composes exactly these: a SandboxBackend makes a Sandbox, a RolloutProxy opens a route for
the rollout, a HarnessAdapter drives the harness against that route, a Verifier scores the sandbox, and
the recorded ModelCalls are rebuilt into a TrajectoryForest. Each part lives in its own package and only
has to satisfy its protocol here.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from clawgym_env.specs import ApiStyle
from clawgym_env.verifier_api import FunctionVerifier as FunctionVerifier  # re-exported: the verifier contract
from clawgym_env.verifier_api import Verifier as Verifier
from clawgym_env.verifier_api import VerifierResult as VerifierResult
from clawgym_env.verifier_api import as_verifier as as_verifier
from clawgym_env.verifier_api import coerce_verifier_output as coerce_verifier_output

if TYPE_CHECKING:
    from clawgym_env.chat.renderers.base import Renderer
    from clawgym_env.records import ModelCall
    from clawgym_env.specs import TaskSpec


# --------------------------------------------------------------------------------------------- sandbox
class ExecResult(BaseModel):
    """What one command in a sandbox did."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    timed_out: bool = False
    killed_reason: str | None = None  # "timeout", "memory", "pids", ... when the sandbox killed it
    # Output past `SandboxLimits.max_output_bytes` per stream: its first and last halves are kept, the bytes in
    # between drained, dropped and counted here, and the text carries `dropped_marker(n)` where they were.
    stdout_dropped_bytes: int = 0
    stderr_dropped_bytes: int = 0


def dropped_marker(dropped: int) -> bytes:
    """What stands in an ExecResult's text where `dropped` bytes of output were left out."""
    return f"\n[clawgym: {dropped} bytes dropped]\n".encode()


class OutputCap:
    """One output stream kept to `cap` bytes as it arrives: the first half and the last half; what falls in
    between is dropped (and counted), so memory stays near `cap` however much a command writes."""

    def __init__(self, cap: int) -> None:
        self.tail_cap = cap // 2
        self.head_cap = cap - self.tail_cap
        self.head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self._dropped = 0

    def add(self, data: bytes) -> None:
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self._tail.append(bytes(data))
        self._tail_len += len(data)
        while self._tail and self._tail_len - len(self._tail[0]) >= self.tail_cap:
            first = self._tail.popleft()  # whole chunks leave the tail: no copying of what stays
            self._tail_len -= len(first)
            self._dropped += len(first)

    def result(self) -> tuple[bytes, int]:
        """(the kept bytes, with the marker where bytes were dropped; how many were dropped)."""
        tail = b"".join(self._tail)
        extra = max(0, len(tail) - self.tail_cap)
        dropped = self._dropped + extra
        if not dropped:
            return bytes(self.head) + tail, 0
        return bytes(self.head) + dropped_marker(dropped) + tail[extra:], dropped


class SandboxLimits(BaseModel):
    """Resource limits of one sandbox; defaults fit a 2-core, 24 GiB machine running several at once."""

    wall_time_s: float = Field(default=900.0, gt=0)
    memory_mb: int = Field(default=4096, gt=0)
    max_processes: int = Field(default=512, gt=0)
    workspace_mb: int = Field(default=1024, gt=0)
    # Per stream of one command: past it, the head and tail halves are kept (see ExecResult).
    max_output_bytes: int = Field(default=16 << 20, ge=2)


class ProxyEndpoint(BaseModel):
    """Where the serving proxy listens, so a backend can give its sandboxes (and only them) a way in."""

    unix_socket: Path | None = None  # local backend: bound into the sandbox behind a loopback relay
    host: str = "127.0.0.1"
    port: int | None = None
    public_url: str | None = None  # remote backends (Daytona) reach the proxy here


@runtime_checkable
class Sandbox(Protocol):
    """One isolated, ephemeral workspace. All I/O paths are as seen inside the sandbox."""

    id: str
    workspace_path: str  # the task's mount path, e.g. /root/.openclaw/workspace
    proxy_base_url: str | None  # base URL of the serving proxy as seen from inside, e.g. http://127.0.0.1:8080

    async def exec(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes | str) -> None: ...

    async def list_files(self, path: str | None = None) -> list[str]: ...

    async def download_workspace(self, dest: Path) -> Path: ...

    async def destroy(self) -> None: ...


@runtime_checkable
class SandboxBackend(Protocol):
    name: str

    async def create(
        self,
        task: TaskSpec,
        *,
        proxy: ProxyEndpoint | None = None,
        limits: SandboxLimits | None = None,
    ) -> Sandbox: ...

    async def aclose(self) -> None: ...


# ---------------------------------------------------------------------------------------------- engine
class SamplingParams(BaseModel):
    model_config = ConfigDict(frozen=True)

    max_tokens: int = Field(default=1024, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)  # 0 = off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # generate max_tokens whatever the model's end tokens (benchmarks: equal work)


FinishReason = Literal["stop", "length", "abort", "error"]


class Generation(BaseModel):
    """Raw engine output: the exact token ids and the engine's logprob of each."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int = 0

    @field_validator("logprobs")
    @classmethod
    def _finite(cls, values: list[float]) -> list[float]:
        # A sum of finite logprobs is finite (they are >= -1e4 or so, far from overflow); one sum in C is
        # ~20x cheaper than a generator over every token, and this runs on every call. A non-finite sum
        # (or an overflow) falls back to the exact check.
        if not math.isfinite(sum(values)) and any(not math.isfinite(v) for v in values):
            raise ValueError("engine returned a non-finite logprob")
        return values


@dataclass(slots=True)
class TokenChunk:
    """Tokens an engine decoded since its previous chunk (streaming); the last chunk of a stream carries the
    finish reason and policy version, and all chunks' ids and logprobs together are the `Generation`."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason | None = None
    policy_version: int = 0


@runtime_checkable
class InferenceEngine(Protocol):
    """Token ids in, token ids and logprobs out. Batched across concurrent callers by the engine."""

    policy_version: int

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None: ...


# What an engine may also do. Each is a protocol of its own, checked with isinstance where it is used
# (`clawgym_env.engines.token_stream`, the proxy, the trainer), so the optional parts are declared here, not
# guessed with hasattr at each call site.
@runtime_checkable
class StreamingEngine(Protocol):
    """Yields tokens as they decode; `token_stream.stream_tokens` falls back to one chunk from generate()."""

    def stream(
        self, prompt_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> AsyncIterator[TokenChunk]: ...


@runtime_checkable
class AbortableEngine(Protocol):
    """Stops a request by id and hands back what it generated (generate() then takes `request_id=`)."""

    def abort(self, request_id: str) -> bool: ...


@runtime_checkable
class ClosableEngine(Protocol):
    """Holds threads, processes or servers that `close()` releases."""

    def close(self) -> None: ...


@runtime_checkable
class ReportingEngine(Protocol):
    """Says what it did (calls per server, lost servers, weight updates) for a run's summary."""

    def report(self) -> Any: ...


@runtime_checkable
class AdapterEngine(Protocol):
    """Takes a LoRA adapter instead of full weights (`model.lora.sync=adapter`): only in-process vLLM today."""

    supports_adapters: bool  # started with enable_lora

    def update_adapter(self, adapter: Any, version: int) -> None: ...


@dataclass
class Policy:
    """What `env.step` acts with: an engine plus the renderer of its model family.

    The renderer turns API requests into prompt token ids and generated ids back into text and tool
    calls (clawgym_env.chat.renderers). `name` is the model name the harnesses are told to use.
    """

    engine: InferenceEngine
    renderer: Renderer
    name: str = "policy"
    max_context: int = 32_768

    @property
    def version(self) -> int:
        return self.engine.policy_version


# ---------------------------------------------------------------------------------------------- proxy
class RolloutRoute(BaseModel):
    """A rollout's private way in to the proxy: `/rollouts/<id>` plus a secret key."""

    rollout_id: str
    path_prefix: str
    api_key: str

    def base_url(self, origin: str) -> str:
        return origin.rstrip("/") + self.path_prefix


class RolloutLimits(BaseModel):
    max_calls: int = 48
    max_tokens: int = 262_144  # the rollout's token budget: new prompt tokens + generated tokens, over its calls
    max_new_tokens: int = 1024
    temperature: float = 1.0


class InProcessAdmission(BaseModel):
    """An in-process loop's budget for its next call (`ServingProxy.admit_in_process`), checked as for an HTTP
    call: how many tokens it may generate, or why it may not ("token_cap: ...", recorded as a failed call)."""

    max_new_tokens: int = 0
    refused: str | None = None


@runtime_checkable
class RolloutProxy(Protocol):
    """What a rollout needs from the model endpoint; `clawgym_env.proxy.ServingProxy` is the implementation
    (`ShardedProxy` too: several processes, a rollout's sandbox bound to the one that serves it)."""

    async def start(self) -> None: ...

    def endpoint_for(self, rollout_id: str) -> ProxyEndpoint: ...

    async def stop(self) -> None: ...

    def open_rollout(self, rollout_id: str, policy: Policy, limits: RolloutLimits) -> RolloutRoute: ...

    def close_rollout(self, rollout_id: str) -> list[ModelCall]: ...


# -------------------------------------------------------------------------------------------- harness
class HarnessResult(BaseModel):
    """What a harness run produced, judged from its own events (pi exits 0 after API errors)."""

    harness: str
    exit_code: int | None = None
    success: bool = False
    final_message: str = ""
    events: list[dict[str, Any]] = Field(default_factory=list)
    turns: int = 0
    error: str | None = None
    timed_out: bool = False
    # The rollout budget the harness stopped at by itself ("call_cap"), where it never asks past it (the
    # white-box loop); a CLI harness learns of the cap from the proxy's refusal instead.
    stopped_at_budget: str | None = None
    wall_s: float = 0.0
    startup_s: float | None = None  # time before the first model call, where known
    stdout_tail: str = ""
    stderr_tail: str = ""


@dataclass
class HarnessContext:
    """Everything an adapter needs for one run."""

    sandbox: Sandbox
    task: TaskSpec
    base_url: str  # the rollout's route, as seen from inside the sandbox
    api_key: str
    model_name: str
    timeout_s: float
    policy: Policy | None = None  # only in-process (white-box) adapters use it directly
    rollout_id: str = ""
    record: Callable[[ModelCall], None] | None = None  # in-process adapters record calls here
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class HarnessAdapter(Protocol):
    name: str
    api_style: ApiStyle

    def check_installed(self) -> None:
        """Raise HarnessNotInstalled, saying how to install, if the harness cannot run here."""

    async def run(self, ctx: HarnessContext) -> HarnessResult: ...


# -------------------------------------------------------------------------------------------- verifier
@dataclass
class VerifyContext:
    sandbox: Sandbox
    task: TaskSpec
    harness_result: HarnessResult | None = None
    workspace_dir: Path | None = None  # a host copy of the final workspace, for Python checks


class HarnessNotInstalled(RuntimeError):
    """The harness CLI is missing; the message says which command installs it."""


class SandboxUnavailable(RuntimeError):
    """The sandbox backend cannot run here (for example bubblewrap or user namespaces are missing)."""
