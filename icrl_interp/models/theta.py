"""theta* models: a family's explicit parameters loaded into an ordinary model.

The matrices come from the family's home (`registry.Family.theta_star`); this module only
puts them into the right layers and records the constants in `model.origin`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ..core.errors import UserError
from ..families import registry
from .base import ICRLModel
from .build import empty_model
from .config import ModelConfig

Number = float | int


def _alphas(alpha, n_layers: int, tied: bool) -> list[float]:
    if isinstance(alpha, (int, float)):
        return [float(alpha)] * n_layers
    alphas = [float(a) for a in alpha]
    if not all(np.isfinite(alphas)):
        raise UserError(f"step sizes must be finite, got {alphas}")
    if tied:
        raise UserError("per-layer step sizes need untied weights (tied=False)")
    if len(alphas) != n_layers:
        raise UserError(f"got {len(alphas)} step sizes for {n_layers} layers")
    return alphas


def theta_star_model(
    family: str,
    d: int,
    n_layers: int = 1,
    gamma: Number = 0.9,
    alpha: Number | Sequence[Number] = 1.0,
    tied: bool = True,
    dtype: str = "float64",
    form: str | None = None,
    m: int | None = None,
    **constants,
) -> ICRLModel:
    """A model whose parameters are exactly theta* of `family` (docs/concepts.md).

    alpha: one step, or one per layer (untied). `constants`: the family's theta* constants
    (`registry.get(family).constants`, e.g. c, C for linear-td, score_scale for softmax-td,
    c and the critic step `critic_step` for actor-critic); any other keyword is an error.
    """
    fam = registry.get(family)
    if fam.theta_star is None:
        raise UserError(f"family {family!r} has no theta* construction")
    constants = registry.current_keys(constants, fam.renamed.get("origin", {}))  # a constant named as by 0.1
    unknown = sorted(set(constants) - set(fam.constants))
    if unknown:
        raise UserError(f"{', '.join(unknown)} does not apply to the {family} theta* "
                        f"(its constants: {', '.join(fam.constants) or 'none'})")
    k = {**fam.constants, **constants}
    if k.get("c") == 0:
        raise UserError("the scale c must be non-zero")
    config = ModelConfig(family=family, d=d, n_layers=n_layers, gamma=gamma, tied=tied, form=form, m=m, dtype=dtype)
    alphas = _alphas(alpha, config.n_layers, tied)
    config = dataclasses.replace(config, alpha=alphas[0])
    model = empty_model(config)
    arrays = {}
    for layer in config.stored_layers():
        for name, matrix in fam.theta_star(config, alphas[layer], k).items():
            arrays[f"blocks.{layer}.attn.{name}"] = matrix
    model.load_arrays(arrays)
    origin: dict = {"kind": "theta_star", "alpha": alphas[0]}
    if len(set(alphas)) > 1:
        origin["alphas"] = alphas
    for name, value in k.items():
        origin[name] = np.asarray(value, dtype=np.float64).tolist() if isinstance(value, (np.ndarray, list)) else (
            None if value is None else float(value))
    model.origin = origin
    return model
