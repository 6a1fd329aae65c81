"""ClawGym: black-box RL of LLM agents through real, unmodified agent harnesses.

import clawgym_env
env = clawgym_env.make("OfficeQA-ClaudeCode")
obs, info = env.reset(seed=0)
forest, reward, terminated, truncated, info = env.step(policy)
"""

from clawgym_env._import_guard import check_top_level_packages
from clawgym_env.builtin import register_builtins
from clawgym_env.env import ClawGymEnv
from clawgym_env.interfaces import (
    FunctionVerifier,
    HarnessResult,
    Policy,
    SamplingParams,
    VerifierResult,
    VerifyContext,
)
from clawgym_env.records import ModelCall
from clawgym_env.registry import UnknownEnvironmentError, make, register, registry
from clawgym_env.rollout import RolloutResult
from clawgym_env.specs import ApiStyle, EnvOptions, EnvSpec, HarnessSpec, TaskSpec, TaskSuite, WorkspaceSpec
from clawgym_env.trajectory import TrajectoryForest
from clawgym_env.vector_env import ClawGymVectorEnv, make_vec

check_top_level_packages()
register_builtins(registry)

__all__ = [
    "ApiStyle",
    "ClawGymEnv",
    "ClawGymVectorEnv",
    "EnvOptions",
    "EnvSpec",
    "FunctionVerifier",
    "HarnessResult",
    "HarnessSpec",
    "ModelCall",
    "Policy",
    "RolloutResult",
    "SamplingParams",
    "TaskSpec",
    "TaskSuite",
    "TrajectoryForest",
    "UnknownEnvironmentError",
    "VerifierResult",
    "VerifyContext",
    "WorkspaceSpec",
    "make",
    "make_vec",
    "register",
    "registry",
]
__version__ = "0.1.0"
