"""The training core: an update, weight sync into a real engine, exact resume, PPO's critic, LoRA export."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from clawgym_env.engines.transformers_engine import TransformersEngine
from clawgym_env.interfaces import SamplingParams
from clawgym_env.trajectory.packing import tree_logprobs
from trainers.core import OptimConfig, Trainer
from trainers.grpo import GRPO, GRPOConfig
from trainers.model import LoraSettings, apply_lora, export_weights, plain_copy
from trainers.ppo import PPO, PPOConfig
from trainers.rollout_batch import RolloutBatch
from trainers.synthetic_batches import SyntheticRollouts, forest_from_paths
from trainers.tree_batch import build_micro_batches
from trainers.tree_forward import Critic

from .conftest import VOCAB, small_qwen3

OPTIM = OptimConfig(lr=1e-3, token_budget=150, warmup_steps=1, schedule="cosine", total_steps=10)


def source(seed: int = 0) -> SyntheticRollouts:
    small = dict(turns=2, gen_tokens=(4, 8), tool_tokens=(3, 8), system_tokens=10)
    return SyntheticRollouts(vocab=VOCAB, group_size=2, tasks_per_step=2, harnesses=("A", "B"), seed=seed, **small)


def params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_update_trains_and_syncs_a_real_engine() -> None:
    model = small_qwen3(0)
    engine = TransformersEngine(copy.deepcopy(model), seed=0)
    trainer = Trainer(model, GRPO(), OPTIM, engine=engine)
    before = params(model)
    metrics = trainer.update(source().next_batch())
    assert engine.policy_version == 1 and trainer.step == 1
    assert metrics["micro_batches"] > 1  # the token budget split the batch
    assert metrics["unique_tokens"] < metrics["branch_tokens"]
    assert {"reward/A", "reward/B", "loss", "clip_frac", "is_kl_k3", "entropy", "grad_norm"} <= set(metrics)
    assert any(not torch.equal(a, b) for a, b in zip(before, params(model)))
    for name, p in model.named_parameters():  # a copy of the weights: exact
        assert torch.equal(dict(engine.model.named_parameters())[name], p.detach())

    # the engine's rollout log-probs now match the trainer's recomputation (float32, same weights)
    gen = asyncio.run(engine.generate([1, 2, 3, 4], SamplingParams(max_tokens=6, temperature=1.0, seed=0)))
    path = [(t, False) for t in [1, 2, 3, 4]] + [(t, True) for t in gen.token_ids]
    f = forest_from_paths([path], rollout_id="x")
    (mb,) = build_micro_batches([f], [0], [f.generated.astype("float32")], 1000)
    ours = tree_logprobs(model, mb.packed).logprobs[mb.loss_mask]
    # the engine decodes step by step with a KV cache, the trainer runs the whole sequence at once: the same
    # float32 arithmetic in another order. A log-softmax over 512 logits (|logit| < ~10) rounds by about
    # sqrt(512) * 2**-24 * 10 ~ 1e-5; 1e-4 leaves 10x, and a wrong position or token moves a log-prob by ~1
    assert torch.allclose(ours, torch.tensor(gen.logprobs), atol=1e-4)
    engine.close()


def test_degenerate_step_is_skipped_not_crashed() -> None:
    f = [forest_from_paths([[(1, False), (2, True)]], rollout_id=f"r{i}", reward=1.0) for i in range(3)]
    trainer = Trainer(small_qwen3(0), GRPO(), OPTIM)
    before = params(trainer.model)
    m = trainer.update(RolloutBatch.from_forests(f))
    assert m["update_skipped"] == 1.0 and m["groups_degenerate"] == 1 and trainer.step == 1
    assert all(torch.equal(a, b) for a, b in zip(before, params(trainer.model)))  # no step taken: untouched, exact


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_resume_from_checkpoint_reproduces_the_next_step(tmp_path, algo: str) -> None:
    def make() -> Trainer:
        torch.manual_seed(123)
        model = small_qwen3(0)
        if algo == "grpo":
            return Trainer(model, GRPO(GRPOConfig()), OPTIM)
        critic = Critic(small_qwen3(1))
        return Trainer(model, PPO(PPOConfig()), OPTIM.model_copy(update={"epochs": 2}), critic=critic)

    data = source(7)
    first = make()
    first.update(data.next_batch())
    first.save_checkpoint(tmp_path / "ckpt.pt", extra={"data": data.state()})
    torch.manual_seed(999)  # the checkpoint, not the caller, decides the RNG state
    expected_metrics = first.update(data.next_batch())
    expected = params(first.model)

    resumed = make()
    extra = resumed.load_checkpoint(tmp_path / "ckpt.pt")
    data2 = source(0)
    data2.set_state(extra["data"])
    assert resumed.step == 1
    metrics = resumed.update(data2.next_batch())
    # exact: the resumed trainer runs the same operations on the same shapes in the same process as the first
    # one did (CPU kernels are deterministic for a given shape and thread count), from the same restored state
    assert metrics["loss"] == expected_metrics["loss"]
    assert metrics["lr"] == expected_metrics["lr"]
    for a, b in zip(expected, params(resumed.model)):
        assert torch.equal(a, b)
    if algo == "ppo":
        for a, b in zip(first.critic.parameters(), resumed.critic.parameters()):
            assert torch.equal(a, b)


def test_ppo_update_trains_policy_and_critic() -> None:
    critic = Critic(small_qwen3(1))
    trainer = Trainer(small_qwen3(0), PPO(), OPTIM, critic=critic)
    data = source(3)
    batch = data.next_batch()
    before = [p.detach().clone() for p in critic.parameters()]
    m1 = trainer.update(batch)
    for _ in range(3):
        m = trainer.update(batch)
    assert m["value_loss"] < m1["value_loss"]
    assert any(not torch.equal(a, b) for a, b in zip(before, critic.parameters()))


def test_ppo_with_a_frozen_critic_trunk_trains_only_the_value_head() -> None:
    critic = Critic(small_qwen3(1), train_trunk=False)
    trainer = Trainer(small_qwen3(0), PPO(PPOConfig(train_critic_trunk=False)), OPTIM, critic=critic)
    trunk_before = [p.detach().clone() for p in critic.decoder.parameters()]
    head_before = critic.value_head.weight.detach().clone()
    batch = source(3).next_batch()
    m1 = trainer.update(batch)
    for _ in range(3):
        m = trainer.update(batch)
    assert m["value_loss"] < m1["value_loss"]
    assert not torch.equal(head_before, critic.value_head.weight)
    assert all(torch.equal(a, b) for a, b in zip(trunk_before, critic.decoder.parameters()))


def test_lora_trains_adapters_only_and_exports_merged_weights() -> None:
    model = apply_lora(small_qwen3(0), LoraSettings(enabled=True, r=4, alpha=8))
    trainer = Trainer(model, GRPO(), OPTIM)
    base_before = {k: v.clone() for k, v in export_weights(model, full=True).items()}
    trainer.update(source(1).next_batch())
    exported = export_weights(model, full=True)
    merged = copy.deepcopy(model).merge_and_unload()
    plain = dict(merged.named_parameters())
    assert set(exported) == set(plain)
    for k, v in exported.items():  # W + scale * B @ A two ways (ours, peft's merge): a few ulps of |W| < 1, < 1e-6
        assert torch.allclose(v, plain[k], atol=1e-6)
    changed = [k for k in exported if not torch.equal(exported[k], base_before[k])]
    assert changed and all(any(t in k for t in ("q_proj", "k_proj", "v_proj", "o_proj")) for k in changed)
    # the default export (the weight sync) is the adapted layers only: the rest is frozen, as the engine has it
    synced = export_weights(model)
    assert set(changed) <= set(synced) and len(synced) < len(exported) / 2
    assert all(any(t in k for t in ("q_proj", "k_proj", "v_proj", "o_proj")) for k in synced)
    assert all(torch.equal(v, exported[k]) for k, v in synced.items())


def test_shared_prompts_train_exactly_like_separate_rollouts() -> None:
    """optim.share_prompts computes a group's common prompt once; the update must not change."""
    import numpy as np

    from clawgym_env.trajectory.packing import leading_context

    batch = source(3).next_batch()
    prompt = np.random.default_rng(7).integers(0, VOCAB, size=8)
    for f in batch.forests:  # the rollouts of one task start with one system prompt, as through a harness
        chain = leading_context(f)
        f.tokens = f.tokens.copy()
        f.tokens[chain[:8]] = prompt
    results = {}
    for share in (False, True):
        model = small_qwen3(0)
        trainer = Trainer(model, GRPO(), OPTIM.model_copy(update={"token_budget": 10_000, "share_prompts": share}))
        metrics = trainer.update(batch)
        # Adam's first moment after one step is (1 - beta1) x the clipped gradient: the update's real input.
        results[share] = (metrics, [trainer.optimizer.state[p]["exp_avg"].clone() for p in model.parameters()])
    (plain, g_plain), (shared, g_shared) = results[False], results[True]
    assert shared["unique_tokens"] < plain["unique_tokens"] and shared["branch_tokens"] == plain["branch_tokens"]
    # Sharing the prompt changes only the order of float32 sums (other packing, other reduction order on each
    # CPU's kernels). A sum of n float32 terms is exact to about n * 2**-24 of the sum of their magnitudes; with
    # n < 10**3 tokens that is < 6e-5 relative, so 1e-4 of the largest value bounds it on any CPU.
    assert shared["loss"] == pytest.approx(plain["loss"], rel=1e-4, abs=1e-4 * abs(plain["loss"]) + 1e-7)
    scale = max(float(g.abs().max()) for g in g_plain)
    for a, b in zip(g_plain, g_shared):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * scale)
    # Parameters are not compared: Adam's first step moves each weight by lr * g / (|g| + eps), which turns
    # rounding noise in a near-zero gradient into a visible change (that is what failed on AVX-512/AMX CPUs).


