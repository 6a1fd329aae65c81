"""`check_env`: gymnasium's environment checks that apply to a text environment, plus one real step.

Gymnasium's own `check_env` samples an action from the action space; a policy cannot be sampled, so
the step check here runs with a policy you pass (a real engine or a named test double).
"""

from __future__ import annotations

from typing import Any

import gymnasium.utils.env_checker as gym_checker
from gymnasium.utils.passive_env_checker import env_reset_passive_checker, env_step_passive_checker

from clawgym_env.env import ClawGymEnv
from clawgym_env.interfaces import Policy
from clawgym_env.trajectory import TrajectoryForest


def check_env(env: ClawGymEnv, policy: Policy | None = None) -> dict[str, Any]:
    """Raise AssertionError on a contract violation; return the step's info when a policy was given."""
    gym_checker.check_action_space(env.action_space)
    gym_checker.check_observation_space(env.observation_space)
    gym_checker.check_seed_deprecation(env)
    gym_checker.check_reset_return_info_deprecation(env)
    gym_checker.check_reset_return_type(env)
    gym_checker.check_reset_seed_determinism(env)
    gym_checker.check_reset_options(env)
    env_reset_passive_checker(env)

    first, _ = env.reset(seed=7)
    again, _ = env.reset(seed=7)
    assert first == again, "reset(seed=s) must pick the same task instance every time"
    if policy is None:
        return {}
    env.reset(seed=0)
    forest, reward, terminated, truncated, info = env_step_passive_checker(env, policy)
    assert isinstance(forest, TrajectoryForest), f"step must return a TrajectoryForest, got {type(forest).__name__}"
    assert terminated is True, "one step is one whole rollout: terminated must be True"
    assert 0.0 <= reward <= 1.0, f"reward {reward} outside [0, 1]"
    assert info["status"] in ("ok", "failed", "empty"), info["status"]
    # truncated: the rollout failed, or (score_capped) the proxy cut it off at a cap and it was still scored
    capped = info["status"] == "ok" and info.get("truncated_by") is not None
    assert truncated == (info["status"] != "ok" or capped), (
        "a failed or capped rollout must be truncated, a complete one not "
        f"(status {info['status']!r}, truncated_by {info.get('truncated_by')!r}, truncated {truncated})"
    )
    try:
        env.step(policy)
    except RuntimeError:
        pass
    else:
        raise AssertionError("step after the episode ended must ask for reset()")
    return info
