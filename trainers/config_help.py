"""What `clawgym train --help` prints: the config groups with their choices, and every option with its comment.

Read from the YAML files in trainers/conf/ themselves (each key there carries its comment), so the help
cannot drift from the configs it describes; nothing heavier than the YAML is loaded.
"""

from __future__ import annotations

import re
from pathlib import Path

CONF = Path(__file__).resolve().with_name("conf")
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):\s*(?P<value>[^#]*?)\s*(?:#\s*(?P<comment>.*))?$")
DEFAULT_LINE = re.compile(r"^\s*-\s*(?P<group>\w+):\s*(?P<choice>[\w.-]+)")


def config_groups() -> dict[str, tuple[list[str], str | None]]:
    """group -> (its choices, the default choice), from the folders of trainers/conf and its defaults list."""
    defaults = {}
    for line in (CONF / "config.yaml").read_text().splitlines():
        match = DEFAULT_LINE.match(line)
        if match:
            defaults[match["group"]] = match["choice"]
    return {
        folder.name: (sorted(p.stem for p in folder.glob("*.yaml")), defaults.get(folder.name))
        for folder in sorted(CONF.iterdir())
        if folder.is_dir() and any(folder.glob("*.yaml"))
    }


def options(
    path: Path = CONF / "config.yaml", skip: tuple[str, ...] = ("defaults", "hydra")
) -> list[tuple[str, str, str]]:
    """(dotted key, default value, comment) of every commented key of a config file."""
    found: list[tuple[str, str, str]] = []
    parents: list[tuple[int, str]] = []
    for line in path.read_text().splitlines():
        match = KEY_LINE.match(line)
        if match is None:
            continue
        indent = len(match["indent"])
        parents = [(i, k) for i, k in parents if i < indent]
        dotted = ".".join([k for _, k in parents] + [match["key"]])
        parents.append((indent, match["key"]))
        if dotted.split(".")[0] in skip or not match["comment"]:
            continue
        found.append((dotted, match["value"], match["comment"]))
    return found


def help_text() -> str:
    lines = [
        "Usage: clawgym train [GROUP=CHOICE ...] [KEY=VALUE ...]",
        "",
        "Train with the bundled GRPO/PPO loop (trainers/conf/, composed by Hydra). Examples:",
        "  clawgym train algorithm=ppo env=clawgym_pi model=smollm2-135m steps=50",
        "  clawgym train env.group_size=8 optim.lr=1e-5 trainer.max_staleness=1",
        "  clawgym train --cfg job        # print the composed config, do not train",
        "",
        "Config groups (GROUP=CHOICE; * = default):",
    ]
    for group, (choices, default) in config_groups().items():
        shown = ", ".join(f"{c}*" if c == default else c for c in choices)
        lines.append(f"  {group:<10} {shown}")
    lines += ["", "Options (KEY=VALUE; the default, then what it does):"]
    entries = options()
    width = max(len(key) for key, _, _ in entries)
    lines += [f"  {key:<{width}}  {value or '-':<12}  {comment}" for key, value, comment in entries]
    lines += ["", "Each group's keys (GROUP.KEY=VALUE), commented in trainers/conf/GROUP/CHOICE.yaml:"]
    for group, (choices, default) in config_groups().items():
        keys = [key for key, _, _ in options(CONF / group / f"{default or choices[0]}.yaml", skip=())]
        top = list(dict.fromkeys(key.split(".")[0] for key in keys))
        lines.append(f"  {group}: {', '.join(top)}")
    return "\n".join(lines)
