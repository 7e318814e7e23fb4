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


__all__ = ["__version__", "UserError", "PromptLayout", "Prompt", "layout_for", "envs", "layouts", "reference",
           "registry"]
