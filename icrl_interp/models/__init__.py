"""Hooked models of the registered architectures, and theta* models of the families.

`ModelConfig` is light (no torch); everything else is imported on first use, so
`import icrl_interp.models` never pulls in torch or transformer_lens by itself.
"""
from __future__ import annotations

import importlib

from .config import DTYPES, CheckpointConfig, ModelConfig

_LAZY = {
    "build_model": ".build",
    "empty_model": ".build",
    "MODEL_CLASSES": ".build",
    "theta_star_model": ".theta",
    "register_model_class": ".build",
    "ICRLModel": ".base",
    "MaskedLinearAttentionModel": ".masked_linear_attention",
    "SoftmaxICTDModel": ".softmax_ictd",
    "LSAModel": ".lsa",
    "associative_is_cheaper": ".linear_attention",
}

__all__ = ["ModelConfig", "CheckpointConfig", "DTYPES", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    from .._compat import old_attribute

    return old_attribute(__name__, name)
