"""KV-cache tensors between calls: a prefix store keyed by token ids, and batch padding helpers.

Consecutive calls of one rollout share almost their whole prompt (the harness re-sends the
conversation and appends to it), so the engine keeps the KV cache of the last few sequences it
finished and, for a new prompt, reuses the entry with the longest common token prefix: only the new
suffix is prefilled. Caches are held as plain per-layer `(keys, values)` tensors of shape
`[batch, kv_heads, seq, head_dim]`; this suits full-attention decoder models (Qwen2/3, Llama).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # one (keys, values) pair per layer


def common_prefix_len(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.numel(), b.numel())
    if n == 0:
        return 0
    diff = torch.nonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.numel() else n


def crop(kv: KV, length: int) -> KV:
    return [(k[:, :, :length], v[:, :, :length]) for k, v in kv]


def left_pad(kv: KV, pad: int) -> KV:
    if pad == 0:
        return kv
    return [(torch.nn.functional.pad(k, (0, 0, pad, 0)), torch.nn.functional.pad(v, (0, 0, pad, 0))) for k, v in kv]


def concat_batch(parts: list[KV]) -> KV:
    return [(torch.cat([p[i][0] for p in parts]), torch.cat([p[i][1] for p in parts])) for i in range(len(parts[0]))]


def select_rows(kv: KV, rows: torch.Tensor, start: int = 0) -> KV:
    return [(k[rows, :, start:], v[rows, :, start:]) for k, v in kv]


@dataclass
class PrefixCacheStats:
    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0


class PrefixCache:
    """An LRU of sequences' KV caches, looked up by longest common token prefix.

    Entries are shared: `take` returns a cropped view and leaves the entry in place, so the rollouts of
    one group, which all start with the same long system prompt, prefill it once. That is safe because
    nothing writes into a cached tensor: transformers' DynamicCache appends with `torch.cat` (new tensors)
    and batching pads into new tensors.
    """

    def __init__(self, max_entries: int = 8) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[int, tuple[torch.Tensor, KV]] = OrderedDict()
        self._next_key = 0
        self._lock = threading.Lock()
        self.stats = PrefixCacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, prompt: list[int]) -> tuple[int, KV | None]:
        """(number of prompt tokens whose KV is reused, that KV cropped to them) or (0, None)."""
        if self.max_entries <= 0:
            return 0, None
        ids = torch.tensor(prompt, dtype=torch.long)
        with self._lock:
            self.stats.lookups += 1
            best_key, best_len = None, 0
            for key, (tokens, _) in self._entries.items():
                n = common_prefix_len(tokens, ids)
                if n > best_len:
                    best_key, best_len = key, n
            # At least one prompt token must still be fed to get next-token logits.
            reuse = min(best_len, len(prompt) - 1)
            if best_key is None or reuse <= 0:
                return 0, None
            self._entries.move_to_end(best_key)
            kv = self._entries[best_key][1]
            self.stats.hits += 1
            self.stats.reused_tokens += reuse
        return reuse, crop(kv, reuse)

    def put(self, tokens: list[int], kv: KV) -> None:
        """Store `kv` (covering `tokens`); an entry that is a prefix of `tokens` is replaced by it."""
        if self.max_entries <= 0 or not tokens:
            return
        new = torch.tensor(tokens, dtype=torch.long)
        with self._lock:
            for key in [
                k
                for k, (t, _) in self._entries.items()
                if t.numel() <= new.numel() and common_prefix_len(t, new) == t.numel()
            ]:
                del self._entries[key]  # the longer sequence serves every lookup the shorter one did
            self._entries[self._next_key] = (new, kv)
            self._next_key += 1
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
