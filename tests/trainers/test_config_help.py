"""`clawgym train --help` lists the config groups with their choices and every option, read from trainers/conf."""

from __future__ import annotations

import subprocess
import sys

from trainers.config_help import config_groups, options
from trainers.main import compose


def test_train_help_lists_groups_choices_and_options():
    out = subprocess.run(
        [sys.executable, "-m", "clawgym_cli", "train", "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    for group, (choices, default) in config_groups().items():
        assert f"{group} " in out and all(choice in out for choice in choices)
        assert f"{default}*" in out
    assert {"algorithm", "env", "model", "engine", "sandbox"} <= set(config_groups())
    for key in ("steps", "optim.lr", "trainer.max_staleness", "eval.cache_dir", "checkpoint.resume"):
        assert f"\n  {key} " in out, key
    assert "Traceback" not in out and "Error" not in out


def test_every_listed_option_is_a_key_of_the_composed_config():
    """The help cannot name an option that does not exist: each dotted key resolves in the TrainConfig."""
    config = compose([]).model_dump()
    listed = options()
    assert len(listed) > 30
    for key, _, comment in listed:
        node = config
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"{key} is listed but not a config key"
            node = node[part]
        assert comment
