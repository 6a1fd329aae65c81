"""The serving proxy: every harness's model endpoint, token-in, token-out (see docs/proxy.md)."""

from clawgym_env.proxy.guards import GuardStats, ProxyGuards
from clawgym_env.proxy.renderers import ChatMLRenderer, Renderer, TemplateMismatch
from clawgym_env.proxy.rollout_state import RolloutStats
from clawgym_env.proxy.server import ServingProxy
from clawgym_env.proxy.shards import ShardedProxy

__all__ = [
    "ChatMLRenderer",
    "GuardStats",
    "ProxyGuards",
    "Renderer",
    "RolloutStats",
    "ServingProxy",
    "ShardedProxy",
    "TemplateMismatch",
]
