"""Bounded-staleness training (`trainer.max_staleness`): accounting, dropping, the producer's bound, the
correction against stale behaviour log-probs, and the real loop (white-box harness, transformers engine)
running ahead of the trainer, resumed."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from clawgym_env.engines.transformers_engine import TransformersEngine
from clawgym_env.interfaces import SamplingParams
from evaluation.evidence import read_rows
from tests.trainers.conftest import small_qwen3
from trainers.core import OptimConfig, Trainer
from trainers.grpo import GRPO, GRPOConfig
from trainers.rollout_batch import RolloutBatch
from trainers.rollout_producer import RolloutProducer
from trainers.staleness import apply_staleness, oldest_version
from trainers.synthetic_batches import forest_from_paths


def _forest(task: str, versions: list[int], harness: str = "H", rid: str = "r") -> object:
    """A rollout of one call per entry of `versions`, each generating one token under that version."""
    path = [(1, False)] + [(10 + i, True) for i in range(len(versions))]
    forest = forest_from_paths([path], task_id=task, harness=harness, rollout_id=rid)
    served = np.array([-1] + versions, np.int32)
    return dataclasses.replace(forest, policy_versions=served)


def _batch(rollouts: list[tuple[str, str, list[int]]]) -> RolloutBatch:
    forests = [_forest(t, v, h, f"r{i}") for i, (t, h, v) in enumerate(rollouts)]
    batch = RolloutBatch.from_forests(forests, [float(i % 2) for i in range(len(forests))])
    batch.infos = [{} for _ in forests]
    return batch


def test_staleness_is_measured_from_each_groups_oldest_call_and_past_the_bound_the_group_goes() -> None:
    # group (a, H): one rollout straddles a push (calls at versions 3 and 4), so the group is 2 behind at 5;
    # group (b, H): 1 behind; group (a, G): another harness on the same task is its own group.
    batch = _batch([("a", "H", [3, 4]), ("a", "H", [4, 4]), ("b", "H", [4]), ("b", "H", [4]), ("a", "G", [5])])
    assert oldest_version(batch.forests[0]) == 3
    kept, m = apply_staleness(batch, version=5, max_staleness=1)
    assert kept.task_ids == ["b", "b", "a"] and kept.harnesses == ["H", "H", "G"]
    assert m["groups_stale"] == 1 and m["rollouts_stale_dropped"] == 2 and m["rollouts_stale_kept"] == 0
    assert m["staleness_max"] == 2 and m["staleness_mean"] == pytest.approx((2 + 1 + 1 + 1 + 0) / 5)
    assert m["staleness/H"] == pytest.approx(5 / 4) and m["staleness/G"] == 0
    assert [i.get("stale_dropped", False) for i in batch.infos] == [True, True, False, False, False]

    kept, m = apply_staleness(_batch([("a", "H", [3, 4]), ("a", "H", [4])]), 5, 1, "keep")
    assert len(kept) == 2 and m["rollouts_stale_kept"] == 2 and m["rollouts_stale_dropped"] == 0
    kept, m = apply_staleness(_batch([("a", "H", [5]), ("a", "H", [5])]), 5, 0)  # synchronous: nothing behind
    assert len(kept) == 2 and m["staleness_max"] == 0 and m["groups_stale"] == 0


def test_a_rollout_that_generated_nothing_has_no_staleness() -> None:
    forest = forest_from_paths([[(1, False), (2, False)]])
    assert oldest_version(forest) is None
    batch = RolloutBatch.from_forests([forest, forest], [0.0, 1.0])
    kept, m = apply_staleness(batch, version=9, max_staleness=0)
    assert len(kept) == 2 and m["staleness_max"] == 0


@pytest.mark.parametrize("k", [0, 1, 2])
def test_the_producer_starts_batch_b_only_once_the_trainer_released_version_b_minus_k(k: int) -> None:
    released: list[int] = []  # the trainer's released version at the start of each collection
    holder: list[RolloutProducer] = []
    built = threading.Event()

    def collect() -> tuple[RolloutBatch, int]:
        built.wait()
        released.append(holder[0].released)
        return _batch([("a", "H", [0])]), len(released)

    holder.append(RolloutProducer(collect, start_version=10, batches=4, max_staleness=k))
    producer = holder[0]
    built.set()
    for step in range(4):
        produced, _ = producer.next()
        assert produced.position == step + 1
        time.sleep(0.2)  # give the producer the chance to run ahead further than allowed
        assert producer.in_flight <= k, "the producer ran past its bound"
        producer.release(10 + step + 1)
    assert released == [10 + max(0, b - k) for b in range(4)]


def test_a_collection_error_reaches_the_trainer_and_stop_ends_the_producer() -> None:
    def broken() -> tuple[RolloutBatch, None]:
        raise RuntimeError("sandbox backend down")

    with pytest.raises(RuntimeError, match="sandbox backend down"):
        RolloutProducer(broken, start_version=0, batches=2, max_staleness=1).next()
    started = threading.Event()

    def slow() -> tuple[RolloutBatch, None]:
        started.set()
        return _batch([("a", "H", [0])]), None

    producer = RolloutProducer(slow, start_version=0, batches=5, max_staleness=0)
    producer.next()
    producer.stop(timeout=5)
    assert producer.in_flight == 0 and started.is_set()  # it waited for a release that never came


def test_the_correction_weighs_stale_tokens_by_the_new_policy_over_the_recorded_behaviour() -> None:
    """The engine samples under version 0; the trainer has moved on (version 1, weights perturbed). The
    trainer's importance ratios must be exp(log p_new(token) - recorded log p_old(token)), computed here by
    hand with a plain forward pass of the new weights."""
    torch.manual_seed(0)
    old = small_qwen3(seed=0)
    engine = TransformersEngine(copy.deepcopy(old), seed=0)
    prompt = [5, 17, 33, 2, 9]
    sampling = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)

    async def sample(seed: int) -> object:
        return await engine.generate(prompt, sampling.model_copy(update={"seed": seed}))

    gens = [asyncio.run(sample(s)) for s in (1, 2)]
    engine.close()
    new = copy.deepcopy(old)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn_like(p))
    forests = []
    for i, g in enumerate(gens):
        assert g.policy_version == 0
        forest = forest_from_paths(
            [[(t, False) for t in prompt] + [(t, True) for t in g.token_ids]], rollout_id=f"r{i}"
        )
        lp = np.full(len(forest.tokens), np.nan, np.float32)
        lp[len(prompt) :] = g.logprobs
        forests.append(dataclasses.replace(forest, logprobs=lp))
    batch = RolloutBatch.from_forests(forests, [0.0, 1.0])
    _, m = apply_staleness(batch, version=1, max_staleness=1)
    assert m["staleness_max"] == 1

    rhos = []
    with torch.no_grad():
        for g in gens:
            ids = torch.tensor([prompt + list(g.token_ids)])
            logp = torch.log_softmax(new(ids).logits[0].float(), dim=-1)
            for j, token in enumerate(g.token_ids):
                rhos.append(math.exp(float(logp[len(prompt) + j - 1, token]) - g.logprobs[j]))
    trainer = Trainer(new, GRPO(GRPOConfig()), OptimConfig(lr=1e-9))
    metrics = trainer.update(batch)
    assert abs(np.mean(rhos) - 1) > 0.01, "the perturbation must make the policies differ"
    # float32 log-probs of a 2-layer model over 24 tokens: ~1e-6 relative per ratio
    assert metrics["is_ratio_mean"] == pytest.approx(np.mean(rhos), rel=1e-4)
    assert metrics["is_ratio_max"] == pytest.approx(max(rhos), rel=1e-4)
    assert metrics["is_clipped_frac"] == pytest.approx(np.mean([r > 2.0 for r in rhos]))


def _train(tmp_path: Path, extra: list[str]) -> dict:
    from trainers.loop import train
    from trainers.main import compose

    cfg = compose(
        [
            "env=clawgym_whitebox",
            "model=tiny-qwen3",
            "env.group_size=2",
            "env.tasks_per_step=1",
            "env.eval_tasks=1",
            "eval.repeats=1",
            "eval.every=0",
            "logging.progress=false",
            "logging.tensorboard=false",
            "checkpoint.every=1",
            f"run_dir={tmp_path / 'run'}",
            *extra,
        ]
    )
    return train(cfg)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_the_loop_runs_ahead_of_the_trainer_and_resumes(tmp_path: Path, algorithm: str) -> None:
    summary = _train(tmp_path, [f"algorithm={algorithm}", "steps=3", "trainer.max_staleness=1"])
    assert summary["steps"] == 3 and summary["max_staleness"] == 1
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r.get("kind") == "train"]
    assert [r["step"] for r in train_rows] == [1, 2, 3]
    for r in train_rows:
        assert 0 <= r["staleness_max"] <= 1 and r["rollouts_stale_dropped"] == 0
        assert r["wait_s"] >= 0 and r["rollout_s"] > 0 and r["step_s"] >= r["update_s"]
    assert train_rows[0]["staleness_max"] == 0  # the first batch is served by the untrained weights
    evidence = read_rows(tmp_path / "run" / "rollouts.jsonl")
    assert sorted({r.step for r in evidence}) == [1, 2, 3] and all(r.wall_s and r.wall_s > 0 for r in evidence)

    summary = _train(
        tmp_path, [f"algorithm={algorithm}", "steps=4", "trainer.max_staleness=1", "checkpoint.resume=auto"]
    )
    assert summary["steps"] == 4
    evidence = read_rows(tmp_path / "run" / "rollouts.jsonl")
    assert [r.step for r in evidence].count(4) == 2 and len(evidence) == 8  # step 4 ran once, nothing lost
