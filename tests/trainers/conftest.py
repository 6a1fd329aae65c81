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
