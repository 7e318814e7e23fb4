"""The analyzer registry: the one list of analyses, in the order they run and their sections appear.

Each built-in analysis registers one `base.Analyzer` from its own module (`BUILTIN`, imported on the
first lookup); an analyzer of your own is one `register(Analyzer(...))` call in a module of yours,
made known to other processes (the report's workers, a CLI call) by an entry point of the group
`icrl_interp.analyzers` or by $ICRL_INTERP_ANALYZERS, as families are (docs/adding-an-analyzer.md).
The analysis' `sections`, its streaming pass, the live analysis and the report's columns all read
this list; nothing else names an analysis.
"""
from __future__ import annotations

from ..core.errors import UserError
from ..core.plugins import load_registry
from .base import Analyzer, Column, check_analyzer
from .keys import POPULATION_KERNEL, READOUTS, VALUE_ERROR, WANG_METRICS, WEIGHTS

BUILTIN = ("icrl_interp.analyzers.weights", "icrl_interp.analyzers.kernel", "icrl_interp.analyzers.convergence",
           "icrl_interp.analyzers.probes", "icrl_interp.analyzers.td_step", "icrl_interp.analyzers.readout")
"""Homes of the built-in analyzers, imported on the first lookup (each registers its own)."""
ORDER = (WEIGHTS, POPULATION_KERNEL, VALUE_ERROR, "kernels", "probes", WANG_METRICS, READOUTS)
"""The built-in analyzers in the order they run and `sections` lists them (the weights first: the
population kernel is placed into them); analyzers of your own follow in the order they register."""
ENTRY_POINTS = "icrl_interp.analyzers"
"""Entry-point group of installed packages' analyzer modules (each entry names a module that registers)."""
ENV_VAR = "ICRL_INTERP_ANALYZERS"
"""Comma-separated module names of further analyzer modules, imported after the built-in ones. Worker
processes inherit it, so an analyzer of your own runs there too."""

ANALYZERS: dict[str, Analyzer] = {}
_loaded = False


def register(analyzer: Analyzer, *, replace: bool = False) -> Analyzer:
    """Add an analyzer after checking it (`base.check_analyzer`); a second analyzer of the same name, or
    a column key another analyzer has, is an error unless `replace`."""
    check_analyzer(analyzer)
    old = ANALYZERS.get(analyzer.name)
    if old is not None and not replace and old is not analyzer:
        raise UserError(f"an analyzer named {analyzer.name!r} is already registered")
    taken = {c.key: a.name for a in ANALYZERS.values() if a.name != analyzer.name for c in a.columns}
    clash = [c.key for c in analyzer.columns if c.key in taken]
    if clash:
        raise UserError(f"analyzer {analyzer.name!r}: column {clash[0]!r} is already analyzer {taken[clash[0]]!r}'s")
    ANALYZERS[analyzer.name] = analyzer
    return analyzer


def _load_builtins() -> None:
    """Import the built-in homes, installed plugins (entry points) and $ICRL_INTERP_ANALYZERS, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    rank = {name: i for i, name in enumerate(ORDER)}  # the built-in ones first, in ORDER
    load_registry(ANALYZERS, BUILTIN, lambda a: rank.get(a.name, len(rank)), ENTRY_POINTS, ENV_VAR, "analyzer")


def analyzers() -> list[Analyzer]:
    """Every registered analyzer, in the order they run."""
    _load_builtins()
    return list(ANALYZERS.values())


def get(name) -> Analyzer:
    """The analyzer registered under `name`; a one-line UserError naming the known ones otherwise."""
    _load_builtins()
    if not isinstance(name, str) or name not in ANALYZERS:
        raise UserError(f"unknown analyzer {name!r} (known: {', '.join(ANALYZERS)})")
    return ANALYZERS[name]


def names() -> list[str]:
    """Registered analyzer names, in order: the analysis' sections."""
    return [a.name for a in analyzers()]


def columns() -> list[Column]:
    """The summary fields of every analyzer, in order: the report's columns."""
    return [c for a in analyzers() for c in a.columns]


def unregister(name: str) -> None:
    """Remove an analyzer (tests register temporary ones)."""
    ANALYZERS.pop(name, None)
