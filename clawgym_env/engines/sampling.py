"""Next-token sampling that also returns the logprob of the token under the distribution it came from.

Recorded logprob (the "behaviour policy" the trainer corrects against):
- temperature > 0: log-probability under the distribution actually sampled from, i.e. softmax of
  logits / temperature after top-k and top-p truncation (renormalised). With temperature 1 and no
  truncation this is exactly the model's log-softmax, which a teacher-forced pass recomputes.
- temperature == 0 (greedy): the point mass would give 0.0 for every token, which carries no
  information, so the model's untempered log-softmax of the argmax token is recorded instead.
"""

from __future__ import annotations

import torch

from clawgym_env.interfaces import SamplingParams


def processed_logprobs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Log-probabilities of the distribution sampled from (1-D logits in, 1-D log-probs out)."""
    logits = logits.float()
    if sampling.temperature == 0:
        return torch.log_softmax(logits, dim=-1)
    scaled = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, sampling.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly above each token
        drop_sorted = before >= sampling.top_p  # keeps the smallest set reaching top_p (at least one)
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def sample_token(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> tuple[int, float]:
    """(token id, its recorded logprob) for one row of next-token logits."""
    logprobs = processed_logprobs(logits, sampling)
    if sampling.temperature == 0:
        token = int(torch.argmax(logprobs))
    else:
        # Exponential race (as vLLM samples): argmax p_i / E_i with E_i ~ Exp(1) picks i with probability
        # p_i. torch.multinomial over a 150k vocabulary is ~30x slower on CPU.
        race = torch.empty_like(logprobs).exponential_(generator=generator)
        token = int(torch.argmax(logprobs - race.log()))
    return token, float(logprobs[token])
