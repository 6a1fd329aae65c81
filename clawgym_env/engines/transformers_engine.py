"""TransformersEngine: an in-process PyTorch/transformers `InferenceEngine` (the CPU default).

Past 500 lines because batching, KV reuse, streaming and abort all act on the state of the one worker thread
that owns the model; split up, that state would be spread over modules.

How a request flows:
- `generate()` (async) queues the request and awaits a future; one background worker thread owns the
  model, so the proxy's asyncio loop never blocks on torch.
- The worker admits waiting requests at every decode step (continuous batching). Each new request is
  prefilled alone, reusing the KV cache of the earlier sequence that shares the longest token prefix
  with it (a rollout's consecutive calls share almost the whole prompt), then joins the running batch:
  the rows' caches are left-padded to one length and decoded together with an attention mask and
  per-row position ids.
- Each generated token's logprob is taken from the very distribution it was sampled from
  (see `sampling.py`); a teacher-forced pass of the same model reproduces it.
- `abort(request_id)`, a cancelled `generate()` task, or a timeout ends a request at the next step:
  its slot is freed and what it generated so far comes back with finish "abort" (a timeout raises
  `EngineTimeout` carrying that partial generation).
- `update_weights()` waits until no generation is in flight (admission pauses meanwhile), copies the
  new tensors in place, bumps `policy_version`, and drops the prefix cache (its KV came from the old
  weights). So every generation runs under exactly one policy version.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from clawgym_env.engines import kv_cache
from clawgym_env.engines.kv_cache import KV, PrefixCache
from clawgym_env.engines.sampling import sample_token
from clawgym_env.interfaces import FinishReason, Generation, SamplingParams, TokenChunk

log = logging.getLogger(__name__)


class EngineClosed(RuntimeError):
    """generate() after close()."""


class EngineTimeout(TimeoutError):
    """A generation ran past its time limit; `.generation` holds what it produced (finish "abort")."""

    def __init__(self, message: str, generation: Generation) -> None:
        super().__init__(message)
        self.generation = generation


@dataclass(eq=False)
class _Request:
    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    stop_ids: frozenset[int]
    generator: torch.Generator
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    deadline: float | None
    out_ids: list[int] = field(default_factory=list)
    out_lps: list[float] = field(default_factory=list)
    aborted: bool = False
    version: int = 0
    on_token: Callable[[int, float], None] | None = None  # streaming: called on the worker thread per token

    @property
    def cached_len(self) -> int:
        """Tokens whose KV is in this row's cache: the prompt and all generated tokens but the last."""
        return len(self.prompt) + len(self.out_ids) - 1


@dataclass
class EngineStats:
    requests: int = 0
    prefill_tokens: int = 0  # prompt tokens actually run through the model
    reused_tokens: int = 0  # prompt tokens served from the prefix cache
    generated_tokens: int = 0
    decode_steps: int = 0
    max_batch_seen: int = 0
    weight_updates: int = 0


class _Batch:
    """The running decode batch: rows, their left-padded KV cache and attention mask."""

    def __init__(self) -> None:
        self.rows: list[_Request] = []
        self.cache: Any = None  # transformers DynamicCache over [B, heads, T, dim] tensors
        self.mask = torch.zeros(0, 0, dtype=torch.long)

    def kv(self) -> KV:
        return [(layer.keys, layer.values) for layer in self.cache.layers]


def _dynamic_cache(kv: KV | None):
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=kv) if kv else DynamicCache()


