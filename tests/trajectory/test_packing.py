"""Packed tree batches on a real (small, randomly initialised) transformers model, float32 on CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from clawgym_env.specs import ForestOptions
from clawgym_env.trajectory.packing import pack_forest, pack_forests, tree_logprobs
from clawgym_env.trajectory.reconstruct import build_forest
from clawgym_env.trajectory.synthetic_recordings import synthetic_rollout

VOCAB = 1000


# Tolerances. The packed and the per-branch computations (or two packings) run the same float32 arithmetic
# in another order: other attention shapes, other matmul blockings on each CPU's kernels.
# - A log-prob or entropy is a log-softmax over 1000 logits (|logit| < ~10) after a 2-layer, 64-wide forward:
#   its rounding error is ~sqrt(1000) * 2**-24 * 10 ~ 2e-5 for independent roundings (measured: <= 4e-6);
#   LOGPROB_ATOL = 1e-4 leaves 5x over that, while a wrong parent or position moves a log-prob by ~1.
# - A gradient entry sums one term per token (~230 tokens): ~230 * 2**-24 = 1.4e-5 of the sum of magnitudes,
#   bounded by 1e-4 of the largest gradient entry (GRAD_RTOL_OF_MAX); rtol 1e-3 covers the large entries.
LOGPROB_ATOL = 1e-4
GRAD_RTOL_OF_MAX = 1e-4


def assert_same_gradients(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    scale = max(float(g.abs().max()) for g in a.values())
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-3, atol=GRAD_RTOL_OF_MAX * scale), name


def all_logprobs(model: torch.nn.Module, batch):  # noqa: ANN001
    """Log-probs and entropies of every token that has a parent (context tokens included), [T]."""
    return tree_logprobs(model, batch, batch.parent_index >= 0)


def small_model(arch: str, impl: str) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        attn_implementation=impl,
    )
    if arch == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common)).float()
    return LlamaForCausalLM(LlamaConfig(**common)).float()


def forest(seed: int, mode: str = "openclaw_chat"):
    """A branching forest: non-prefix calls and kept retries give several branches with shared prefixes."""
    r = synthetic_rollout(
        seed,
        rollout_id=f"r{seed}",
        mode=mode,
        turns=3,
        retry_prob=0.5,
        vocab=VOCAB,
        system_tokens=20,
        tools_tokens=10,
        gen_tokens=(8, 20),
        tool_tokens=(5, 15),
    )
    f = build_forest(r.calls, rollout_id=r.rollout_id, reward=1.0, options=ForestOptions(drop_dead_leaves=False))
    assert f.num_branches >= 3
    return f


def branchwise(model: torch.nn.Module, batch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each branch run on its own as a plain causal sequence: (logprobs, entropies) of tokens 1..n-1."""
    out = []
    for nodes in batch.unpack(torch.arange(batch.num_tokens)):
        ids = batch.input_ids[0, nodes][None]
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        out.append((logp.gather(-1, ids[0, 1:, None])[:, 0], -(logp.exp() * logp).sum(-1)))
    return out


@pytest.mark.parametrize(("arch", "impl"), [("qwen3", "sdpa"), ("qwen3", "eager"), ("llama", "sdpa")])
def test_packed_logprobs_and_gradients_equal_branchwise(arch: str, impl: str) -> None:
    model = small_model(arch, impl)
    batch = pack_forest(forest(1))
    assert batch.num_tokens < batch.branch_tokens  # something is shared

    out = all_logprobs(model, batch)
    packed_lp, packed_ent = out.logprobs, out.entropy
    ref = branchwise(model, batch)
    for (lp_b, ent_b), got_lp, got_ent in zip(ref, batch.unpack(packed_lp), batch.unpack(packed_ent), strict=True):
        assert (got_lp[1:] - lp_b).abs().max().item() < LOGPROB_ATOL
        assert (got_ent[1:] - ent_b).abs().max().item() < LOGPROB_ATOL

    # gradients of a sum over tokens where each unique token counts once
    model.zero_grad()
    all_logprobs(model, batch).logprobs[batch.parent_index >= 0].sum().backward()
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    owner = np.full(batch.num_tokens, -1)  # the first branch holding each node counts it
    nodes_per_branch = batch.unpack(torch.arange(batch.num_tokens))
    for b, nodes in reversed(list(enumerate(nodes_per_branch))):
        owner[nodes.numpy()] = b
    loss = 0.0
    for b, ((lp_b, _), nodes) in enumerate(zip(branchwise(model, batch), nodes_per_branch, strict=True)):
        counted = torch.from_numpy(owner[nodes[1:].numpy()] == b)
        loss = loss + lp_b[counted].sum()
    loss.backward()
    assert_same_gradients(packed_grads, {n: p.grad for n, p in model.named_parameters()})


