"""Old import paths, kept for one release: the one table of what moved where.

The modules moved into folders that are the package's layers (docs/development.md, "Layers"; the
changelog lists the moves). Code written against the flat layout of 0.1 keeps working for one
release: `import icrl_interp.recorder`, `from icrl_interp import recorder`, `from icrl_interp.recorder import record_model` and the renamed
classes resolve to their new homes with a DeprecationWarning naming the new path. An old module path
resolves to the very module object of its new home (not a copy), so monkeypatching either name
patches both.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

PACKAGE = "icrl_interp"
MOVED = {
    "errors": "core.errors",
    "validate": "core.validate",
    "files": "core.files",
    "heap": "core.heap",
    "resources": "core.resources",
    "cli_fields": "core.cli_fields",
    "outputs": "core.outputs",
    "devices": "core.devices",
    "cluster": "core.cluster",
    "faults": "core.faults",
    "envs": "tasks.envs",
    "layouts": "tasks.layouts",
    "sampling": "tasks.sampling",
    "reference": "tasks.reference",
    "registry": "families.registry",
    "checkpoint": "models.checkpoint",
    "construct": "models.construct",
    "models.linear_td": "models.masked_linear_attention",
    "models.softmax_td": "models.softmax_ictd",
    "budget": "recording.budget",
    "probe_spec": "recording.probe_spec",
    "capture": "recording.capture",
    "recorder": "recording.recorder",
    "live": "recording.live",
    "shards": "recording.shards",
    "recording": "recording.format",
    "causal": "interventions.causal",
    "candidates": "verdicts.candidates",
    "analyzers.verdict": "verdicts.behaviour",
    "causal_verdict": "verdicts.causal_evidence",
    "families.linear_td_training": "train.recipes.linear_td",
    "families.softmax_td_training": "train.recipes.softmax_td",
    "families.sarsa_training": "train.recipes.sarsa",
    "families.actor_critic_training": "train.recipes.actor_critic",
    "control": "train.control",
    "demo": "report.demo",
}
"""Old module path -> new module path, both relative to the package."""
RENAMED = {
    "models.masked_linear_attention": {"LinearTDModel": "MaskedLinearAttentionModel"},
    "models.softmax_ictd": {"SoftmaxTDModel": "SoftmaxICTDModel"},
    "models": {"LinearTDModel": "MaskedLinearAttentionModel", "SoftmaxTDModel": "SoftmaxICTDModel"},
}
"""New module path -> {old attribute name: new attribute name} (classes named for their family in 0.1)."""


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path works for one release (see the changelog)",
                  DeprecationWarning, stacklevel=3)


def old_attribute(module: str, name: str):
    """The value an old name had: `module.name` where `name` was a submodule that moved (`icrl_interp.recorder`
    after `import icrl_interp`), a renamed attribute (`models.LinearTDModel`), or a name of the old flat
    module that became this package (`icrl_interp.recording.Recording`). Raises AttributeError otherwise."""
    rel = module[len(PACKAGE) + 1:] if module.startswith(PACKAGE + ".") else ""
    sub = f"{rel}.{name}" if rel else name
    if sub in MOVED:
        _warn(f"{module}.{name}", f"{PACKAGE}.{MOVED[sub]}")
        return importlib.import_module(f"{PACKAGE}.{MOVED[sub]}")
    new_name = RENAMED.get(rel, {}).get(name)
    if new_name:
        _warn(f"{module}.{name}", f"{module}.{new_name}")
        return getattr(importlib.import_module(module), new_name)
    if rel in MOVED:  # a flat module whose name is now this package's
        target = importlib.import_module(f"{PACKAGE}.{MOVED[rel]}")
        if hasattr(target, name):
            _warn(f"{module}.{name}", f"{target.__name__}.{name}")
            return getattr(target, name)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and hands back its new home, the renamed names of RENAMED set on it too."""

    def find_spec(self, fullname, path=None, target=None):
        rel = fullname[len(PACKAGE) + 1:] if fullname.startswith(PACKAGE + ".") else None
        if rel not in MOVED or rel == MOVED[rel].rsplit(".", 1)[0]:
            return None  # not an old path, or the old name is now a package (the normal finder has it)
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        rel = spec.name[len(PACKAGE) + 1:]
        _warn(spec.name, f"{PACKAGE}.{MOVED[rel]}")
        module = importlib.import_module(f"{PACKAGE}.{MOVED[rel]}")
        for old, new in RENAMED.get(MOVED[rel], {}).items():
            if not hasattr(module, old):
                setattr(module, old, getattr(module, new))
        return module

    def exec_module(self, module):
        """Nothing to run: the new home is imported already."""


def install() -> None:
    """Put the old-path finder first on sys.meta_path (once)."""
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths())
