"""Synthetic forests and step batches, shaped like real rollouts, for tests and benchmarks.

`forest_from_paths` builds a small tree by hand (exact control for unit tests); `SyntheticRollouts`
produces whole step batches from the trajectory package's synthetic ModelCall generator (system
prompt, tool results, generations, kept retries), rebuilt by the real reconstruction, with a
reward that depends on the tokens generated so a policy can learn it. Its RNG state is part of a
checkpoint's data position.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clawgym_env.specs import ForestOptions
from clawgym_env.trajectory import TrajectoryForest
from clawgym_env.trajectory.reconstruct import build_forest
from clawgym_env.trajectory.synthetic_recordings import synthetic_rollout
from trainers.rollout_batch import RolloutBatch


def forest_from_paths(
    paths: Sequence[Sequence[tuple[int, bool]]],
    *,
    rollout_id: str = "r0",
    reward: float | None = 1.0,
    task_id: str = "t0",
    harness: str = "H",
    logprob: float = -1.0,
) -> TrajectoryForest:
    """A forest whose root-to-leaf paths are `paths` (lists of (token, generated)); shared prefixes merge."""
    tokens: list[int] = []
    parents: list[int] = []
    generated: list[bool] = []
    children: dict[tuple[int, int, bool], int] = {}
    leaves: list[int] = []
    for path in paths:
        node = -1
        for token, gen in path:
            key = (node, int(token), bool(gen))
            if key not in children:
                children[key] = len(tokens)
                tokens.append(int(token))
                parents.append(node)
                generated.append(bool(gen))
            node = children[key]
        leaves.append(node)
    gen_arr = np.asarray(generated, bool)
    return TrajectoryForest(
        rollout_id=rollout_id,
        task_id=task_id,
        harness=harness,
        reward=reward,
        tokens=np.asarray(tokens, np.int64),
        parents=np.asarray(parents, np.int64),
        generated=gen_arr,
        logprobs=np.where(gen_arr, np.float32(logprob), np.float32(np.nan)).astype(np.float32),
        policy_versions=np.where(gen_arr, 0, -1).astype(np.int32),
        call_index=np.zeros(len(tokens), np.int32),
        source=np.zeros(len(tokens), np.int8),
        leaves=np.asarray(sorted(set(leaves), key=leaves.index), np.int64),
    )


def synthetic_forest(
    seed: int,
    *,
    vocab: int,
    rollout_id: str,
    task_id: str = "t0",
    harness: str = "H",
    reward: float | None = None,
    turns: int = 3,
    retry_prob: float = 0.5,
    gen_tokens: tuple[int, int] = (8, 20),
    tool_tokens: tuple[int, int] = (5, 15),
    system_tokens: int = 20,
    mode: str = "openclaw_chat",
) -> TrajectoryForest:
    """A branching forest rebuilt from synthetic model calls (kept retries give sibling branches)."""
    r = synthetic_rollout(
        seed,
        rollout_id=rollout_id,
        mode=mode,  # type: ignore[arg-type]
        turns=turns,
        retry_prob=retry_prob,
        vocab=vocab,
        system_tokens=system_tokens,
        tools_tokens=10,
        gen_tokens=gen_tokens,
        tool_tokens=tool_tokens,
    )
    return build_forest(
        r.calls,
        rollout_id=rollout_id,
        task_id=task_id,
        harness=harness,
        reward=reward,
        options=ForestOptions(drop_dead_leaves=False),
    )


class SyntheticRollouts:
    """Step batches of synthetic rollouts: `tasks_per_step` tasks x `group_size` rollouts x harnesses.

    The reward of a rollout is the fraction of its generated tokens below vocab/2 plus noise, so groups
    are rarely degenerate. `state()`/`set_state()` carry the data position for checkpoints.
    """

    def __init__(
        self,
        *,
        vocab: int,
        group_size: int = 4,
        tasks_per_step: int = 2,
        harnesses: Sequence[str] = ("H",),
        seed: int = 0,
        **forest_kwargs: object,
    ) -> None:
        self.vocab = vocab
        self.group_size = group_size
        self.tasks_per_step = tasks_per_step
        self.harnesses = list(harnesses)
        self.forest_kwargs = forest_kwargs
        self.rng = np.random.default_rng(seed)
        self.drawn = 0

    def next_batch(self) -> RolloutBatch:
        forests, rewards = [], []
        for _ in range(self.tasks_per_step):
            task = f"task{int(self.rng.integers(1_000_000))}"
            for harness in self.harnesses:
                for _ in range(self.group_size):
                    seed = int(self.rng.integers(2**31))
                    rid = f"r{self.drawn}"
                    self.drawn += 1
                    f = synthetic_forest(
                        seed, vocab=self.vocab, rollout_id=rid, task_id=task, harness=harness, **self.forest_kwargs
                    )  # type: ignore[arg-type]
                    gen = f.tokens[f.generated]
                    reward = (
                        float(np.clip((gen < self.vocab // 2).mean() + self.rng.normal(0, 0.1), 0, 1))
                        if gen.size
                        else 0.0
                    )
                    f.reward = reward
                    forests.append(f)
                    rewards.append(reward)
        return RolloutBatch.from_forests(forests, rewards)

    def state(self) -> dict[str, object]:
        return {"rng": self.rng.bit_generator.state, "drawn": self.drawn}

    def set_state(self, state: dict[str, object]) -> None:
        self.rng.bit_generator.state = state["rng"]  # type: ignore[assignment]
        self.drawn = int(state["drawn"])  # type: ignore[arg-type]
