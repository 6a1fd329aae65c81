"""Reuse of evaluations that would measure the same thing twice: an untrained policy's start evaluation.

Every arm of an experiment (GRPO and PPO, each training harness, each mixed batch) starts from the same
policy; evaluating it again on the same held-out tasks, with the same seeds and through the same harness,
costs minutes and measures nothing new. An `EvalKey` names everything such a measurement depends on; an
`EvalCache` under the run root stores one JSON file per key and hands it back only when every field of
the stored key equals the asked-for one, so a change of model, task, seed, sampling or harness is a miss.

    cache = EvalCache(run_root / "eval-cache")
    key = EvalKey.for_envs("held_out_reward", policy={"model": "tiny-qwen3", "seed": 0}, envs=envs,
                           tasks=tasks, repeats=2, sampling_seed=0, temperature=1.0)
    metrics = cache.get(key)  # None on a miss
    if metrics is None:
        metrics = measure(); cache.put(key, metrics)
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from clawgym_env.specs import TaskSpec


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


REPO = Path(__file__).resolve().parents[1]


def portable(value: Any, root: Path = REPO) -> Any:
    """`value` with the checkout's own path written as "<repo>": a suite materialized under `<checkout>/.cache`
    names its files by absolute path, and the same tasks read from another checkout (a git worktree, a moved
    clone) are the same measurement."""
    # its cache folder may be a link to another checkout's (a worktree's .cache): resolved once, not per string
    prefixes = ((str((root / ".cache").resolve()), "<repo>/.cache"), (str(root), "<repo>"))

    def rewrite(v: Any) -> Any:
        if isinstance(v, str):
            for prefix, name in prefixes:
                v = v.replace(prefix, name)
            return v
        if isinstance(v, dict):
            return {k: rewrite(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [rewrite(x) for x in v]
        return v

    return rewrite(value)


def task_digest(tasks: Sequence[TaskSpec], root: Path = REPO) -> str:
    """What the policy is asked and what it is judged on: ids, instructions, workspaces, limits, metadata
    (paths inside the checkout relative to it, `portable`)."""
    return _digest(
        portable(
            [
                {
                    "id": t.id,
                    "instruction": t.instruction,
                    "workspace": t.workspace.model_dump(mode="json"),
                    "mount": t.mount_path,
                    "timeout_s": t.timeout_s,
                    "metadata": t.metadata,
                    "verifier": repr(t.verifier),
                }
                for t in tasks
            ],
            root,
        )
    )


def harness_identity(harness: Any) -> dict[str, Any]:
    """The harness as the policy meets it: its name, the pinned CLI version, and its adapter's code
    (a fixed adapter is a different harness for the policy, so it must not reuse older numbers)."""
    cls = type(harness)
    try:
        source = Path(inspect.getsourcefile(cls) or "").read_bytes()
    except (OSError, TypeError):
        source = cls.__qualname__.encode()
    return {
        "name": getattr(harness, "name", cls.__name__),
        "version": getattr(harness, "pinned_version", None),
        "adapter": hashlib.sha256(source).hexdigest()[:16],
    }


class EnvKey(BaseModel):
    """One environment of an evaluation: which harness, which tasks, with which options."""

    env_id: str
    harness: dict[str, Any]
    split: str
    tasks: str  # task_digest of the selected tasks
    num_tasks: int
    options: dict[str, Any] = Field(default_factory=dict)  # max_calls, max_new_tokens, temperature, backend, ...


class EvalKey(BaseModel):
    """Everything an evaluation's outcome depends on. Two evaluations with equal keys are the same measurement."""

    kind: str  # what produced the value ("held_out_reward", "evaluate"): values of different kinds differ in shape
    policy: dict[str, Any]  # model name, weights seed, dtype, checkpoint (None = untrained), engine options
    envs: list[EnvKey]
    repeats: int
    sampling_seed: int
    temperature: float | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def for_envs(
        cls,
        kind: str,
        *,
        policy: dict[str, Any],
        envs: Sequence[Any],
        tasks: Sequence[Sequence[TaskSpec]],
        repeats: int,
        sampling_seed: int,
        temperature: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> EvalKey:
        """The key of evaluating `policy` on ClawGymEnv objects `envs`, env i running `tasks[i]`."""
        keys = []
        for env, env_tasks in zip(envs, tasks, strict=True):
            options = env.options.model_dump(mode="json", exclude={"split"})
            keys.append(
                EnvKey(
                    env_id=env.env_spec.id,
                    harness=harness_identity(env.harness),
                    split=env.options.split,
                    tasks=task_digest(env_tasks),
                    num_tasks=len(env_tasks),
                    options=options,
                )
            )
        return cls(
            kind=kind,
            policy=policy,
            envs=keys,
            repeats=repeats,
            sampling_seed=sampling_seed,
            temperature=temperature,
            extra=extra or {},
        )

    def digest(self) -> str:
        return _digest(self.model_dump(mode="json"))[:24]


class EvalCache:
    """One JSON file per key under `root`; `hits` and `misses` count what `get` found."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.hits = 0
        self.misses = 0

    def path(self, key: EvalKey) -> Path:
        return self.root / f"{key.kind}-{key.digest()}.json"

    def get(self, key: EvalKey) -> dict[str, Any] | None:
        """The stored value of `key`, or None. The whole stored key must match (not only its digest)."""
        try:
            stored = json.loads(self.path(key).read_text())
        except (OSError, ValueError):
            self.misses += 1
            return None
        if stored.get("key") != key.model_dump(mode="json"):
            self.misses += 1
            return None
        self.hits += 1
        return stored["value"]

    def put(self, key: EvalKey, value: dict[str, Any], **about: Any) -> Path:
        """Store `value` atomically (a killed run leaves no half-written entry); `about` is kept for readers."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        record = {"key": key.model_dump(mode="json"), "value": value, "created": time.time(), **about}
        tmp.write_text(json.dumps(record, indent=2, default=str))
        tmp.replace(path)
        return path


def default_concurrency() -> int:
    """Evaluation rollouts at once when nobody says: what the machine holds.

    The engine batches concurrent generations (one decode step serves every running rollout), so the
    limit is not the model but the harness processes next to it: each rollout is a sandbox with a CLI
    (Node for the black-box harnesses, ~0.3-0.5 GiB resident). Two per core keeps the cores busy while
    others wait on the model; one per free GiB of memory keeps the machine out of swap; 8 at most,
    past which one batched decode step gets slower than the harness overhead it hides.
    `CLAWGYM_EVAL_CONCURRENCY` overrides it.
    """
    forced = os.environ.get("CLAWGYM_EVAL_CONCURRENCY")
    if forced:
        value = int(forced)
        if value < 1:
            raise ValueError(f"CLAWGYM_EVAL_CONCURRENCY must be >= 1 (got {forced!r})")
        return value
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    free_gib = _available_memory_gib()
    by_memory = int(free_gib) if free_gib is not None else 8
    return max(1, min(8, 2 * cores, by_memory))


def _available_memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None
