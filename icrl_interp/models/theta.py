"""theta* models: the papers' explicit parameters loaded into ordinary models.

The matrices come from `icrl_interp.theta_star`; this module only puts them into
the right layers, applies the gauge scale c, and records the constants in
`model.origin`. Register another family's builder with `register_theta_star`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from .. import theta_star
from ..errors import UserError
from .base import ICRLModel
from .build import empty_model
from .config import ModelConfig

Number = float | int
# builder(config, alpha_of_layer, constants) -> {parameter name: matrix}
ThetaStarBuilder = Callable[[ModelConfig, float, dict], dict[str, np.ndarray]]


def _linear_td(config: ModelConfig, alpha: float, k: dict) -> dict[str, np.ndarray]:
    mats = theta_star.linear_td(config.d, alpha, k["C"])
    return {"P": k["c"] * mats["P"], "Q": mats["Q"] / k["c"]}


def _softmax_td(config: ModelConfig, alpha: float, k: dict) -> dict[str, np.ndarray]:
    mats = theta_star.softmax_td(config.d, alpha, config.gamma, k["score_scale"])
    return {name: mats[name] for name in config.parameter_names()}


def _sarsa(config: ModelConfig, alpha: float, k: dict) -> dict[str, np.ndarray]:
    return theta_star.sarsa(config.d, alpha, k["c"])


THETA_STAR: dict[str, ThetaStarBuilder] = {"linear-td": _linear_td, "softmax-td": _softmax_td, "sarsa": _sarsa}
# Which optional constants a family's theta* takes (anything else must keep its default).
_CONSTANTS = {"linear-td": ("c", "C"), "softmax-td": ("score_scale",), "sarsa": ("c",)}


def register_theta_star(family: str, builder: ThetaStarBuilder, constants: tuple[str, ...] = ()) -> None:
    """Make `theta_star_model(family, ...)` available (e.g. for actor-critic)."""
    THETA_STAR[family] = builder
    _CONSTANTS[family] = constants


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
    c: Number = 1.0,
    score_scale: Number = 1.0,
    C: np.ndarray | None = None,
    form: str = "tsm",
    tied: bool = True,
    dtype: str = "float64",
    m: int | None = None,
) -> ICRLModel:
    """A model whose parameters are exactly theta* (constructions.md sections 1-3).

    c: gauge / scaling-manifold constant (linear-td: (cP*, Q*/c); sarsa: (cP12*, V21*/c)).
    score_scale: multiplies A* (softmax-td; beta^2 for one-hot x beta features).
    C: preconditioner of Wang's theta* (linear-td). alpha: one step, or one per layer (untied).
    """
    if family == "actor-critic" and family not in THETA_STAR:
        from .. import actor_critic  # registers its construction on first use

        actor_critic.register()
    if family not in THETA_STAR:
        raise UserError(f"no theta* construction for family {family!r} (available: {', '.join(sorted(THETA_STAR))})")
    given = {"c": (c, 1.0), "score_scale": (score_scale, 1.0), "C": (C, None)}
    for name, (value, default) in given.items():
        if name not in _CONSTANTS[family] and not (value is None if default is None else value == default):
            raise UserError(f"{name} does not apply to the {family} theta* (its constants: {', '.join(_CONSTANTS[family]) or 'none'})")
    if c == 0:
        raise UserError("the scale c must be non-zero")
    config = ModelConfig(family=family, d=d, n_layers=n_layers, gamma=gamma, tied=tied, form=form, m=m, dtype=dtype)
    alphas = _alphas(alpha, config.n_layers, tied)
    config = dataclasses.replace(config, alpha=alphas[0])
    constants = {"c": float(c), "score_scale": float(score_scale), "C": None if C is None else np.asarray(C, dtype=np.float64)}
    model = empty_model(config)
    arrays = {}
    for layer in config.stored_layers():
        for name, matrix in THETA_STAR[family](config, alphas[layer], constants).items():
            arrays[f"blocks.{layer}.attn.{name}"] = matrix
    model.load_arrays(arrays)
    origin: dict = {"kind": "theta_star", "alpha": alphas[0]}
    if len(set(alphas)) > 1:
        origin["alphas"] = alphas
    for name in _CONSTANTS[family]:
        value = constants[name]
        origin[name] = value.tolist() if isinstance(value, np.ndarray) else value
    model.origin = origin
    return model
