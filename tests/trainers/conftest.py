"""Shared pieces of the trainer tests: a small random Qwen3 model (real architecture, real kernels)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

VOCAB = 512

# Tiny models on a shared 2-core machine: one intra-op thread is ~10x faster than contended threads.
torch.set_num_threads(1)


def small_qwen3(seed: int = 0, impl: str = "sdpa") -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    config._attn_implementation = impl
    return Qwen3ForCausalLM(config).float()


@pytest.fixture
def model() -> Qwen3ForCausalLM:
    return small_qwen3()


def assert_same_loss_and_gradients(
    loss_a: torch.Tensor, loss_b: torch.Tensor, grads_a: list[torch.Tensor], grads_b: list[torch.Tensor]
) -> None:
    """Two computations of one objective that differ only in the order of their float32 sums (packing,
    micro-batching, recomputation, the CPU's kernels) agree to rounding.

    Tolerance: a sum of n float32 terms is exact to about n * 2**-24 of the sum of the terms' magnitudes.
    The loss is a mean over n ~ 250 trained tokens of terms of size <= ~3 (advantage x ratio x correction
    weight, plus small entropy and KL terms), so orderings differ by at most ~250 * 6e-8 * 3 = 5e-5: 1e-4
    absolute (or relative, for a loss above 1) bounds it. A gradient entry sums as many token terms, so
    1e-4 of the largest gradient entry bounds it; rtol 1e-3 covers the large entries. A real difference of
    objective (a token counted twice, a wrong weight) moves both by percent.
    """
    a, b = float(loss_a.detach()), float(loss_b.detach())
    assert abs(a - b) <= 1e-4 * max(1.0, abs(a)), (a, b)
    scale = max(float(g.abs().max()) for g in grads_a)
    assert scale > 0
    for a, b in zip(grads_a, grads_b, strict=True):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-4 * scale), float((a - b).abs().max())
