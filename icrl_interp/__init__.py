"""icrl_interp: which RL algorithm does a transformer's forward pass run?

Importing this package stays light: it never imports transformer_lens (the
model modules do, on first use).
"""
from ._version import __version__
from .errors import UserError
from .layouts import PromptLayout, Prompt, layout_for
from . import envs, layouts, reference, theta_star

__all__ = ["__version__", "UserError", "PromptLayout", "Prompt", "layout_for", "envs", "layouts", "reference", "theta_star"]
