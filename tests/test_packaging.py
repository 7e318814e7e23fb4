"""A built wheel works on its own: it carries the probe specs and the shipped checkpoints,
and `icrl-interp demo` runs from it outside any source checkout.

The wheel is built from a copy of the repository in a temporary folder: an in-tree
build writes build/ and *.egg-info into the checkout, and a stale build/lib from an
earlier build would hide a broken packaging config. It is installed into a fresh
venv whose only link to the test venv is a .pth line adding the test venv's
site-packages (for torch & co., no network). A .pth line only appends a directory to
sys.path, it does not run the `__editable__*.pth` finder found there, so
`icrl_interp` can only come from the installed wheel; the tests assert that.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

from icrl_interp.report import demo
from icrl_interp.recording import probe_spec
from icrl_interp.core import resources

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
NO_CHECKPOINTS_NOTE = "no trained checkpoints found"
"""Start of the note `icrl-interp demo` prints when it finds no shipped checkpoints."""

# top-level names never copied into the build folder: VCS, environments, build outputs, run outputs
_SKIP_TOP = {".git", ".venv", "build", "dist", "site", "runs", "icrl-report", ".whl", ".gl",
             ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def _shipped_files(top: str) -> list[str]:
    """Every file under the repository's top-level folder `top`, relative to the repository."""
    return sorted(p.relative_to(REPO).as_posix() for p in (REPO / top).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


PROBE_FILES = _shipped_files("probes")
CHECKPOINT_FILES = _shipped_files("data/checkpoints")


def _clean_env() -> dict[str, str]:
    """The environment minus everything that could point Python at the checkout or the test venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH", "VIRTUAL_ENV",
                        "__PYVENV_LAUNCHER__", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")}
    env.update(PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               PIP_NO_INDEX="1", MPLBACKEND="Agg", PYTHONWARNINGS="ignore",
               # as conftest.py does for the test process: the demo's analysis workers on a
               # shared 2-core machine lose more to torch's threading than they gain
               OMP_NUM_THREADS="1")
    return env


def _run(cmd: list, what: str, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `cmd`; fail the test with its output when it exits non-zero or hangs."""
    try:
        out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                             cwd=cwd, env=_clean_env())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what} took over {timeout:.0f} s: {' '.join(map(str, cmd))}\n{e.stdout or ''}\n{e.stderr or ''}")
    if out.returncode != 0:
        pytest.fail(f"{what} failed (exit {out.returncode}): {' '.join(map(str, cmd))}\n"
                    f"--- stdout ---\n{out.stdout[-6000:]}\n--- stderr ---\n{out.stderr[-6000:]}")
    return out


def _check_build_requirements() -> None:
    """The build runs without isolation (no network), so the test venv must hold the build backend."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    for text in PYPROJECT["build-system"]["requires"]:
        req = Requirement(text)
        try:
            have = version(req.name)
        except PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            pytest.fail(f"build requirement {text!r} is not met in the test venv (have {have or 'nothing'}); "
                        f"the packaging test builds with --no-build-isolation: `pip install '{text}'` "
                        "(the [test] extra lists it, so `make test` installs it)")


def _copy_source(dst: Path) -> Path:
    """The checkout's files (without VCS, venvs and build outputs) under `dst`."""
    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
        if Path(folder).resolve() == REPO:
            skip |= _SKIP_TOP & set(names)
        return skip

    shutil.copytree(REPO, dst, ignore=ignore, symlinks=True)
    return dst


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    _check_build_requirements()
    return _copy_source(tmp_path_factory.mktemp("build") / "src")


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "-q", "-w", dist, source], "building the wheel", timeout=180)
    wheels = sorted(dist.glob("icrl_interp-*.whl"))
    assert len(wheels) == 1, f"expected one icrl_interp wheel in {dist}, found {[w.name for w in dist.iterdir()]}"
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed and the test venv's site-packages as a fallback path."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", root], "creating the venv", timeout=120)
    python = root / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        "asking the venv for its site-packages", timeout=60).stdout.strip())
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    assert ours, "the test venv has no site-packages directory to reuse"
    (purelib / "_test_venv_site_packages.pth").write_text("".join(f"{p}\n" for p in ours))
    # pip comes from the test venv; --ignore-installed: that venv's editable icrl_interp is not ours to touch
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q", wheel],
         "installing the wheel", timeout=180)
    return root


def test_wheel_carries_probe_specs_and_checkpoints(wheel):
    assert PROBE_FILES and CHECKPOINT_FILES, "the checkout has no probes/ or data/checkpoints/ files"
    names = set(zipfile.ZipFile(wheel).namelist())
    pkg = f"icrl_interp/{resources.SHIPPED_SUBDIR}"
    missing = [f for f in PROBE_FILES + CHECKPOINT_FILES if f"{pkg}/{f}" not in names]
    assert not missing, f"{wheel.name} lacks {missing} (expected under {pkg}/; see pyproject.toml [tool.setuptools])"


