"""The packages of this repository as a stack, bottom to top: each may import only the ones below it.

This tuple is the one list of them: `tests/test_layers.py` checks every import against it, and that the
README's architecture section, `docs/README.md`, `pyproject.toml` and the import guard show the same stack.
The ground (`clawgym_env`) names the bundled suites and harnesses only by import string, resolved when an
environment is made (`clawgym_env.builtin`), never by an import.
"""

LAYERS: tuple[str, ...] = (
    "clawgym_env",  # the ground: specs and contracts, registry, env API, sandbox, proxy, engines, trajectory trees
    "verifiers",  # rewards from a final workspace
    "harness_adapters",  # one module per harness CLI, the white-box loop, the health check
    "task_suites",  # task data: bundled suites and importers of other formats
    "evaluation",  # run a policy on environments and report rewards with confidence intervals
    "trainers",  # GRPO and PPO over trajectory trees, the training loop, the main job
    "clawgym_cli",  # the composition root: the `clawgym` command (nothing imports it)
    "benchmarks",  # performance scripts, on top of everything
)
