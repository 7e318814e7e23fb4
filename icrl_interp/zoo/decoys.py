"""Decoys: models of value tasks that run no RL algorithm, yet correlate with one (docs/zoo.md, "Decoys").

Each computes its output from the prompt's context at *every* layer (`teachers.ZooModule`'s residual stream,
the value in row OUT of the last column), reading the context columns of its input stream, so an edit of
layer l's context columns (the reward row above all) reaches the output through layer l + 1: a causal test
that erases "the TD-error direction" at an early layer moves these models too, which is what they are
for. The verdict must answer "none fits" or "reward regression (no bootstrapping)" for every one of them.

The immediate-reward decoy is TD with gamma' = 0 (`teachers.LinearTeacher`), listed in the zoo's registry.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .teachers import ZooModule


class Decoy(ZooModule):
    """A value model whose every layer writes `value(x)` (a function of the context) to the output row.
    `strength` scales it (1; 0 in the random-init copy)."""

    def __init__(self, layout, gamma: float, n_layers: int = 2):
        super().__init__(layout, gamma, n_layers, 0, True)
        self.strength = nn.Parameter(torch.tensor(1.0, dtype=torch.float64), requires_grad=False)

    def value(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def layer(self, l: int, x: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        out[:, -1, self.OUT] = self.strength.to(x.dtype) * self.value(x)
        return out


class LastReward(Decoy):
    """r_{n-1}: the reward of the last context transition."""

    def value(self, x):
        return self.transitions(x)[2][:, -1]


class MeanReward(Decoy):
    """mean_i r_i / (1 - gamma): the value of a state if every reward were the context's mean."""

    def value(self, x):
        return self.transitions(x)[2].mean(1) / (1.0 - self.gamma)


class DiscountedSum(Decoy):
    """sum_i gamma^i r_i over the context in order: the return of the context's first state, whatever the query."""

    def value(self, x):
        r = self.transitions(x)[2]
        powers = torch.tensor(self.gamma, dtype=r.dtype, device=r.device) ** torch.arange(r.shape[1], device=r.device)
        return (r * powers).sum(1)


class NearestReward(Decoy):
    """The mean reward of the context columns whose features are nearest to the query's (all ties within
    `TIE` of the nearest distance): a lookup of the query state's rewards, no bootstrapping, no fit."""

    TIE = 1e-9

    def value(self, x):
        phi, _, r = self.transitions(x)
        dist = ((phi - self.block(x, "phi", context=False)[:, None]) ** 2).sum(-1)
        near = (dist <= dist.min(1, keepdim=True).values + self.TIE).to(r.dtype)
        return (near * r).sum(1) / near.sum(1)


def summary(x: torch.Tensor, D: int) -> torch.Tensor:
    """[B, 2D] the input features of a prompt (or stream): its mean context column and its last column."""
    return torch.cat([x[:, :-1, :D].mean(1), x[:, -1, :D]], -1)


class InputRidge(Decoy):
    """A ridge map from the prompt's summary (mean context column, last column) to the true value of the query
    state, fitted on training prompts (`fit_ridge`): what a model that learns the value from summary
    statistics of its input computes (the verdict's own input baseline)."""

    def __init__(self, layout, gamma: float, coef: np.ndarray, intercept: float, n_layers: int = 2):
        super().__init__(layout, gamma, n_layers)
        self.coef = nn.Parameter(torch.as_tensor(np.asarray(coef, dtype=np.float64)), requires_grad=False)
        self.intercept = nn.Parameter(torch.tensor(float(intercept), dtype=torch.float64), requires_grad=False)

    def value(self, x):
        return summary(x, self.D) @ self.coef.to(x.dtype) + self.intercept.to(x.dtype)


def fit_ridge(z: np.ndarray, target: np.ndarray, penalty: float = 1e-3) -> tuple[np.ndarray, float]:
    """(coef [2D], intercept) of the ridge regression of `target` [N] on the summaries of prompts z [N, pos, D]
    (centred, penalty on the coefficients only), in float64."""
    S = summary(torch.as_tensor(np.asarray(z, dtype=np.float64)), z.shape[-1]).numpy()
    mu, t_mu = S.mean(0), float(np.mean(target))
    Sc = S - mu
    coef = np.linalg.solve(Sc.T @ Sc + penalty * np.eye(S.shape[1]), Sc.T @ (np.asarray(target) - t_mu))
    return coef, t_mu - float(mu @ coef)
