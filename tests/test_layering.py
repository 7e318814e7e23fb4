"""The package's import graph: no circles, nothing imported from a higher layer, no family name
outside the registry and the family homes.

The folders of `icrl_interp/` are its layers (docs/development.md, "Layers"): a module belongs to the layer of
the folder it is in, and may import its own layer and the ones below. Every `import` statement counts,
also the ones inside functions (a lazy import is still a dependency). Data flows one way: core ->
tasks -> families -> models -> recording -> analyzers -> interventions -> verdicts -> train -> report
-> commands. LAYERS below is the one table of layers.
"""
from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "icrl_interp"

LAYERS: list[str] = ["core", "tasks", "families", "models", "recording", "analyzers", "interventions", "verdicts",
                     "train", "zoo", "report", "commands"]
"""The folders of icrl_interp/, lowest layer first."""
TOP_LEVEL = {"icrl_interp._version": "core", "icrl_interp._compat": "core", "icrl_interp.cli": "commands",
             "icrl_interp": "commands"}
"""The few modules beside the folders, and the layer each belongs to: the version and the compatibility
table of old import paths (which imports nothing of the package) with the core, the console script
and the package's own `__init__` (the public API: it reaches into every layer) at the top."""

FAMILY_HOMES = ("icrl_interp.families.registry", "icrl_interp.families.*")
"""The only modules where a family name may appear as a string literal."""


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Package modules imported anywhere in the file (absolute and relative, lazy ones included)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{mod}.{alias.name}"
                out.add(sub if sub in known else mod)
    return {m for m in out if m in known and m != name}


def layer_of(name: str) -> int:
    if name in TOP_LEVEL:
        return LAYERS.index(TOP_LEVEL[name])
    folder = name.split(".")[1]
    if folder not in LAYERS:
        raise AssertionError(f"module {name} is in no layer: a folder of icrl_interp/ missing from LAYERS in {__file__}")
    return LAYERS.index(folder)


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(path, name, known) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_no_import_circles():
    assert cycles(graph()) == []


def test_the_folders_are_the_layers():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders - {"_shipped"} == set(LAYERS)
    top = {module_name(p) for p in PACKAGE.glob("*.py")}
    assert top == set(TOP_LEVEL), "a new top-level module: put it in the folder of its layer"


def test_no_upward_imports():
    bad = [f"{a} ({LAYERS[layer_of(a)]}) imports {b} ({LAYERS[layer_of(b)]})"
           for a, deps in sorted(graph().items()) for b in sorted(deps) if layer_of(b) > layer_of(a)]
    assert bad == []


def test_family_names_only_in_the_registry_and_homes():
    from icrl_interp.families import registry

    names = set(registry.names())
    found = []
    for name, path in modules().items():
        if any(fnmatch.fnmatchcase(name, p) for p in FAMILY_HOMES):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{name}:{node.lineno} {node.value!r}")
    assert found == []


# ---------------------------------------------------------------- the checker itself
def test_checker_sees_lazy_relative_and_submodule_imports(tmp_path):
    pkg = tmp_path / "icrl_interp"
    (pkg / "sub").mkdir(parents=True)
    for rel in ("__init__.py", "a.py", "b.py", "sub/__init__.py", "sub/c.py"):
        (pkg / rel).write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "sub" / "c.py").write_text("from .. import a\nfrom icrl_interp.sub import c as _\n")
    known = {"icrl_interp", "icrl_interp.a", "icrl_interp.b", "icrl_interp.sub", "icrl_interp.sub.c"}
    assert imports(pkg / "a.py", "icrl_interp.a", known) == {"icrl_interp.b"}
    assert imports(pkg / "sub" / "c.py", "icrl_interp.sub.c", known) == {"icrl_interp.a"}


def test_checker_finds_a_circle_and_its_members():
    g = {"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}
    assert cycles(g) == [["x", "y", "z"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


@pytest.mark.parametrize("name, layer", [("icrl_interp.families.sarsa", "families"),
                                         ("icrl_interp.train.recipes.sarsa", "train"),
                                         ("icrl_interp.analyzers.kernel", "analyzers"),
                                         ("icrl_interp.recording", "recording"),
                                         ("icrl_interp._compat", "core"),
                                         ("icrl_interp", "commands")])
def test_layer_table(name, layer):
    assert LAYERS[layer_of(name)] == layer


def test_a_module_outside_the_layers_is_named():
    with pytest.raises(AssertionError, match="icrl_interp.extras.x is in no layer"):
        layer_of("icrl_interp.extras.x")
