"""Trajectory reconstruction: recorded ModelCalls -> TrajectoryForest, filters, packing, inspection."""

from clawgym_env.trajectory.forest import SOURCE_CODE, SOURCE_KINDS, ForestStats, TrajectoryForest

__all__ = ["SOURCE_CODE", "SOURCE_KINDS", "ForestStats", "TrajectoryForest"]