def test_layout_fields() -> None:
    f = forest(2)
    batch = pack_forest(f)
    T = f.num_tokens
    assert batch.input_ids.shape == (1, T) and batch.attention_mask().shape == (1, 1, T, T)
    assert torch.equal(batch.position_ids[0], torch.from_numpy(f.depths()))
    assert torch.equal(batch.parent_index, torch.from_numpy(f.parents))
    assert torch.equal(batch.loss_mask, torch.from_numpy(f.generated))
    gen = batch.loss_mask
    np.testing.assert_array_equal(batch.rollout_logprobs[gen].numpy(), f.logprobs[f.generated])
    assert [t.tolist() for t in batch.unpack(batch.input_ids[0])] == f.branch_tokens()
    member = batch.branch_membership()
    assert member.shape == (T, f.num_branches) and member.any(1).all()
    mask = batch.attention_mask()[0, 0]
    assert mask.diagonal().all() and not torch.triu(mask, 1).any()  # self and only earlier (ancestor) nodes
    assert mask.sum().item() == int((f.depths() + 1).sum())  # each token sees exactly its depth + 1 ancestors
    additive = batch.attention_mask(torch.float32)[0, 0]
    assert torch.equal(additive == 0, mask)
    with pytest.raises(ValueError, match="no backward pass on CPU"):
        batch.flex_block_mask("cpu")


def test_bin_packing_is_block_diagonal_and_matches_single_packs() -> None:
    forests = [forest(s) for s in (3, 4, 5)]
    failed = build_forest([], rollout_id="empty")
    sizes = sorted(f.num_tokens for f in forests)
    budget = sizes[-1] + sizes[0]
    batches = pack_forests([*forests, failed], token_budget=budget)
    assert sorted(r for b in batches for r in b.rollout_ids) == ["r3", "r4", "r5"]
    assert all(b.num_tokens <= budget for b in batches) and len(batches) == 2
    two = next(b for b in batches if len(b.rollout_ids) == 2)
    mask = two.attention_mask()[0, 0]
    first = two.forest_index == 0
    assert not mask[first][:, ~first].any() and not mask[~first][:, first].any()
    model = small_model("qwen3", "sdpa")
    together = all_logprobs(model, two).logprobs
    by_id = {f.rollout_id: f for f in forests}
    for k, rid in enumerate(two.rollout_ids):
        alone = all_logprobs(model, pack_forest(by_id[rid])).logprobs
        assert (together[two.forest_index == k] - alone).abs().max().item() < LOGPROB_ATOL
    (big,) = pack_forests(forests[:1], token_budget=10)  # a forest cannot be split: it goes alone, over budget
    assert big.rollout_ids == [forests[0].rollout_id] and big.num_tokens == forests[0].num_tokens > 10
    with pytest.raises(ValueError, match="only ok forests"):
        pack_forest(failed)


def group_forests(n: int = 3, shared: int = 25):
    """Forests of one 'group': different rollouts whose prompts start with the same context tokens."""
    from clawgym_env.trajectory.packing import leading_context

    common = np.random.default_rng(99).integers(0, VOCAB, size=shared)
    out = []
    for s in range(6, 6 + n):
        f = forest(s)
        chain = leading_context(f)
        assert chain.shape[0] >= shared
        f.tokens = f.tokens.copy()
        f.tokens[chain[:shared]] = common
        out.append(f)
    return out


def test_shared_context_is_computed_once_with_equal_logprobs_and_gradients() -> None:
    forests = group_forests()
    model = small_model("qwen3", "sdpa")
    (plain,) = pack_forests(forests, token_budget=100_000)
    (shared,) = pack_forests(forests, token_budget=100_000, share_context=True)
    assert plain.num_tokens == sum(f.num_tokens for f in forests)
    # the 25 common leading tokens (at least) are kept once instead of three times
    assert shared.num_tokens <= plain.num_tokens - 2 * 25
    assert shared.branch_tokens == plain.branch_tokens and shared.num_branches == plain.num_branches
    assert int(shared.loss_mask.sum()) == int(plain.loss_mask.sum())  # no trained token is shared
    # every packed token maps back to a forest node with the same token id
    ordered = [next(f for f in forests if f.rollout_id == rid) for rid in shared.rollout_ids]
    flat_tokens = np.concatenate([f.tokens for f in ordered])
    np.testing.assert_array_equal(shared.gather([f.tokens for f in ordered]), shared.input_ids[0].numpy())
    assert np.array_equal(flat_tokens[shared.token_source.numpy()], shared.input_ids[0].numpy())
    # branch contents are the same token sequences
    assert [t.tolist() for t in shared.unpack(shared.input_ids[0])] == [
        t.tolist() for t in plain.unpack(plain.input_ids[0])
    ]

    lp_plain = all_logprobs(model, plain).logprobs
    lp_shared = all_logprobs(model, shared).logprobs
    for a, b in zip(plain.unpack(lp_plain), shared.unpack(lp_shared), strict=True):
        assert (a[1:] - b[1:]).abs().max().item() < LOGPROB_ATOL
    grads = []
    for batch in (plain, shared):
        model.zero_grad()
        tree_logprobs(model, batch).logprobs[batch.loss_mask].sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert_same_gradients(grads[0], grads[1])


