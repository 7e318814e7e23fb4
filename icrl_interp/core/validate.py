"""Small input checks shared by environments, builders and reference algorithms."""
from __future__ import annotations

import numpy as np

from .errors import UserError


def finite(name: str, array) -> np.ndarray:
    """Return `array` as an ndarray, refusing NaN or Inf with a message naming it."""
    array = np.asarray(array)
    if array.dtype.kind in "fc" and not np.all(np.isfinite(array)):
        raise UserError(f"{name} contains NaN or Inf")
    return array


def shape(name: str, array, expected: tuple) -> np.ndarray:
    """Check `array.shape` against `expected` (None matches any size)."""
    array = np.asarray(array)
    ok = array.ndim == len(expected) and all(e is None or e == s for e, s in zip(expected, array.shape))
    if not ok:
        want = "(" + ", ".join("*" if e is None else str(e) for e in expected) + ")"
        raise UserError(f"{name} has shape {tuple(array.shape)}, expected {want}")
    return array


def states(name: str, array, expected: tuple, n_states: int) -> np.ndarray:
    """Integer state indices of shape `expected`, each in 0..n_states-1 (no silent wrap-around)."""
    array = finite(name, shape(name, array, expected))
    integral = array.dtype.kind in "iu" or (array.dtype.kind == "f" and np.all(array == np.round(array)))
    if array.size and (not integral or array.min() < 0 or array.max() >= n_states):
        raise UserError(f"{name} must be integer states in 0..{n_states - 1}, got {array.ravel()[:8].tolist()}")
    return array.astype(np.int64)


def count(name: str, value, minimum: int = 1) -> int:
    """An integer size (number of tasks, states, steps) of at least `minimum`."""
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise UserError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def discount(gamma: float) -> float:
    """A discount factor must lie in [0, 1)."""
    gamma = float(gamma)
    if not (0.0 <= gamma < 1.0):
        raise UserError(f"gamma must lie in [0, 1), got {gamma}")
    return gamma


def stochastic(name: str, matrix, atol: float = 1e-8) -> np.ndarray:
    """Rows (last axis) must be non-negative and sum to 1."""
    matrix = finite(name, matrix)
    if np.any(matrix < -atol) or not np.allclose(matrix.sum(-1), 1.0, atol=atol):
        raise UserError(f"{name} is not row-stochastic (rows must be non-negative and sum to 1)")
    return matrix


def rng(seed_or_rng) -> np.random.Generator:
    """A numpy Generator from a seed, or the Generator itself (never global state)."""
    if isinstance(seed_or_rng, np.random.Generator):
        return seed_or_rng
    return np.random.default_rng(seed_or_rng)
