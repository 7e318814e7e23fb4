"""Builders of small, valid inputs for tests (one place, so tests stay short)."""
from __future__ import annotations

import numpy as np

from icrl_interp import envs


def boyan(batch=8, n_states=6, d=3, gamma=0.9, seed=0, **kw) -> envs.MRPBatch:
    return envs.sample_boyan_chains(batch, n_states, d, gamma, rng=seed, **kw)


def mdps(batch=8, n_states=4, n_actions=3, gamma=0.5, seed=0) -> envs.MDPBatch:
    return envs.sample_tabular_mdps(batch, n_states, n_actions, gamma, rng=seed)


def random_policy(mdp: envs.MDPBatch, seed=0) -> np.ndarray:
    logits = np.random.default_rng(seed).standard_normal(mdp.R.shape)
    return envs.softmax_policy(logits)
