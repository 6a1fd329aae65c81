"""The import graph is a strict stack (clawgym_env.layers.LAYERS), and the docs show that same stack.

Imports are read from the source with `ast` (every `import` and `from ... import`, at module level or
deferred inside a function alike), so the check needs no package to import and sees lazy imports too.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

from clawgym_env._import_guard import OUR_TOP_LEVEL
from clawgym_env.layers import LAYERS

ROOT = Path(__file__).resolve().parents[1]
RANK = {name: i for i, name in enumerate(LAYERS)}
STACK_MARKER = "<!-- layers: checked by tests/test_layers.py -->"


def modules(package: str) -> list[tuple[str, Path]]:
    """(dotted module name, file) for every module of a top-level package."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


def imported_names(module: str, path: Path, *, runtime_only: bool = False) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of everything `path` imports; relative imports resolved. `runtime_only`
    leaves out the imports under `if TYPE_CHECKING:`, which never run."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                typing_only |= {id(n) for child in node.body for n in ast.walk(child)}
    names = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names += [(node.lineno, base)] + [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return names


def our_imports(*, runtime_only: bool = False) -> list[tuple[str, Path, int, str]]:
    """(importing module, its file, line, imported name) for every import of one of our packages."""
    edges = []
    for package in LAYERS:
        for module, path in modules(package):
            for line, name in imported_names(module, path, runtime_only=runtime_only):
                if name.split(".")[0] in RANK:
                    edges.append((module, path, line, name))
    return edges


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The cycles of a directed graph: its strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_every_top_level_package_has_a_layer():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"}
    assert packages == set(LAYERS), f"place new packages in clawgym_env/layers.py: {packages ^ set(LAYERS)}"


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{path.relative_to(ROOT)}:{line} ({module.split('.')[0]}, layer {RANK[module.split('.')[0]]}) imports "
        f"{name} (layer {RANK[name.split('.')[0]]})"
        for module, path, line, name in our_imports()
        if RANK[name.split(".")[0]] > RANK[module.split(".")[0]]
    ]
    assert not upward, "imports up the stack (move the code down, or the import up):\n" + "\n".join(upward)


def test_no_import_cycles_between_packages():
    """Between the layers, and between the sibling subpackages of any package (e.g. clawgym_env.proxy and
    clawgym_env.engines): a cycle there means two folders that cannot be read or changed one at a time."""
    layers: dict[str, set[str]] = defaultdict(set)
    siblings: dict[str, set[str]] = defaultdict(set)
    subpackages = {m for p in LAYERS for m, path in modules(p) if path.name == "__init__.py"}

    def subpackage_of(name: str) -> str | None:
        parts = name.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 and ".".join(parts[:2]) in subpackages else None

    for module, _, _, name in our_imports():
        if module.split(".")[0] != name.split(".")[0]:
            layers[module.split(".")[0]].add(name.split(".")[0])
        source, target = subpackage_of(module), subpackage_of(name)
        if source and target and source != target and source.split(".")[0] == target.split(".")[0]:
            siblings[source].add(target)
    assert strongly_connected(layers) == []
    assert strongly_connected(siblings) == []


def module_graph(edges: list[tuple[str, Path, int, str]]) -> dict[str, set[str]]:
    """Module -> the modules it imports (`from pkg import name` counts as importing `pkg.name` when that is a
    module, else `pkg`). A module's import of its own parent package is left out: Python runs the parent's
    `__init__` before any of its modules anyway, so that edge says nothing about the order of the two."""
    known = {module for package in LAYERS for module, _ in modules(package)}
    graph: dict[str, set[str]] = defaultdict(set)
    for module, _, _, name in edges:
        target = name if name in known else name.rpartition(".")[0]
        if target not in known or target == module or (name == target and module.startswith(target + ".")):
            continue
        graph[module].add(target)
    return graph


def test_no_import_cycles_between_modules():
    """Inside a package too, imports deferred into functions included: two modules that import each other
    cannot be read, tested or changed one at a time, and a deferred import only hides the loop. (Imports under
    `if TYPE_CHECKING:` never run and are left out.)"""
    cycles = strongly_connected(module_graph(our_imports(runtime_only=True)))
    assert not cycles, "modules that import each other (move what both need into a third):\n" + "\n".join(
        " <-> ".join(sorted(cycle)) for cycle in cycles
    )


def test_module_cycles_are_seen_inside_functions_and_not_under_type_checking(tmp_path, monkeypatch):
    """The check above can fail on a deferred import, and is not fooled by a typing-only one."""
    package = tmp_path / "clawgym_env"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from clawgym_env.b import f\n")
    (package / "b.py").write_text("def f():\n    from clawgym_env import a\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from clawgym_env.a import x\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "LAYERS", ("clawgym_env",))
    graph = module_graph(our_imports(runtime_only=True))
    assert strongly_connected(graph) == [{"clawgym_env.a", "clawgym_env.b"}]
    assert "clawgym_env.c" not in graph


def test_cycle_finder_finds_a_cycle():
    """The check above can fail: a two-package loop and a three-package loop are both reported."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c", "a"}, "f": {"a"}}
    assert sorted(map(sorted, strongly_connected(graph))) == [["a", "b"], ["c", "d", "e"]]


def test_layer_rule_sees_deferred_and_relative_imports(tmp_path):
    source = "def f():\n    from trainers.loop import train\n\nfrom .sibling import x\nimport evaluation.run\n"
    path = tmp_path / "mod.py"
    path.write_text(source)
    names = {name for _, name in imported_names("task_suites.pkg.mod", path)}
    assert {"trainers.loop", "task_suites.pkg.sibling", "evaluation.run"} <= names


def stack_in(doc: Path) -> list[str]:
    """The package names of the stack drawn after STACK_MARKER in a markdown file, top to bottom (one per
    line that starts in the first column; indented lines continue the one above)."""
    text = doc.read_text()
    assert STACK_MARKER in text, f"{doc.relative_to(ROOT)} has no layer stack (marker {STACK_MARKER!r})"
    block = re.search(r"```[^\n]*\n(.*?)```", text.split(STACK_MARKER, 1)[1], re.S)
    assert block, f"no fenced block after the layer marker in {doc.relative_to(ROOT)}"
    return [line.split()[0].rstrip("/") for line in block.group(1).splitlines() if line[:1].strip()]


@pytest.mark.parametrize("doc", ["README.md", "docs/README.md"])
def test_docs_show_the_same_stack(doc):
    assert stack_in(ROOT / doc) == list(reversed(LAYERS))


def test_packaging_and_import_guard_list_every_layer():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["include"] == [f"{p}*" for p in LAYERS]
    assert tuple(OUR_TOP_LEVEL) == LAYERS[1:]
    entry = pyproject["project"]["scripts"]["clawgym"]
    assert entry.split(".")[0] == LAYERS[-2], "the console script is the composition root"


def test_builtin_import_strings_point_at_existing_modules():
    """The ground names bundled suites and harnesses by import string only: each must exist and be callable."""
    from clawgym_env.builtin import BUILTIN_HARNESSES, BUILTIN_SUITES
    from clawgym_env.specs import resolve_callable

    targets = [loader for loader, _ in BUILTIN_SUITES.values()] + [a for a, _, _ in BUILTIN_HARNESSES.values()]
    for target in targets:
        assert callable(resolve_callable(target)), target
