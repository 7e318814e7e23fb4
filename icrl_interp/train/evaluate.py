"""Held-out evaluation of a trained model: the family recipe's `evaluate` (see its training module).

The metrics themselves come from `icrl_interp.analyzers` (VD/SS/IWS, manifold fit, P/Q summaries,
sign patterns, population kernel); each family's training module draws held-out tasks, runs the
model on them and picks what a run reports in final_metrics.json.
"""
from __future__ import annotations

import numpy as np

from .config import TrainConfig
from .recipe import recipe_of

EVAL_STREAM = 2
"""Held-out tasks of a run come from numpy.random.default_rng([seed, EVAL_STREAM]) (training uses stream 1)."""


def evaluate(model, cfg: TrainConfig, rng: np.random.Generator) -> dict:
    """The family's held-out metrics of `model`, on tasks drawn from `rng`."""
    return recipe_of(cfg).evaluate(model, cfg, rng)


def evaluate_run(model, cfg: TrainConfig) -> dict:
    """`evaluate` on the run's own evaluation stream (the same tasks for every checkpoint of a run)."""
    return evaluate(model, cfg, np.random.default_rng([cfg.seed, EVAL_STREAM]))
