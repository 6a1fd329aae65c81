"""The start evaluation of an untrained policy is measured once and reused: hit on an equal key (real tiny
model through the white-box loop, and through the trainer's start evaluation), miss when any part of the
key changes (model, tasks, seeds, sampling, harness options, harness adapter code)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import clawgym_env
from evaluation import EvalCache, EvalKey, default_concurrency, evaluate, select_tasks

TINY_OPTIONS = {"max_new_tokens": 8, "max_calls": 2}
POLICY = {"model": "tiny-qwen3", "weights_seed": 0, "checkpoint": None}


def key_for(
    env_id: str = "ClawGymBench-WhiteBox",
    *,
    policy: dict | None = None,
    count: int = 2,
    seed: int = 0,
    repeats: int = 1,
    temperature: float | None = 1.0,
    **options: object,
) -> EvalKey:
    env = clawgym_env.make(env_id, split="test", **{**TINY_OPTIONS, **options})
    tasks = select_tasks(env, level=0, count=count, seed=seed)
    return EvalKey.for_envs(
        "evaluate",
        policy=policy or POLICY,
        envs=[env],
        tasks=[tasks],
        repeats=repeats,
        sampling_seed=seed,
        temperature=temperature,
    )


def test_a_stored_key_is_hit_and_every_changed_part_misses(tmp_path: Path) -> None:
    cache = EvalCache(tmp_path)
    base = key_for()
    cache.put(base, {"eval_reward_mean": 0.25})
    assert cache.get(key_for()) == {"eval_reward_mean": 0.25} and cache.hits == 1
    changed = {
        "model": key_for(policy={**POLICY, "model": "smollm2-135m"}),
        "weights seed": key_for(policy={**POLICY, "weights_seed": 1}),
        "checkpoint": key_for(policy={**POLICY, "checkpoint": "step_000001.pt"}),
        "task count": key_for(count=3),
        "seed (suite and sampling)": key_for(seed=1),
        "repeats": key_for(repeats=2),
        "temperature": key_for(temperature=0.0),
        "harness": key_for("ClawGymBench-Pi"),
        "harness options": key_for(max_calls=3),
    }
    for what, key in changed.items():
        assert key.digest() != base.digest(), what
        assert cache.get(key) is None, what
    assert cache.misses == len(changed)


def test_changed_tasks_or_adapter_code_miss_even_under_the_same_digest(tmp_path: Path) -> None:
    """The whole stored key is compared, not only the file name: an entry whose task list or harness adapter
    differs (a suite or adapter fixed since) is a miss."""
    cache = EvalCache(tmp_path)
    key = key_for()
    path = cache.put(key, {"eval_reward_mean": 0.5})
    for mutate in (
        lambda k: k["envs"][0].update(tasks="0" * 64),
        lambda k: k["envs"][0]["harness"].update(adapter="x"),
    ):
        record = json.loads(path.read_text())
        mutate(record["key"])
        path.write_text(json.dumps(record))
        assert cache.get(key) is None
    path.write_text("{half a file")
    assert cache.get(key) is None


def test_the_task_digest_follows_the_instruction(tmp_path: Path) -> None:
    env = clawgym_env.make("ClawGymBench-WhiteBox", split="test")
    tasks = select_tasks(env, level=0, count=1)
    edited = [tasks[0].model_copy(update={"instruction": tasks[0].instruction + " Be brief."})]
    a = EvalKey.for_envs("evaluate", policy=POLICY, envs=[env], tasks=[tasks], repeats=1, sampling_seed=0)
    b = EvalKey.for_envs("evaluate", policy=POLICY, envs=[env], tasks=[edited], repeats=1, sampling_seed=0)
    assert a.envs[0].tasks != b.envs[0].tasks


def test_the_same_tasks_read_from_another_checkout_have_the_same_digest(tmp_path: Path) -> None:
    """A suite materialized under a checkout's .cache names its files by absolute path; a git worktree or a
    moved clone reads the same tasks under another path, and must hit the same cache entries."""
    from evaluation.cache import REPO, task_digest

    env = clawgym_env.make("ClawGymBench-WhiteBox", split="test")

    def under(root: Path) -> list:  # the same two tasks, materialized under `root`'s .cache
        suite = root / ".cache" / "suites" / "clawgymbench-test-0123"
        return [
            t.model_copy(
                update={
                    "metadata": {**t.metadata, "source": str(suite / t.id)},
                    "workspace": t.workspace.model_copy(update={"directory": suite / t.id / "workspace"}),
                }
            )
            for t in select_tasks(env, level=0, count=2)
        ]

    elsewhere = tmp_path / "worktree"
    assert task_digest(under(elsewhere), root=elsewhere) == task_digest(under(REPO))
    assert task_digest(under(elsewhere)) != task_digest(under(REPO))  # outside the checkout a path is the task's


def test_real_tiny_evaluation_is_measured_once_then_read_back(tmp_path: Path) -> None:
    from clawgym_env.policies import make_policy

    policy = make_policy("tiny-qwen3", name="tiny-qwen3")
    cache = EvalCache(tmp_path / "eval-cache")
    kwargs = dict(level=0, count=1, progress=False, env_overrides=TINY_OPTIONS, cache=cache, policy_key=POLICY)
    first = evaluate(policy, ["ClawGymBench-WhiteBox"], run_dir=tmp_path / "a", **kwargs)
    assert first.cached_from is None and first.rows[0].num_calls >= 1
    start = time.perf_counter()
    second = evaluate(policy, ["ClawGymBench-WhiteBox"], run_dir=tmp_path / "b", **kwargs)
    assert second.cached_from == str(cache.path(cache_key_of(first, cache)))
    assert first.evaluation == second.evaluation == cache_key_of(first, cache).digest()  # the rows' identity
    assert time.perf_counter() - start < first.wall_s  # no rollout ran
    assert second.rows == first.rows and second.by_harness == first.by_harness
    assert not (tmp_path / "b" / "calls.jsonl").exists()
    # another seed is another measurement
    third = evaluate(policy, ["ClawGymBench-WhiteBox"], run_dir=tmp_path / "c", seed=1, **kwargs)
    assert third.cached_from is None and cache.misses == 2 and cache.hits == 1
    assert third.evaluation not in (None, first.evaluation)


def cache_key_of(report, cache: EvalCache) -> EvalKey:  # type: ignore[no-untyped-def]
    (entry,) = cache.root.glob("evaluate-*.json")
    return EvalKey.model_validate(json.loads(entry.read_text())["key"])


def test_the_trainers_start_evaluation_is_reused_across_runs(tmp_path: Path) -> None:
    """Two runs of one untrained policy (e.g. the GRPO and PPO arms of a seed) share the start evaluation."""
    from trainers.loop import train
    from trainers.main import compose

    def run(name: str, *extra: str) -> dict:
        cfg = compose(
            [
                "model=tiny-qwen3",
                "env=clawgym_whitebox",
                f"run_dir={tmp_path / name}",
                "steps=0",
                "optim.total_steps=1",
                "env.eval_tasks=1",
                "eval.repeats=1",
                "env.options.max_new_tokens=8",
                "env.options.max_calls=2",
                "logging.progress=false",
                "logging.tensorboard=false",
                f"eval.cache_dir={tmp_path / 'eval-cache'}",
                *extra,
            ]
        )
        return train(cfg)

    first = run("grpo")
    assert "eval_cached" not in first["eval_start"] and first["eval_start"]["eval_rollouts"] == 1.0
    second = run("ppo", "algorithm=ppo")
    assert second["eval_start"]["eval_cached"] == 1.0
    assert {k: v for k, v in second["eval_start"].items() if k != "eval_cached"} == first["eval_start"]
    assert not (tmp_path / "ppo" / "rollouts" / "calls.jsonl").exists()  # no rollout ran for it
    # the held-out rollouts are evidence rows in both runs, the reused ones included
    from evaluation.evidence import read_rows

    stored = {name: read_rows(tmp_path / name / "eval_rollouts.jsonl") for name in ("grpo", "ppo")}
    assert [(r.arm, r.phase) for r in stored["grpo"]] == [("untrained", "before")]  # steps=0: the start is the end
    before = [r.model_dump(exclude={"experiment"}) for rows in stored.values() for r in rows if r.phase == "before"]
    assert before[0] == before[1] and before[0]["reward"] == first["eval_start"]["eval_reward_mean"]
    third = run("seed1", "seed=1")  # another sampling seed: measured again
    assert "eval_cached" not in third["eval_start"]
    assert len(list((tmp_path / "eval-cache").glob("held_out_reward-*.json"))) == 2


def test_default_concurrency_fits_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLAWGYM_EVAL_CONCURRENCY", raising=False)
    assert 1 <= default_concurrency() <= 8
    monkeypatch.setenv("CLAWGYM_EVAL_CONCURRENCY", "3")
    assert default_concurrency() == 3
    monkeypatch.setenv("CLAWGYM_EVAL_CONCURRENCY", "0")
    with pytest.raises(ValueError, match="CLAWGYM_EVAL_CONCURRENCY"):
        default_concurrency()
