"""The declared dependencies say the truth (pyproject.toml), both ways:

* every core dependency is imported by the package (icrl_interp/), and every third-party module the
  package imports comes from a core dependency;
* every dependency of the `test` extra is used by the tests (imported under tests/, named in pytest's
  addopts, or the build backend the packaging test builds with) and never imported by the package;
  every third-party module the tests import comes from a core or test dependency;
* the `episodes` extra (Gymnasium, Minari, scipy) is what the package's episode code imports lazily, beyond the
  core; the `test` extra carries every one of its dependencies, so `make test` installs them;
* TransformerLens is optional (the `tl` extra, and in the `test` extra): the package's own models carry TL's
  hook API (icrl_interp/models/hooks.py), so the package imports it nowhere; its range admits only releases
  with `HookedTransformer` (3.x; 4.x removed it), the class the documented TransformerLens route
  (docs/byom.md, examples/tl_model.py) builds on.

Which distribution provides which module comes from the installed metadata
(`importlib.metadata.packages_distributions`), so nothing here is a hand-kept list of names.
"""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LOCAL_ROOTS = ("tests", "examples", "reproductions", "benchmarks", "docs")
"""Folders whose own modules tests import by name (they put these folders on sys.path)."""
FINDERS = {"importorskip", "import_module", "find_spec"}
"""Calls that import (or look for) a module named by their first argument, a string literal."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _requirements(texts: list[str]) -> dict[str, Requirement]:
    return {_norm(r.name): r for r in map(Requirement, texts)}


CORE = _requirements(PYPROJECT["project"]["dependencies"])
TEST = _requirements(PYPROJECT["project"]["optional-dependencies"]["test"])
EPISODES = _requirements(PYPROJECT["project"]["optional-dependencies"]["episodes"])
PROVIDERS = {top: {_norm(d) for d in dists} for top, dists in packages_distributions().items()}
LOCAL = {p.stem for root in LOCAL_ROOTS for p in (REPO / root).rglob("*.py")} | {
    p.name for root in LOCAL_ROOTS for p in (REPO / root).rglob("*") if p.is_dir()} | set(LOCAL_ROOTS)


def _imported(root: str) -> dict[str, str]:
    """Top-level module -> the first file under `root` importing it (third-party modules only)."""
    found: dict[str, str] = {}
    for path in sorted((REPO / root).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)
                  and getattr(node.func, "attr", getattr(node.func, "id", None)) in FINDERS):
                names = [node.args[0].value]
            for name in names:
                top = name.split(".")[0]  # '' for a relative import_module('.x', package): the package's own
                if top and top not in sys.stdlib_module_names and top != "icrl_interp" and top not in LOCAL:
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


PACKAGE = _imported("icrl_interp")
TESTS = _imported("tests")


def _providers(module: str) -> set[str]:
    if module not in PROVIDERS:
        pytest.fail(f"{module} is imported but no installed distribution provides it: pip install -e '.[test]'")
    return PROVIDERS[module]


def _modules_of(dist: str) -> set[str]:
    return {top for top, dists in PROVIDERS.items() if dist in dists}


@pytest.mark.parametrize("dist", sorted(CORE))
def test_every_core_dependency_is_imported_by_the_package(dist):
    used = _modules_of(dist) & set(PACKAGE)
    assert used, (f"{dist} is a core dependency but icrl_interp/ never imports it (modules {sorted(_modules_of(dist))}): "
                  f"move it to the extra that uses it, or drop it")


def test_every_module_the_package_imports_comes_from_a_core_dependency():
    missing = {m: f for m, f in PACKAGE.items() if not _providers(m) & (set(CORE) | set(EPISODES))}
    assert not missing, f"imported by the package but not a core dependency (nor of the episodes extra): {missing}"


@pytest.mark.parametrize("dist", sorted(EPISODES))
def test_the_episodes_extra_is_used_by_the_package_and_installed_by_make_test(dist):
    assert dist in TEST, f"{dist} is in the episodes extra but not in the test extra: make test would not install it"
    assert _modules_of(dist) & set(PACKAGE), f"{dist} is in the episodes extra but icrl_interp/ never imports it"


@pytest.mark.parametrize("dist", sorted(TEST))
def test_every_test_dependency_is_used_by_the_tests_only(dist):
    modules = _modules_of(dist)
    in_package = modules & set(PACKAGE)
    assert not in_package or dist in EPISODES, (f"{dist} is in the test extra but the package imports {sorted(in_package)} "
                            f"({PACKAGE[next(iter(in_package))]}): declare it as a core dependency")
    addopts = PYPROJECT["tool"]["pytest"]["ini_options"]["addopts"]
    backend = _requirements(PYPROJECT["build-system"]["requires"])
    # a build backend, a plugin switched on in addopts, or one `make test` relies on (pytest-xdist's -n), which the
    # Makefile names
    tool = (dist in backend or any(m in re.split(r"[\s=,.]+", addopts) for m in modules)
            or dist in (REPO / "Makefile").read_text())
    assert modules & set(TESTS) or tool, f"{dist} is in the test extra but no test uses it: drop it"


def test_every_module_the_tests_import_is_declared():
    declared = set(CORE) | set(TEST)
    missing = {m: f for m, f in TESTS.items() if not _providers(m) & declared}
    assert not missing, f"imported by the tests but declared nowhere (core or the test extra): {missing}"


def test_the_finder_sees_every_kind_of_import(tmp_path, monkeypatch):
    """The scan itself: plain, dotted, from-, importorskip and find_spec imports count; relative ones,
    the standard library and the package's own modules do not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("import os, numpy.linalg\nfrom h5py import File\nfrom . import sibling\n"
                              "import icrl_interp\npytest.importorskip('psutil')\nutil.find_spec('mkdocs')\n"
                              "f('tqdm')\nimportlib.import_module('.x', 'pkg')\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert set(_imported("pkg")) == {"numpy", "h5py", "psutil", "mkdocs"}


@pytest.mark.parametrize("extra", ["tl", "test"])
def test_transformer_lens_range_excludes_the_release_without_hooked_transformer(extra):
    """4.0 removed `HookedTransformer`: the range stops before it, and admits the pinned, tested release."""
    assert "transformer-lens" not in CORE  # optional: the package never imports it
    tl = _requirements(PYPROJECT["project"]["optional-dependencies"][extra])["transformer-lens"]
    assert not tl.specifier.contains("4.0.0", prereleases=True)
    assert not tl.specifier.contains("4.0.0rc1", prereleases=True)
    assert tl.specifier.contains(version("transformer-lens"))
    pin = next(line.split("==")[1].strip() for line in (REPO / "constraints.txt").read_text().splitlines()
               if line.startswith("transformer-lens=="))
    assert tl.specifier.contains(pin)
