"""RemoteEngine: an `InferenceEngine` client for a separately run token-level server (vLLM or SGLang).

Token ids go in and token ids + logprobs come back; no text is ever re-tokenized.
- vLLM (`api="vllm"`): the OpenAI-compatible server's `POST /v1/completions` with a token-id list as
  `prompt`, `logprobs=1` (the sampled token's logprob) and `return_tokens_as_token_ids=true`: the ids are
  read from the logprob tokens (`token_id:<n>`). Not `return_token_ids` (vLLM >= 0.10.2): it also echoes
  the whole prompt's ids with every call; ids a server sends anyway (`token_ids`) are used.
  Start vLLM with `--logprobs-mode processed_logprobs` so recorded logprobs are those of the
  distribution actually sampled from (temperature, top-k/top-p applied), as the in-process engine does.
- SGLang (`api="sglang"`): `POST /generate` with `input_ids` and `return_logprob=true`.
- `stream()` (vLLM): the same request with `stream: true`; each SSE chunk's token ids and logprobs are
  yielded as the server decodes them. For SGLang it yields one chunk from `generate()`. vLLM sends a
  chunk per token unless asked for `stream_interval` tokens per chunk (vLLM >= 0.12; older servers ignore
  the field): the first token and the end still come at once, and every chunk costs this process an HTTP
  read and a JSON parse (~16 µs here, benchmarks/remote_stream.py): at 1,000 streams, per-token chunks would
  keep a core busy with a few 10k tokens/s.

Connection failures and 502/503/504 are retried (tenacity, exponential back-off); a read timeout is
not (the server may still be generating); what still fails to reach the server raises
`RemoteEngineUnreachable`. Weight updates happen on the server side: pass `weight_updater` to run your own
sync, or push weights out of band and call `set_policy_version`.

The proxy makes every call of every rollout through this client, on its own event loop, so the client is
lean: aiohttp's kept-alive connections with no cap, responses parsed in C (`http_connections.Connections`;
httpx's pool scanned every connection per request and capped a client at 100 concurrent calls), bodies
encoded with orjson (an 8k-id prompt: ~46 µs against ~420 µs with the standard library), and SSE split
from raw bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal

import aiohttp
import orjson
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from clawgym_env.engines.http_connections import Connections
from clawgym_env.interfaces import FinishReason, Generation, SamplingParams, TokenChunk

RemoteApi = Literal["vllm", "sglang"]
Answered = Callable[[Mapping[str, str]], None]  # told each answer's headers (VLLMServerPool reads the server's life)


class RemoteEngineError(RuntimeError):
    """The server answered, but not with a usable generation; the message quotes what it said."""


class RemoteEngineUnreachable(RemoteEngineError, ConnectionError):
    """No answer: the connection failed, broke or timed out, or the server said 502/503/504, after the retries.

    A ConnectionError (an OSError), so a caller that watches servers (VLLMServerPool) counts the server lost.
    """


class _Unavailable(Exception):
    """A 502/503/504 answer: retried like a failed connection."""


# aiohttp's timeouts are TimeoutErrors; a read timeout is not retried (the server may still be generating). A
# server that closed a kept-alive connection as the request went out is: nothing was generated.
_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, _Unavailable)
_RETRIED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError, aiohttp.ServerDisconnectedError, _Unavailable)


def _finish(reason: Any) -> FinishReason:
    if isinstance(reason, dict):  # SGLang: {"type": "stop", "matched": ...}
        reason = reason.get("type")
    if reason in ("stop", "length", "abort"):
        return reason
    return "error" if reason else "stop"


def _vllm_choice(choice: dict[str, Any]) -> tuple[list[int], list[float], Any]:
    """Token ids, their logprobs and the finish reason of one /v1/completions choice (or stream chunk)."""
    lp = choice.get("logprobs") or {}
    logprobs = [float(x) for x in lp.get("token_logprobs") or []]
    ids = choice.get("token_ids")
    if ids is None:  # older vLLM: tokens come back as "token_id:<n>"
        ids = [int(str(t).split(":", 1)[1]) for t in lp.get("tokens") or []]
    return [int(t) for t in ids], logprobs, choice.get("finish_reason")


class RemoteEngine:
    """Token-level client of a vLLM (`/v1/completions`) or SGLang (`/generate`) server."""

    def __init__(
        self,
        base_url: str,
        *,
        api: RemoteApi = "vllm",
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        retries: int = 4,
        weight_updater: Callable[[Mapping[str, Any], int], None] | None = None,
        policy_version: int = 0,
        stream_interval: int = 4,
    ) -> None:
        if api not in ("vllm", "sglang"):
            raise ValueError(f"api must be 'vllm' or 'sglang', got {api!r}")
        if stream_interval < 1:
            raise ValueError(f"stream_interval is tokens per streamed chunk: at least 1, got {stream_interval}")
        self.stream_interval = stream_interval
        self.base_url = base_url.rstrip("/")
        self.api = api
        self.model = model
        self.retries = retries
        self.policy_version = policy_version
        self._weight_updater = weight_updater
        self._headers = {"content-type": "application/json"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._timeouts = {"connect_timeout_s": connect_timeout_s, "read_timeout_s": timeout_s}
        # Connections belong to the event loop that opened them; one engine serves many loops in turn (an
        # evaluation's Runtime per harness), so each loop gets its own. No cap: one per call in flight.
        self._pools: dict[asyncio.AbstractEventLoop, Connections] = {}

    def _pool(self) -> Connections:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            # A new loop: let go of the loops that ended (a pool holds its loop, so they would stay forever).
            for ended in [other for other in self._pools if other.is_closed()]:
                self._pools.pop(ended).abandon()
            pool = self._pools[loop] = Connections(**self._timeouts)
        return pool

    async def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, answered: Answered | None = None
    ) -> Any:
        """The answer's JSON; retried while the server cannot be reached or says 502/503/504.
        `answered` gets each answer's headers."""
        url = self.base_url + path
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retries),
            wait=wait_exponential(multiplier=0.2, max=5),
            retry=retry_if_exception_type(_RETRIED),
            reraise=True,
        )
        try:
            return await retrying(self._answer, method, url, orjson.dumps(body) if body is not None else b"", answered)
        except _TRANSPORT_ERRORS as exc:
            raise RemoteEngineUnreachable(f"{self.api} server at {url}: {type(exc).__name__}: {exc}") from exc

    async def _answer(self, method: str, url: str, content: bytes, answered: Answered | None) -> Any:
        """One attempt of `_request`."""
        response = await self._pool().request(method, url, headers=self._headers, content=content)
        if answered is not None:
            answered(response.headers)
        if response.status >= 400:
            text = response.content[:500].decode(errors="replace")
            if response.status in (502, 503, 504):
                raise _Unavailable(f"answered {response.status}: {text}")
            raise RemoteEngineError(f"{self.api} server at {url} answered {response.status}: {text}")
        return orjson.loads(response.content)

    async def _model_name(self) -> str:
        if self.model is None:
            self.model = (await self._request("GET", "/v1/models"))["data"][0]["id"]
        return self.model

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, answered: Answered | None = None
    ) -> Generation:
        """One generation, whole. `answered` is told the headers of the server's answer."""
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; the engine needs at least one prompt token")
        version = self.policy_version
        if self.api == "vllm":
            ids, logprobs, finish = await self._generate_vllm(prompt_ids, sampling, answered)
        else:
            ids, logprobs, finish = await self._generate_sglang(prompt_ids, sampling, answered)
        if len(ids) != len(logprobs):
            raise RemoteEngineError(f"server returned {len(ids)} token ids but {len(logprobs)} logprobs")
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish, policy_version=version)

    async def stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
        answered: Answered | None = None,
    ) -> AsyncIterator[TokenChunk]:
        """Yield tokens as the server decodes them (vLLM `stream: true`); the last chunk has the finish reason.
        `answered` is told the headers of the server's answer before its first tokens.

        Not retried: a failure after the first tokens cannot be replayed to the caller.
        """
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; the engine needs at least one prompt token")
        version = self.policy_version
        if self.api != "vllm":
            gen = await self.generate(prompt_ids, sampling, answered=answered)
            yield TokenChunk(gen.token_ids, gen.logprobs, gen.finish_reason, version)
            return
        body = {**await self._vllm_body(prompt_ids, sampling), "stream": True}
        if self.stream_interval > 1:
            body["stream_interval"] = self.stream_interval
        url = self.base_url + "/v1/completions"
        last: TokenChunk | None = None  # the chunk with the finish reason: yielded once the body is read to its end
        try:
            async with self._pool().stream("POST", url, headers=self._headers, content=orjson.dumps(body)) as response:
                if response.status >= 400:
                    text = (await response.read())[:500].decode(errors="replace")
                    raise RemoteEngineError(f"vllm server at {url} answered {response.status}: {text}")
                if answered is not None:
                    answered(response.headers)
                # Read to the body's end (past "[DONE]"): a response left unread closes its kept-alive connection.
                # So the chunk with the finish reason waits for it ("[DONE]" follows it at once): a caller that
                # stops at that chunk (the proxy's TokenFeed) must not leave the body unread.
                async for data in _sse_data(response.content.iter_any()):
                    if data == b"[DONE]":
                        continue
                    try:
                        choices = orjson.loads(data).get("choices") or []
                        if not choices:
                            continue  # a usage-only chunk
                        ids, logprobs, reason = _vllm_choice(choices[0])
                    except (KeyError, IndexError, ValueError, TypeError) as exc:  # orjson's error is a ValueError
                        raise RemoteEngineError(
                            f"unexpected /v1/completions stream chunk ({exc!r}): {data[:500]!r}"
                        ) from exc
                    if len(ids) != len(logprobs):
                        raise RemoteEngineError(f"server streamed {len(ids)} token ids but {len(logprobs)} logprobs")
                    if reason is not None:
                        last = TokenChunk(ids, logprobs, _finish(reason), version)
                    elif ids:
                        yield TokenChunk(ids, logprobs, None, version)
        except _TRANSPORT_ERRORS as exc:
            raise RemoteEngineUnreachable(f"vllm server at {url}: {type(exc).__name__}: {exc}") from exc
        yield last if last is not None else TokenChunk([], [], "abort", version)  # no finish reason: cut off

    async def _vllm_body(self, prompt_ids: list[int], s: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": await self._model_name(),
            "prompt": list(prompt_ids),
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k if s.top_k else -1,
            "logprobs": 1,
            # The ids come back as the logprob tokens' names ("token_id:<n>"), not as `return_token_ids`: that
            # also sends the whole prompt's ids back with every call (vLLM puts them in the first chunk), which
            # costs both processes more than the prompt's request as a rollout's context grows.
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop_token_ids:
            body["stop_token_ids"] = list(s.stop_token_ids)
        if s.ignore_eos:
            body["ignore_eos"] = True
        return body

    async def _generate_vllm(
        self, prompt_ids: list[int], s: SamplingParams, answered: Answered | None
    ) -> tuple[list[int], list[float], FinishReason]:
        data = await self._request("POST", "/v1/completions", await self._vllm_body(prompt_ids, s), answered)
        try:
            ids, logprobs, reason = _vllm_choice(data["choices"][0])
            return ids, logprobs, _finish(reason)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise RemoteEngineError(f"unexpected /v1/completions answer ({exc!r}): {str(data)[:500]}") from exc

    async def _generate_sglang(
        self, prompt_ids: list[int], s: SamplingParams, answered: Answered | None
    ) -> tuple[list[int], list[float], FinishReason]:
        params: dict[str, Any] = {
            "max_new_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k if s.top_k else -1,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if s.stop_token_ids:
            params["stop_token_ids"] = list(s.stop_token_ids)
        if s.ignore_eos:
            params["ignore_eos"] = True
        if s.seed is not None:
            params["sampling_seed"] = s.seed
        body = {
            "input_ids": list(prompt_ids),
            "sampling_params": params,
            "return_logprob": True,
            "logprob_start_len": -1,
        }
        data = await self._request("POST", "/generate", body, answered)
        try:
            meta = data["meta_info"]
            pairs = meta["output_token_logprobs"]  # [[logprob, token_id, text], ...]
            ids = [int(p[1]) for p in pairs]
            logprobs = [float(p[0]) for p in pairs]
            if data.get("output_ids") is not None and [int(t) for t in data["output_ids"]] != ids:
                raise ValueError("output_ids and output_token_logprobs disagree")
            return ids, logprobs, _finish(meta.get("finish_reason"))
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise RemoteEngineError(f"unexpected /generate answer ({exc!r}): {str(data)[:500]}") from exc

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        if self._weight_updater is None:
            raise NotImplementedError(
                "RemoteEngine cannot push weights by itself: pass weight_updater=... (for example a function that "
                "saves the state dict and calls the server's reload endpoint), or update the server out of band "
                "and call set_policy_version(version)"
            )
        self._weight_updater(state_dict, version)
        self.policy_version = version

    def set_policy_version(self, version: int) -> None:
        self.policy_version = version

    async def aclose(self) -> None:
        """Close this loop's connections (the pools of loops that ended went with them)."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.aclose()


async def _sse_data(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The payloads of an SSE body's `data:` lines, split from the raw bytes as they arrive."""
    pending = b""
    async for data in body:
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()
    if pending.startswith(b"data:"):
        yield pending[5:].strip()
