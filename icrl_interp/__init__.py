"""icrl_interp: which RL algorithm does a transformer's forward pass run?

Importing this package stays light: it never imports torch or transformer_lens (the
model modules do, on first use). Families are looked up in `icrl_interp.registry`.
"""
from ._version import __version__
from .errors import UserError
from .layouts import Prompt, PromptLayout
from . import envs, layouts, reference, registry


def layout_for(family: str, d: int, m: int | None = None) -> PromptLayout:
    """The prompt layout of a registered family for feature dimension d (and policy dimension m)."""
    return registry.get(family).layout(d, m)


def record(model, task, out, **options):
    """Record `model` (any torch module taking the task's prompts, or one of the package's models) on
    `task` (a family name plus `task_options`, or a checkpoint) into the HDF5 file `out`; see
    `icrl_interp.recorder.record_model` and docs/byom.md. Returns a RecordSummary."""
    from .recorder import record_model

    return record_model(model, task, out, **options)


def analyze(path, **options) -> dict:
    """Analyze a checkpoint, recording or TransformerLens weights file into the analysis JSON dict
    (`icrl_interp.analyzers.analyze.analyze`)."""
    from .analyzers.analyze import analyze as _analyze

    return _analyze(path, **options)


__all__ = ["__version__", "UserError", "PromptLayout", "Prompt", "layout_for", "envs", "layouts", "reference",
           "registry", "record", "analyze"]
