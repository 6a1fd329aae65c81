"""GRPO and PPO over trajectory forests (packed trees), rollout correction, mixed harnesses, Hydra configs.

Entry points: `python -m trainers.main` / `clawgym train` (the bundled loop), `trainers.grpo.grpo_loss`
(one call for a custom loop), `trainers.core.Trainer` (the update machinery). See docs/trainers.md.
"""