def test_sdist_carries_probe_specs_and_checkpoints(source, tmp_path):
    out = _run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                "print(b.build_sdist(sys.argv[1]))", tmp_path], "building the sdist", timeout=120, cwd=source)
    sdist = tmp_path / out.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    missing = [f for f in PROBE_FILES + CHECKPOINT_FILES + ["pyproject.toml"] if f not in names]
    assert not missing, f"{sdist.name} lacks {missing}"


def test_installed_wheel_is_imported_from_the_venv(venv, tmp_path):
    code = ("import json, icrl_interp, icrl_interp.report.demo as d, icrl_interp.recording.probe_spec as p, "
            "icrl_interp.core.resources as r; print(json.dumps({'package': icrl_interp.__file__, "
            "'probes': str(r.probes_dir()), 'checkpoints': str(r.checkpoints_dir()), "
            "'SPEC_DIR': str(p.SPEC_DIR), 'DATA_DIR': str(d.DATA_DIR)}))")
    out = _run([venv / "bin" / "python", "-c", code], "importing the installed wheel", timeout=60, cwd=tmp_path)
    paths = json.loads(out.stdout.strip().splitlines()[-1])
    root = venv.resolve()
    outside = {k: v for k, v in paths.items() if not Path(v).resolve().is_relative_to(root)}
    assert not outside, f"resolved outside the wheel's venv {root} (source tree or test venv?): {outside}"
    probes, checkpoints = Path(paths["probes"]), Path(paths["checkpoints"])
    assert sorted(f.name for f in probes.glob("*.toml")) == sorted(Path(f).name for f in PROBE_FILES)
    assert sorted(f.relative_to(checkpoints).as_posix() for f in checkpoints.rglob("*") if f.is_file()) == \
        sorted(Path(f).relative_to("data/checkpoints").as_posix() for f in CHECKPOINT_FILES)


def test_demo_runs_from_the_installed_wheel(venv, tmp_path):
    """`icrl-interp demo --quick` from an unrelated empty directory finds the shipped checkpoints."""
    cwd, report = tmp_path / "elsewhere", tmp_path / "report"
    cwd.mkdir()
    script = venv / "bin" / "icrl-interp"
    assert script.exists(), f"the wheel installed no console script at {script}"
    t0 = time.perf_counter()
    out = _run([script, "demo", "--quick", "--out", report], "icrl-interp demo --quick", timeout=600, cwd=cwd)
    print(f"demo from the wheel: {time.perf_counter() - t0:.1f} s")
    assert NO_CHECKPOINTS_NOTE not in out.stdout, f"the demo found no shipped checkpoints:\n{out.stdout[-3000:]}"
    assert (report / "index.html").is_file(), f"no report index.html in {report}:\n{out.stdout[-3000:]}"
    n_shipped = len(demo.shipped_checkpoints(resources.checkpoints_dir()))
    trained = sorted(p.name for p in (report / "inputs").glob("trained-*.h5"))
    assert len(trained) == n_shipped, f"expected recordings of {n_shipped} shipped checkpoints, got {trained}"


# --- fast checks on the checkout itself -------------------------------------------------


def test_resources_find_every_shipped_spec_and_checkpoint():
    assert resources.probes_dir() == probe_spec.SPEC_DIR
    assert resources.checkpoints_dir() == demo.DATA_DIR
    for name in probe_spec.SHIPPED.values():
        assert (resources.probes_dir() / name).is_file(), f"{name} missing from {resources.probes_dir()}"
    found = demo.shipped_checkpoints(resources.checkpoints_dir())
    expected = sorted({(REPO / f).parent for f in CHECKPOINT_FILES if f.endswith("/config.json") and "/snapshots/" not in f})
    assert found and [p.resolve() for p in found] == [p.resolve() for p in expected]
    for family in ("linear-td", "softmax-td", "sarsa"):
        assert (resources.checkpoints_dir() / family / "model.safetensors").is_file()


def test_resources_stays_light():
    """resources.py is imported by probe_spec and demo at import time: stdlib only."""
    tree = ast.parse(Path(resources.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names), f"non-stdlib imports in resources.py: {imported - set(sys.stdlib_module_names)}"


def test_pyproject_lists_every_subpackage():
    """[tool.setuptools] packages is explicit (the mapped data packages can't be auto-discovered):
    a subpackage left off it would be missing from the wheel."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "icrl_interp").rglob("__init__.py")
               if "__pycache__" not in p.parts}
    missing = sorted(on_disk - listed)
    assert not missing, f"add {missing} to [tool.setuptools] packages in pyproject.toml"
    for pkg, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        assert pkg in listed and (REPO / folder).is_dir(), (pkg, folder)
