"""No private name crosses a module of the project: a `_name` is its module's own business.

Checked in every package module (tests and benchmarks may reach inside): `from clawgym_env.x import _name`,
and `Name._attr` where `Name` was imported from another project module (a module, a class or a function).
What this cannot see: a private attribute of an instance handed over from another module (`obj._attr`).
"""

from __future__ import annotations

import ast
from pathlib import Path

from clawgym_env.layers import LAYERS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [name for name in LAYERS if name != "benchmarks"]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(source: str, first_party: set[str]) -> list[str]:
    """What a module's source uses of other project modules' private names."""
    tree = ast.parse(source)
    imported: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in first_party:
                continue
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in first_party:
                    imported.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_the_check_finds_both_kinds_of_private_use():
    source = "from clawgym_env.x import _hidden, shown\nimport clawgym_env.y as y\nshown._state\ny._z\nself._ok\n"
    assert private_uses(source, {"clawgym_env"}) == [
        "line 1: from clawgym_env.x import _hidden",
        "line 3: shown._state",
        "line 4: y._z",
    ]
    assert private_uses("from os import _exit\nimport sys\nsys._getframe\n", {"clawgym_env"}) == []


def test_no_private_name_crosses_a_module():
    first_party = set(PACKAGES) | {"benchmarks"}
    problems = [
        f"{path.relative_to(ROOT)} {use}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for use in private_uses(path.read_text(), first_party)
    ]
    assert problems == [], "private names used across modules (make them public, or move the code):\n" + "\n".join(
        problems
    )
