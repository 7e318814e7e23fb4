"""Model classes by family, and `build_model` (small random init)."""
from __future__ import annotations

import torch

from .base import ICRLModel
from .config import LSA_FAMILIES, ModelConfig
from .linear_td import LinearTDModel
from .lsa import LSAModel
from .softmax_td import SoftmaxTDModel

MODEL_CLASSES: dict[str, type[ICRLModel]] = {
    "linear-td": LinearTDModel,
    "softmax-td": SoftmaxTDModel,
    "sarsa": LSAModel,
    "actor-critic": LSAModel,
}


def empty_model(config: ModelConfig) -> ICRLModel:
    """A model of `config` with all-zero parameters (loaders fill them)."""
    return MODEL_CLASSES[config.family](config)


def build_model(config: ModelConfig, seed: int | torch.Generator = 0, gain: float = 0.1) -> ICRLModel:
    """A model with a small random init, reproducible from `seed` (an int or a torch.Generator).

    Xavier-normal with `gain` (linear-td per-layer weights: gain / L, as Wang et al.'s code);
    for the LSA families the lazy blocks P22 and V22 (rows and columns of the parameter
    block) start at zero, as in Liang & Lai.
    """
    model = empty_model(config)
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(int(seed))
    layer_gain = gain / config.n_layers if config.family == "linear-td" and not config.tied else gain
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            torch.nn.init.xavier_normal_(params[name], gain=layer_gain, generator=gen)
            if config.family in LSA_FAMILIES:
                two = slice(config.layout.slice("param_one").start, config.D)
                params[name][two, two] = 0.0
    model.origin = {"kind": "random_init", "seed": seed if isinstance(seed, int) else None, "gain": gain}
    return model