def test_shared_context_lets_a_group_fit_a_smaller_budget() -> None:
    forests = group_forests()
    together = sum(f.num_tokens for f in forests) - 2 * 25
    assert len(pack_forests(forests, token_budget=together)) > 1
    (one,) = pack_forests(forests, token_budget=together, share_context=True)
    assert one.num_tokens <= together
    # forests with nothing in common share nothing
    other = forest(20)
    (mixed,) = pack_forests([forests[0], other], token_budget=100_000, share_context=True)
    assert mixed.num_tokens == forests[0].num_tokens + other.num_tokens - _common_len(forests[0], other)


def long_context_group(n: int) -> list:
    """A group whose shared context (a 300-token system prompt, like OpenClaw's 8k) dwarfs each rollout's own
    tokens (one short turn)."""
    from clawgym_env.trajectory.packing import leading_context

    out = []
    for s in range(n):
        r = synthetic_rollout(
            30 + s, rollout_id=f"g{s}", turns=1, retry_prob=0.0, vocab=VOCAB, system_tokens=300, tools_tokens=10,
            gen_tokens=(8, 12), tool_tokens=(5, 8),
        )  # fmt: skip
        f = build_forest(r.calls, rollout_id=r.rollout_id, reward=1.0, options=ForestOptions(drop_dead_leaves=False))
        out.append(f)
    chain = leading_context(out[0])
    for f in out[1:]:  # the same context tokens: one group's prompt
        f.tokens = f.tokens.copy()
        f.tokens[leading_context(f)[: len(chain)]] = out[0].tokens[chain]
    return out


def test_a_group_whose_shared_context_is_past_the_budget_still_packs_together() -> None:
    """OpenClaw's system prompt alone is past the default budget: its group's rollouts must still share it
    (one batch computing it once), not get a batch each; a forest sharing nothing stays out of that bin."""
    forests = long_context_group(4)
    shared = _common_len(forests[0], forests[1])
    budget = 100
    assert shared > budget  # the context alone is past the budget
    assert len(pack_forests(forests, token_budget=budget)) == 4  # without sharing: one batch per rollout
    (one,) = pack_forests(forests, token_budget=budget, share_context=True)
    assert one.num_tokens == sum(f.num_tokens for f in forests) - 3 * shared  # the context computed once
    assert one.num_tokens <= max(f.num_tokens for f in forests) + budget  # the bin's limit
    other = forest(20)  # shares nothing with the group: a batch of its own
    assert len(pack_forests([*forests, other], token_budget=budget, share_context=True)) == 2
    many = long_context_group(12)  # more than one budget beyond the first: a second bin of the group
    assert len(pack_forests(many, token_budget=budget, share_context=True)) >= 2


def _common_len(a, b) -> int:
    from clawgym_env.trajectory.packing import leading_context

    x, y = a.tokens[leading_context(a)], b.tokens[leading_context(b)]
    n = min(len(x), len(y))
    diff = np.flatnonzero(x[:n] != y[:n])
    return int(diff[0]) if diff.size else n


@pytest.mark.parametrize("lora", [False, True])
def test_the_output_head_in_chunks_gives_the_same_logprobs_and_gradients(lora: bool) -> None:
    """`head_chunk` runs the head a few targets at a time (recomputed in backward): same values and
    gradients as the whole head at once, through a PEFT LoRA wrapper too, and the head is put back."""
    model = small_model("qwen3", "sdpa")
    if lora:
        from trainers.model import LoraSettings, apply_lora

        model = apply_lora(model, LoraSettings(enabled=True, r=4, alpha=8))
        for name, p in model.named_parameters():  # a non-zero adapter, so its gradient path is not trivial
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
    batch = pack_forest(forest(2))
    head = model.get_output_embeddings()
    results = {}
    for chunk in (None, 7):
        model.zero_grad()
        out = tree_logprobs(model, batch, batch.parent_index >= 0, temperature=0.8, head_chunk=chunk)
        (out.logprobs.sum() + 0.1 * out.entropy.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[chunk] = (out.logprobs.detach(), out.entropy.detach(), grads)
    assert model.get_output_embeddings() is head
    (lp, ent, grads), (lp_c, ent_c, grads_c) = results[None], results[7]
    assert int((batch.parent_index >= 0).sum()) > 7 * 10  # many chunks
    assert (lp - lp_c).abs().max().item() < LOGPROB_ATOL and (ent - ent_c).abs().max().item() < LOGPROB_ATOL
    assert grads.keys() == grads_c.keys() and (not lora or all("lora_" in n for n in grads))
    assert_same_gradients(grads, grads_c)


def test_the_step_memory_benchmark_measures_both_head_modes() -> None:
    """benchmarks.step_memory on the tiny model: each mode in its own process; chunking the head must show
    less added memory (its whole logits are ~1 GB here, a chunk's a tenth of that)."""
    from benchmarks.step_memory import main

    result = main(["--compare", "head", "--model", "tiny-qwen3", "--rounds", "1", "--rollouts", "2", "--scale", "40"])
    assert result["memory_ratio"] > 1.5 and result["saved_mb"] > 200 and result["time_ratio"] > 0
