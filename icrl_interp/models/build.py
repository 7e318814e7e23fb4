"""Model classes by architecture, and `build_model` (small random init)."""
from __future__ import annotations

import torch

from ..families import registry
from .base import ICRLModel
from .config import ModelConfig
from .lsa import LSAModel
from .masked_linear_attention import MaskedLinearAttentionModel
from .softmax_ictd import SoftmaxICTDModel

MODEL_CLASSES: dict[str, type[ICRLModel]] = {
    "linear-attention": MaskedLinearAttentionModel,
    "softmax-ictd": SoftmaxICTDModel,
    "lsa": LSAModel,
}
"""Architecture name (registry.ARCHITECTURES) -> hooked model class."""


def register_model_class(architecture: str, cls: type[ICRLModel]) -> None:
    """Make models of a newly registered architecture buildable."""
    MODEL_CLASSES[architecture] = cls


def empty_model(config: ModelConfig) -> ICRLModel:
    """A model of `config` with all-zero parameters (loaders fill them)."""
    return MODEL_CLASSES[config.architecture](config)


def build_model(config: ModelConfig, seed: int | torch.Generator = 0, gain: float = 0.1) -> ICRLModel:
    """A model with a small random init, reproducible from `seed` (an int or a torch.Generator).

    Xavier-normal with `gain` (gain / L per untied layer for families that ask for it, as Wang et
    al.'s code); a family with lazy blocks (`Hints.lazy_from`) starts them at zero, as in Liang & Lai.
    """
    model = empty_model(config)
    family = registry.get(config.family)
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(int(seed))
    layer_gain = gain / config.n_layers if family.init_gain_per_layer and not config.tied else gain
    lazy = family.hints.lazy_from
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            torch.nn.init.xavier_normal_(params[name], gain=layer_gain, generator=gen)
            if lazy is not None:
                two = slice(config.layout.slice(lazy).start, config.D)
                params[name][two, two] = 0.0
    model.origin = {"kind": "random_init", "seed": seed if isinstance(seed, int) else None, "gain": gain}
    return model