class TransformersEngine:
    """Token ids in, token ids + logprobs out, from a local transformers causal LM (float32 CPU by default)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        max_batch_size: int = 8,
        prefix_cache_entries: int = 8,
        request_timeout_s: float | None = None,
        stop_token_ids: Iterable[int] | None = None,
        max_context: int | None = None,
        seed: int | None = None,
        policy_version: int = 0,
        num_threads: int | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.config.vocab_size)
        self.max_batch_size = max_batch_size
        self.request_timeout_s = request_timeout_s
        self.max_context = max_context or int(getattr(model.config, "max_position_embeddings", 0) or 32768)
        self.default_stop_ids = frozenset(stop_token_ids if stop_token_ids is not None else self._eos_ids())
        self.policy_version = policy_version
        # torch's intra-op thread count is per OS thread: the worker adopts this one explicitly. On a
        # busy shared CPU, 1 thread is often fastest (OpenMP barriers wait for descheduled threads).
        self.num_threads = num_threads or torch.get_num_threads()
        self.prefix_cache = PrefixCache(prefix_cache_entries)
        self.stats = EngineStats()
        self._rng = random.Random(seed)
        self._ids = itertools.count()
        self._cv = threading.Condition()
        self._waiting: list[_Request] = []
        self._by_id: dict[str, _Request] = {}
        self._active = 0  # admitted and not finished
        self._update_pending = 0
        self._closed = False
        self._worker: threading.Thread | None = None

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, dtype: Any = None, **options: Any) -> TransformersEngine:
        """Build from a zoo name ("tiny-qwen3", "smollm2-135m", "qwen2.5-coder-0.5b") or a local path."""
        from clawgym_env.engines.models import load_policy_model

        model, tokenizer = load_policy_model(name_or_path, dtype=dtype)
        return cls(model, tokenizer, **options)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config):
            eos = getattr(source, "eos_token_id", None) if source is not None else None
            ids.update([eos] if isinstance(eos, int) else list(eos or []))
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    # ------------------------------------------------------------------------------------ public API
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> Generation:
        req = self._submit(prompt_ids, sampling, request_id, timeout_s)
        try:
            return await req.future
        except asyncio.CancelledError:
            self._abort(req)  # the client went away: free the slot at the next step
            raise

    async def stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> AsyncIterator[TokenChunk]:
        """Yield the tokens of one generation as the worker samples them (the batch's decode step).

        The request runs in the same continuous batch as `generate()` ones, with the same sampling, so its
        ids and logprobs equal a generate() call's. Closing the iterator early aborts the request.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, float] | None] = asyncio.Queue()

        def on_token(token: int, logprob: float) -> None:  # worker thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (token, logprob))
            except RuntimeError:  # the caller's loop is closed
                pass

        req = self._submit(prompt_ids, sampling, request_id, timeout_s, on_token)
        # the future resolves after every token's put (same thread, FIFO): None then ends the queue
        req.future.add_done_callback(lambda _: queue.put_nowait(None))
        sent = 0
        try:
            done = False
            while not done:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                done = items[-1] is None  # put after every token
                tokens = [item for item in items if item is not None]
                if tokens:
                    sent += len(tokens)
                    yield TokenChunk([t for t, _ in tokens], [lp for _, lp in tokens], None, req.version)
            gen = req.future.result()  # raises the engine's error (EngineTimeout carries the partial)
            yield TokenChunk(gen.token_ids[sent:], gen.logprobs[sent:], gen.finish_reason, gen.policy_version)
        finally:
            if not req.future.done():
                self._abort(req)  # the consumer stopped early: free the slot at the next step

    def _submit(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        request_id: str | None,
        timeout_s: float | None,
        on_token: Callable[[int, float], None] | None = None,
    ) -> _Request:
        if self._closed:
            raise EngineClosed("this TransformersEngine was closed; build a new one")
        self._check_prompt(prompt_ids)
        seed = sampling.seed if sampling.seed is not None else self._rng.randrange(2**63)
        limit = timeout_s if timeout_s is not None else self.request_timeout_s
        loop = asyncio.get_running_loop()
        req = _Request(
            request_id=request_id or f"req-{next(self._ids)}",
            prompt=[int(t) for t in prompt_ids],
            sampling=sampling,
            stop_ids=(frozenset() if sampling.ignore_eos else self.default_stop_ids)
            | frozenset(sampling.stop_token_ids),
            generator=torch.Generator().manual_seed(seed),
            loop=loop,
            future=loop.create_future(),
            deadline=time.monotonic() + limit if limit else None,
            on_token=on_token,
        )
        with self._cv:
            if req.request_id in self._by_id:
                raise ValueError(f"request_id {req.request_id!r} is already running; request ids must be unique")
            self._by_id[req.request_id] = req
            self._waiting.append(req)
            self.stats.requests += 1
            self._ensure_worker()
            self._cv.notify_all()
        return req

    def abort(self, request_id: str) -> bool:
        """End a running request; its generate() returns what it has so far with finish "abort"."""
        with self._cv:
            req = self._by_id.get(request_id)
        if req is None:
            return False
        self._abort(req)
        return True

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Copy `state_dict` into the model between generations, then serve as `version`.

        Blocks until in-flight generations finish (new ones wait meanwhile). Keys may be a subset of the
        model's parameters; unknown keys or wrong shapes are refused before anything changes.
        """
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        unknown = [k for k in state_dict if k not in params]
        if unknown:
            raise KeyError(f"update_weights: {len(unknown)} keys are not in the model, e.g. {unknown[:3]}")
        for key, value in state_dict.items():
            if tuple(value.shape) != tuple(params[key].shape):
                raise ValueError(
                    f"update_weights: {key} has shape {tuple(value.shape)}, model has {tuple(params[key].shape)}"
                )
        with self._cv:
            self._update_pending += 1
            try:
                while self._active > 0:
                    self._cv.wait()
                with torch.no_grad():
                    for key, value in state_dict.items():
                        params[key].copy_(value.detach().to(device=params[key].device, dtype=params[key].dtype))
                self.policy_version = version
                self.prefix_cache.clear()
                self.stats.weight_updates += 1
            finally:
                self._update_pending -= 1
                self._cv.notify_all()

    def close(self) -> None:
        """Stop the worker; waiting and running requests end with EngineClosed."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=30)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # ------------------------------------------------------------------------------------ internals
    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; the engine needs at least one prompt token")
        bad = [t for t in prompt_ids if not (0 <= int(t) < self.vocab_size)]
        if bad:
            raise ValueError(
                f"prompt_ids contains ids outside the model's vocabulary [0, {self.vocab_size}): {bad[:5]}"
            )
        if len(prompt_ids) >= self.max_context:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens does not fit the model's context of {self.max_context} tokens"
            )

    def _abort(self, req: _Request) -> None:
        with self._cv:
            req.aborted = True
            self._cv.notify_all()

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._run, name="TransformersEngine", daemon=True)
            self._worker.start()

    def _resolve(self, req: _Request, result: Generation | BaseException) -> None:
        with self._cv:
            self._by_id.pop(req.request_id, None)

        def deliver() -> None:
            if req.future.done():
                return
            if isinstance(result, BaseException):
                req.future.set_exception(result)
            else:
                req.future.set_result(result)

        try:
            req.loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
            pass

    def _finish(self, req: _Request, reason: FinishReason) -> None:
        self.stats.generated_tokens += len(req.out_ids)
        gen = Generation(
            token_ids=list(req.out_ids), logprobs=list(req.out_lps), finish_reason=reason, policy_version=req.version
        )
        timed_out = reason == "abort" and not req.aborted
        if timed_out:
            self._resolve(req, EngineTimeout(f"generation {req.request_id} ran past its time limit", gen))
        else:
            self._resolve(req, gen)

    def _end_reason(self, req: _Request) -> FinishReason | None:
        """Why `req` is done after its latest token, or None to keep going."""
        if req.aborted or req.future.cancelled():
            req.aborted = True
            return "abort"
        if req.deadline is not None and time.monotonic() > req.deadline:
            return "abort"
        if req.out_ids and req.out_ids[-1] in req.stop_ids:
            return "stop"
        if len(req.out_ids) >= req.sampling.max_tokens or len(req.prompt) + len(req.out_ids) >= self.max_context:
            return "length"
        return None

    def _run(self) -> None:
        batch = _Batch()
        torch.set_num_threads(self.num_threads)
        try:
            with torch.inference_mode():
                while True:
                    with self._cv:
                        self._drop_dead_waiting()
                        while not self._closed and not batch.rows and (not self._waiting or self._update_pending):
                            self._cv.notify_all()  # an update_weights() may be waiting for an idle engine
                            self._cv.wait(timeout=0.5)
                            self._drop_dead_waiting()
                        if self._closed:
                            break
                        room = self.max_batch_size - len(batch.rows)
                        admit = [] if self._update_pending else self._waiting[:room]
                        del self._waiting[: len(admit)]
                        self._active += len(admit)
                        for req in admit:
                            req.version = self.policy_version
                    joined = []
                    for req in admit:
                        kv = self._prefill(req)
                        if kv is not None:
                            joined.append((req, kv))
                    if joined:
                        self._join(batch, joined)
                    if batch.rows:
                        self._step(batch)
        except BaseException as exc:  # a model error must not leave callers waiting forever
            log.exception("TransformersEngine worker failed")
            error = exc
        else:
            error = EngineClosed("the engine was closed while this request was running")
        with self._cv:
            pending = batch.rows + self._waiting
            self._waiting = []
            self._active = 0
            self._cv.notify_all()
        for req in pending:
            self._resolve(req, error if isinstance(error, Exception) else RuntimeError(str(error)))
        if not isinstance(error, EngineClosed):
            with self._cv:
                self._worker = None  # the next generate() starts a fresh worker

    def _drop_dead_waiting(self) -> None:
        """Requests aborted, cancelled or timed out before they were admitted (called under the lock)."""
        alive = []
        for req in self._waiting:
            reason = self._end_reason(req)
            if reason == "abort":
                self._finish(req, reason)
            else:
                alive.append(req)
        self._waiting = alive

    def _done(self, req: _Request, reason: FinishReason, kv: KV | None) -> None:
        if kv is not None and req.cached_len > 0:
            self.prefix_cache.put(req.prompt + req.out_ids[:-1], kv)
        with self._cv:
            self._active -= 1
            self._cv.notify_all()
        self._finish(req, reason)

    def _prefill(self, req: _Request) -> KV | None:
        """Run the prompt (minus any cached prefix) and sample the first token; the row's KV if it goes on."""
        if self._end_reason(req) == "abort":
            self._done(req, "abort", None)
            return None
        reused, kv = self.prefix_cache.take(req.prompt)
        cache = _dynamic_cache(kv)
        new = req.prompt[reused:]
        out = self.model(
            input_ids=torch.tensor([new], device=self.device),
            position_ids=torch.arange(reused, len(req.prompt), device=self.device)[None],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.stats.prefill_tokens += len(new)
        self.stats.reused_tokens += reused
        token, logprob = sample_token(out.logits[0, -1], req.sampling, req.generator)
        self._emit(req, token, logprob)
        row_kv = [(layer.keys, layer.values) for layer in cache.layers]
        if len(new) > 1:  # concurrent rollouts of a group share this prompt's prefix: offer it now
            self.prefix_cache.put(req.prompt, row_kv)
        reason = self._end_reason(req)
        if reason is not None:
            self._done(req, reason, row_kv)
            return None
        return row_kv

    @staticmethod
    def _emit(req: _Request, token: int, logprob: float) -> None:
        req.out_ids.append(token)
        req.out_lps.append(logprob)
        if req.on_token is not None:
            req.on_token(token, logprob)

    def _join(self, batch: _Batch, joined: list[tuple[_Request, KV]]) -> None:
        """Left-pad the running batch and the new rows to one length and stack them."""
        parts: list[KV] = [batch.kv()] if batch.rows else []
        masks = [batch.mask] if batch.rows else []
        width = max([batch.mask.shape[1] if batch.rows else 0] + [req.cached_len for req, _ in joined])
        if parts:
            parts[0] = kv_cache.left_pad(parts[0], width - batch.mask.shape[1])
            masks[0] = torch.nn.functional.pad(batch.mask, (width - batch.mask.shape[1], 0))
        for req, kv in joined:
            pad = width - req.cached_len
            parts.append(kv_cache.left_pad(kv, pad))
            row = torch.zeros(1, width, dtype=torch.long)
            row[0, pad:] = 1
            masks.append(row)
            batch.rows.append(req)
        batch.cache = _dynamic_cache(kv_cache.concat_batch(parts))
        batch.mask = torch.cat(masks)
        self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(batch.rows))

    def _step(self, batch: _Batch) -> None:
        """One decode step for every row, then retire the rows that finished."""
        rows = batch.rows
        ids = torch.tensor([[r.out_ids[-1]] for r in rows], device=self.device)
        positions = torch.tensor([[r.cached_len] for r in rows], device=self.device)
        mask = torch.cat([batch.mask, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=mask.to(self.device),
            position_ids=positions,
            past_key_values=batch.cache,
            use_cache=True,
        )
        batch.mask = mask
        self.stats.decode_steps += 1
        logits = out.logits[:, -1]
        finished: list[tuple[int, FinishReason]] = []
        for i, req in enumerate(rows):
            if req.aborted or req.future.cancelled():
                finished.append((i, "abort"))  # do not spend a sample on an aborted row
                continue
            token, logprob = sample_token(logits[i], req.sampling, req.generator)
            self._emit(req, token, logprob)
            reason = self._end_reason(req)
            if reason is not None:
                finished.append((i, reason))
        if finished:
            self._retire(batch, finished)

    def _retire(self, batch: _Batch, finished: list[tuple[int, FinishReason]]) -> None:
        kv = batch.kv()
        width = batch.mask.shape[1]
        done = {i for i, _ in finished}
        for i, reason in finished:
            req = batch.rows[i]
            start = width - int(batch.mask[i].sum())
            # The cache holds KV up to the token before the last sampled one; an aborted row may
            # have been cut before sampling this step, which leaves its cache one token longer.
            row_kv = [(k[i : i + 1, :, start:].clone(), v[i : i + 1, :, start:].clone()) for k, v in kv]
            if row_kv[0][0].shape[2] != req.cached_len:
                row_kv = None
            self._done(req, reason, row_kv)
        keep = [i for i in range(len(batch.rows)) if i not in done]
        batch.rows = [batch.rows[i] for i in keep]
        if not keep:
            batch.cache, batch.mask = None, torch.zeros(0, 0, dtype=torch.long)
            return
        index = torch.tensor(keep)
        mask = batch.mask[index]
        start = int((mask.sum(dim=0) == 0).sum())  # leading columns that are padding in every kept row
        batch.mask = mask[:, start:]
        batch.cache = _dynamic_cache(kv_cache.select_rows(kv, index, start))
