"""Builders of small, valid inputs for tests (one place, so tests stay short)."""
from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

from icrl_interp.tasks import envs
from icrl_interp.core.errors import UserError


def boyan(batch=8, n_states=6, d=3, gamma=0.9, seed=0, **kw) -> envs.MRPBatch:
    return envs.sample_boyan_chains(batch, n_states, d, gamma, rng=seed, **kw)


def mdps(batch=8, n_states=4, n_actions=3, gamma=0.5, seed=0) -> envs.MDPBatch:
    return envs.sample_tabular_mdps(batch, n_states, n_actions, gamma, rng=seed)


def random_policy(mdp: envs.MDPBatch, seed=0) -> np.ndarray:
    logits = np.random.default_rng(seed).standard_normal(mdp.R.shape)
    return envs.softmax_policy(logits)


def repeated(mrp: envs.MRPBatch, copies: int) -> envs.MRPBatch:
    """The first task of `mrp` repeated `copies` times (i.i.d. runs of one chain, vectorized)."""
    rep = lambda a: np.repeat(a[:1], copies, axis=0)  # noqa: E731
    return envs.MRPBatch(P=rep(mrp.P), r=rep(mrp.r), phi=rep(mrp.phi), gamma=mrp.gamma)


def td_data(batch=6, n=12, d=3, seed=0):
    """Random transitions (phi, phi_next, rewards, phi_query) for batch TD / SARSA."""
    g = np.random.default_rng(seed)
    return (g.standard_normal((batch, n, d)), g.standard_normal((batch, n, d)),
            g.standard_normal((batch, n)), g.standard_normal((batch, d)))


# ----------------------------------------------------------- validation
def plain(fn):
    """`fn` without the test-only jaxtyping/beartype wrapper.

    pytest instruments the package (pyproject addopts), so a wrongly shaped argument
    would be refused by the shape checker before our own validation runs; users run
    without it, so input validation is tested on the undecorated function. Bound methods
    stay bound (to their instance, or to their class for a classmethod).
    """
    raw = inspect.unwrap(fn)
    owner = getattr(fn, "__self__", None)
    if raw is not fn and owner is not None and not hasattr(raw, "__self__"):
        return raw.__get__(owner)
    return raw


def build_plain(cls, **fields):
    """Construct a dataclass through its undecorated __init__ (see `plain`)."""
    obj = cls.__new__(cls)
    plain(cls.__init__)(obj, **fields)
    return obj


def raises_user(*words: str):
    """pytest.raises(UserError) whose one-line message mentions every word (case-insensitive)."""
    pattern = "".join(f"(?=.*{re.escape(w)})" for w in words)
    return pytest.raises(UserError, match=re.compile(pattern, re.IGNORECASE))


def se_tolerance(p: np.ndarray, counts: np.ndarray, k: float = 5.0) -> np.ndarray:
    """k binomial standard errors of an empirical frequency of p out of `counts` draws."""
    return k * np.sqrt(p * (1.0 - p) / np.maximum(counts, 1)) + 1e-12


def float_tol(dtype=np.float64, scale=1.0, k: float = 64.0) -> float:
    """How far a computed float may sit from the value it has in exact arithmetic: k units of rounding
    (eps of `dtype`, a numpy or torch dtype) at `scale`, the magnitude of what it was computed from (a
    number, or an array: its largest |entry|). BLAS/LAPACK kernels, their thread counts, numpy's SIMD
    dispatch of exp/log/tanh and torch's CPU capability each round differently, so a result that is 0
    (or 1, or equal to another computed one) in exact arithmetic is that only to within this; k = 64
    covers the short reductions of these tests, while the bugs they guard against move the value by
    many orders more (docs/development.md#floats-in-tests)."""
    import torch

    eps = torch.finfo(dtype).eps if isinstance(dtype, torch.dtype) else np.finfo(dtype).eps
    return float(k * eps * np.max(np.abs(np.asarray(scale, dtype=np.float64)), initial=0.0))


def support(M: np.ndarray) -> set[tuple[int, int]]:
    """Indices of the nonzero entries of a matrix (exact: for matrices the code builds entry by entry,
    where an absent entry is a literal 0, never a rounded one)."""
    return {tuple(ix) for ix in np.argwhere(M != 0)}


def theta_star_setup(n: int):
    """(Wang's θ* with d = 3 and two layers, its format-2 checkpoint config on Boyan chains with `n`
    transitions and 6 states, the shipped linear-td probe spec): the recorder tests' small model."""
    from icrl_interp.models import checkpoint
    from icrl_interp.recording import probe_spec
    from icrl_interp.models import theta_star_model

    model = theta_star_model("linear-td", d=3, n_layers=2, alpha=0.7)
    cfg = checkpoint.make_config(model.config, {"task": {"kind": "boyan", "n": n, "n_states": 6},
                                                "origin": model.origin})
    return model, cfg, probe_spec.shipped_spec("linear-td")


# ------------------------------------------------------------------ a user's own model (bring your own model)
from torch import nn  # noqa: E402 - only the model below needs torch

D_IN = 9  # linear-td prompts with d = 4: rows phi, gamma phi', r


class Block(nn.Module):
    def __init__(self, d, heads, dropout=0.0):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True, dropout=dropout)
        self.drop = nn.Dropout(dropout)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        h = self.ln(x)
        a, _ = self.attn(h, h, h, need_weights=True, average_attn_weights=False)
        x = x + self.drop(a)
        return x + self.mlp(x)


class Net(nn.Module):
    """Embedding inside, residual width 16 (not the prompt layout's), a readout head."""

    def __init__(self, layers=2, heads=2, dropout=0.0, d=16, d_in=D_IN):
        super().__init__()
        self.embed = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, 1)

    def forward(self, z):
        x = self.embed(z)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


ROLES = {"resid_post": "blocks.{layer}", "pattern": "blocks.{layer}.attn#1", "readout": ["ln_f", "head"]}
TASK = {"d": 4, "n": 8, "n_layers": 2}
