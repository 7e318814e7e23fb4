"""Loading a registry (the families, the analyzers): its built-in modules and the modules of your own,
each of which registers itself, named by an installed package's entry points or by an environment
variable, imported on the registry's first lookup."""
from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from .errors import UserError


def load_registry(table: dict, builtin: tuple[str, ...], rank: Callable[[Any], int], group: str, env_var: str,
                  what: str) -> None:
    """Import the `builtin` modules (each registers into `table`, {name: entry}), put the entries in
    `rank` order (the built-in ones first, whatever registered before the first lookup), then import the
    modules of your own (`import_plugins`)."""
    for module in builtin:
        importlib.import_module(module)
    ordered = sorted(table.values(), key=rank)
    table.clear()
    table.update((entry.name, entry) for entry in ordered)
    import_plugins(group, env_var, what)


def import_plugins(group: str, env_var: str, what: str) -> None:
    """Import the modules the entry points of `group` name, then those of $`env_var` (comma-separated);
    one that does not import is a one-line UserError naming it and where it was named."""
    modules = [ep.value.split(":")[0] for ep in entry_points(group=group)]
    modules += [m.strip() for m in os.environ.get(env_var, "").split(",") if m.strip()]
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UserError(f"cannot import {what} module {module!r} (from {env_var} or the {group!r} entry points): "
                            f"{e}") from None
