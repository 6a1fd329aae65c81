"""The serving proxy: every harness's model endpoint, token-in, token-out (see docs/proxy.md)."""

from clawgym_env.proxy.guards import GuardStats, ProxyGuards
from clawgym_env.proxy.rollout_state import RolloutStats
from clawgym_env.proxy.server import ServingProxy
from clawgym_env.proxy.shards import ShardedProxy

__all__ = ["GuardStats", "ProxyGuards", "RolloutStats", "ServingProxy", "ShardedProxy"]
