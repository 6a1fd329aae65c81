"""Make a name clash visible: `verifiers`, `trainers` and `evaluation` are also names of other PyPI projects.

`verifiers` in particular is a popular RL-environment library. If another distribution's package is
what `import verifiers` finds, ClawGym would silently run someone else's code; we fail loudly instead.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from clawgym_env.layers import LAYERS

OUR_ROOT = Path(__file__).resolve().parent.parent
OUR_TOP_LEVEL = LAYERS[1:]  # every package of the repository above clawgym_env itself


class ShadowedPackageError(ImportError):
    pass


def check_top_level_packages(names: tuple[str, ...] = OUR_TOP_LEVEL) -> None:
    """Raise ShadowedPackageError if `import <name>` would not load ClawGym's own package."""
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None:
            raise ShadowedPackageError(
                f"ClawGym's package {name!r} is missing next to clawgym_env ({OUR_ROOT}); reinstall with "
                "`pip install -e .` from the repository"
            )
        origin = Path(spec.origin or next(iter(spec.submodule_search_locations or []), "")).resolve()
        if OUR_ROOT not in origin.parents:
            owners = importlib.metadata.packages_distributions().get(name, ["an unknown distribution"])
            raise ShadowedPackageError(
                f"`import {name}` loads {origin} from {', '.join(owners)}, not ClawGym's own {name}/ in "
                f"{OUR_ROOT}. Another package with the same top-level name shadows ours: uninstall it "
                f"(`pip uninstall {owners[0]}`) or use a separate virtual environment."
            )
