"""Where the shipped probe specs and trained checkpoints live, in a wheel and in a checkout.

The files stay at the repository top level (`probes/*.toml`, `data/checkpoints/**`),
outside the `icrl_interp` source folder. The two kinds of install see them at
different places:

- installed wheel (`pip install .`, or from an sdist): pyproject.toml maps the two
  folders into the package as `icrl_interp/_shipped/probes/` and
  `icrl_interp/_shipped/data/` (`[tool.setuptools] package-dir`), so they sit next
  to the installed code in site-packages and there is no repository around;
- source checkout (`pip install -e .`, what `make test` uses, or plain
  `python -m` from the repository): the package is imported from the repository's
  `icrl_interp/` folder, which has no `_shipped/` subfolder; the files are read in
  place from the repository top level, so an edit to a spec or a checkpoint shows
  up without reinstalling.

Both are located from the imported package itself (`importlib.resources`), never
from the current directory. Stdlib only: importing this module stays instant.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

SNAPSHOTS = "snapshots"
"""Subfolder of a shipped or exported checkpoint holding earlier checkpoints of its training run
(`snapshots/step_000100/`: model + config), for metrics against training step."""
SHIPPED_SUBDIR = "_shipped"
"""Folder inside the installed package that holds the mapped top-level folders."""


def package_dir() -> Path:
    """The folder `icrl_interp` was imported from (site-packages or the checkout)."""
    root = files("icrl_interp")
    if not isinstance(root, Path):  # e.g. imported from a zip file: the data can't be read in place
        raise RuntimeError(f"icrl_interp is not installed as plain files ({root!r}); "
                           "install it with pip (a wheel or `pip install -e .`)")
    return root


def _shipped(*parts: str) -> Path:
    """`_shipped/<parts>` in an installed wheel, else `<parts>` at the checkout's top level."""
    pkg = package_dir()
    installed = pkg.joinpath(SHIPPED_SUBDIR, *parts)
    if installed.is_dir():
        return installed
    return pkg.parent.joinpath(*parts)


def probes_dir() -> Path:
    """The shipped probe specs (`probes/*.toml` of the repository)."""
    return _shipped("probes")


def checkpoints_dir() -> Path:
    """The shipped trained checkpoints (`data/checkpoints/` of the repository), one folder each."""
    return _shipped("data", "checkpoints")


def ad_dir() -> Path:
    """The shipped Algorithm Distillation model (`data/ad/` of the repository: `models.ad_transformer`)."""
    return _shipped("data", "ad")


def zoo_dir() -> Path:
    """The shipped trained zoo models (`data/zoo/` of the repository), one folder each (`zoo.mimics`)."""
    return _shipped("data", "zoo")