def test_reused_batches_record_old_logprobs_at_the_sampling_temperature() -> None:
    """With epochs > 1 the pre-update log-probs are recorded first; at the loss's temperature, so the first
    pass sees a ratio of exactly 1 and a tiny learning rate keeps the second pass near 1."""
    optim = OPTIM.model_copy(update={"lr": 1e-7, "epochs": 2})
    trainer = Trainer(small_qwen3(0), GRPO(GRPOConfig(temperature=0.5)), optim)
    metrics = trainer.update(source(2).next_batch())
    # Adam moves each weight by <= lr = 1e-7, which moves a log-prob of this 2-layer model by far less than 1e-3;
    # old log-probs at temperature 1 instead of 0.5 put the mean ratio tens of percent away from 1
    assert abs(metrics["ratio_mean"] - 1.0) < 1e-3, metrics["ratio_mean"]


def test_plain_copy_shares_only_frozen_weights_and_serves_the_merged_policy() -> None:
    """The engine's copy of a LoRA policy shares the frozen base weights outside the adapted layers (no
    second copy in memory), owns the adapted layers, and after training and a weight sync computes exactly
    what the merged policy computes; training never writes the shared weights."""
    model = apply_lora(small_qwen3(0), LoraSettings(enabled=True, r=4, alpha=8))
    engine_model = plain_copy(model, share_frozen=True)
    base = dict(model.get_base_model().named_parameters())
    mine = dict(engine_model.named_parameters())
    shared = [k for k, p in mine.items() if p.data_ptr() == base.get(k, p.new_empty(0)).data_ptr()]
    assert shared and all(not any(t in k for t in ("q_proj", "k_proj", "v_proj", "o_proj")) for k in shared)
    assert all(
        mine[k].data_ptr() != base[k.replace("proj.", "proj.base_layer.")].data_ptr() for k in mine if "q_proj" in k
    )
    frozen_before = {k: base[k].detach().clone() for k in shared}
    Trainer(model, GRPO(), OPTIM).update(source(1).next_batch())
    with torch.no_grad():
        for name, value in export_weights(model).items():  # the weight sync: adapted layers only
            mine[name].copy_(value)
    assert all(torch.equal(base[k], frozen_before[k]) for k in shared)
    ids = torch.randint(0, VOCAB, (1, 12))
    reference = copy.deepcopy(model).merge_and_unload()
    with torch.no_grad():
        assert torch.allclose(engine_model(ids).logits, reference(ids).logits, atol=1e-5)
    independent = plain_copy(model)  # the default (a critic's trunk trains): nothing shared
    assert not any(p.data_ptr() == base[k].data_ptr() for k, p in independent.named_parameters() if k in base)


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_autocast_update_trains_float32_weights_close_to_a_float32_update(algo: str) -> None:
    """`optim.autocast=bfloat16`: the passes run in bfloat16 (the loss differs from float32's only by rounding),
    the LoRA adapters and the optimizer stay float32, and the update moves the same weights in nearly the
    same direction as a float32 update of the same batch."""

    def run(autocast: str | None) -> tuple[Trainer, dict[str, float]]:
        torch.manual_seed(0)
        model = apply_lora(small_qwen3(0), LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0))
        optim = OPTIM.model_copy(update={"autocast": autocast, "warmup_steps": 0})
        critic = Critic(small_qwen3(1)) if algo == "ppo" else None
        trainer = Trainer(model, PPO(PPOConfig()) if algo == "ppo" else GRPO(), optim, critic=critic)
        return trainer, trainer.update(source().next_batch())

    (full, m_full), (auto, m_auto) = run(None), run("bfloat16")
    assert abs(m_full["loss"] - m_auto["loss"]) < 0.05 * abs(m_full["loss"]) + 1e-3
    assert m_full["loss"] != m_auto["loss"]  # bfloat16 really ran (its rounding shows)
    moved_full, moved_auto = [], []
    for (name, p0), (_, p1) in zip(full.model.named_parameters(), auto.model.named_parameters(), strict=True):
        assert p1.dtype == torch.float32, name
        if "lora_B" in name:  # lora_B starts at zero: what it holds after one step is the update
            moved_full.append(p0.detach().flatten())
            moved_auto.append(p1.detach().flatten())
    a, b = torch.cat(moved_full), torch.cat(moved_auto)
    assert a.norm() > 0 and torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.9


def test_the_autocast_benchmark_times_both_modes_and_measures_the_gap() -> None:
    """benchmarks.autocast_bench on the tiny model: both modes train, and the bfloat16 pass's log-probs differ
    from float32's by bfloat16 rounding (not zero: autocast ran; well under 1: the same model)."""
    from benchmarks.autocast_bench import main

    result = main(["--model", "tiny-qwen3", "--rounds", "1", "--rollouts", "4", "--scale", "20"])
    assert result["speedup"] > 0 and 0 < result["logprob_gap_mean"] < 0.2 and result["logprob_gap_max"] < 1.0
