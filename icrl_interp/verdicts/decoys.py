"""Decoy explanations: what a model that runs no RL algorithm could compute from the prompt instead, and
that a winning candidate must beat (docs/verdict.md, "Decoy explanations").

Each is one number per prompt read off its transitions (value tasks: the output is one value); the verdict
fits a scale and an offset on the training tasks (so the scale of a copied reward or of 1/(1 - gamma) is not
held against it) and scores the held-out R^2 of the update like a candidate's:

* ``last_reward``: the reward of the last context column, r_{n-1};
* ``mean_reward``: the mean context reward over (1 - gamma), the value of a state whose reward is the mean;
* ``discounted_sum``: sum_i gamma^i r_i, the context's rewards discounted in their order;
* ``nearest_state``: the mean reward of the context columns whose state (features) equals the query's (a
  lookup of the query state's rewards; the mean context reward where no column matches).
"""
from __future__ import annotations

import numpy as np

from .candidates import Transitions

NAMES = ("last_reward", "mean_reward", "discounted_sum", "nearest_state")


def features(tr: Transitions) -> dict[str, np.ndarray]:
    """name -> [B] each decoy's number per prompt; {} where the output is not one value (control tasks)."""
    if tr.control:
        return {}
    r = tr.rewards
    n = r.shape[1]
    mean = r.mean(1)
    query = tr.phi_query if tr.phi_query is not None else tr.phi_next[:, -1]  # S_n on a trajectory
    same = np.all(tr.phi == query[:, None], -1)  # [B, n]: exact equality: the states are identifiable
    hits = same.sum(1)
    nearest = np.where(hits > 0, (r * same).sum(1) / np.maximum(hits, 1), mean)
    return {
        "last_reward": r[:, -1],
        "mean_reward": mean / (1.0 - tr.gamma) if tr.gamma < 1 else mean,
        "discounted_sum": r @ tr.gamma ** np.arange(n),
        "nearest_state": nearest,
    }


def fit_predict(f: np.ndarray, y: np.ndarray, train: np.ndarray) -> np.ndarray:
    """[N, k] the least-squares map a f + b of the feature f [N] to y [N, k], fitted on the `train` rows."""
    X = np.stack([f, np.ones_like(f)], 1)
    coef = np.linalg.lstsq(X[train], y[train], rcond=None)[0]
    return X @ coef
