"""Linear TD-error probes: ridge regression from activations at a context column to delta_k.

The probes stream: each (layer, hook) keeps sufficient statistics (counts, sums,
X^T X, X^T y, y^T y) per fold, so a recording larger than memory is read once,
in chunks. Ridge with an intercept solved from these statistics is exactly
scikit-learn's `Ridge(alpha, fit_intercept=True)` (tested to 1e-10).

Splits are by *task* (prompt index), never by column: prompt i belongs to one fold
through a counter-based hash of i // 2, so the split does not depend on the chunk
size. On large recordings a hashed subset of the tasks (whole pairs) can be used:
a ridge on <= 16 features is saturated long before hundreds of thousands of samples. Folds 0..K-1 are training folds (used to pick alpha by K-fold CV), fold K is
the held-out test set on which R^2 is reported.

Shuffled-label control: the targets of prompt i are replaced by those of prompt
i XOR 1 (its pair partner: a different, independently drawn task; partners always
share a fold), so features and targets come from different tasks. Its held-out
R^2 should be ~0. With an odd number of prompts the last one has no partner and
is left out of the probes.

All statistics of a fold live in one Gram matrix G = Z^T Z with
Z = [X - x0, y - y0, y_shuffled - y0, 1]: one BLAS call per update, and the
control shares X^T X with the probe.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from jaxtyping import Bool, Float, Int

from ..errors import UserError

Array = np.ndarray

ALPHA_GRID = np.logspace(-10, 2, 13)
"""Ridge penalties tried, relative to the mean feature variance times the sample count."""


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _pair_uniform(index: np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per prompt pair (i // 2), a pure function of (pair, seed)."""
    h = _splitmix64((np.asarray(index, dtype=np.uint64) // np.uint64(2)) ^ _splitmix64(np.array([seed]))[0])
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def task_subset(index: Int[Array, " batch"], seed: int, fraction: float) -> Bool[Array, " batch"]:
    """Prompts (whole pairs) kept for the probes when only `fraction` of the tasks is needed."""
    if fraction >= 1.0:
        return np.ones(np.shape(index), dtype=bool)
    return _pair_uniform(index, seed + 0x5EED) < fraction


def task_folds(index: Int[Array, " batch"], seed: int, test_fraction: float, k: int) -> Int[Array, " batch"]:
    """Fold of each prompt: k (test) with probability test_fraction, else uniform in 0..k-1."""
    if not 0.0 < test_fraction < 1.0:
        raise UserError(f"probe test fraction must lie in (0, 1), got {test_fraction}")
    if k < 2:
        raise UserError(f"probe cross-validation needs at least 2 folds, got {k}")
    u = _pair_uniform(index, seed)
    test = u < test_fraction
    train_fold = np.minimum((u - test_fraction) / (1 - test_fraction) * k, k - 1).astype(np.int64)
    return np.where(test, k, train_fold)


def partner(index: Int[Array, " batch"]) -> Int[Array, " batch"]:
    """Pair partner of each prompt for the shuffled control."""
    return np.asarray(index) ^ 1


@dataclass
class RidgeStats:
    """Sufficient statistics of (X, y) as the Gram matrix of Z = [X - x0, y - y0, 1]."""

    n_features: int
    """Number of features F."""
    G: np.ndarray = field(default=None)
    """(F + 2) x (F + 2) Gram matrix."""
    x0: np.ndarray = field(default=None)
    """Origin of the features (a fixed shift for numerical stability)."""
    y0: float = 0.0
    """Origin of the targets."""

    def __post_init__(self):
        if self.G is None:
            self.G = np.zeros((self.n_features + 2, self.n_features + 2))
        if self.x0 is None:
            self.x0 = np.zeros(self.n_features)

    def set_origin(self, x0: np.ndarray, y0: float) -> None:
        self.x0, self.y0 = np.asarray(x0, dtype=np.float64), float(y0)

    def update(self, X: Float[Array, "m f"], y: Float[Array, " m"]) -> None:
        F = self.n_features
        Z = np.empty((X.shape[0], F + 2))
        Z[:, :F] = X
        Z[:, :F] -= self.x0
        Z[:, F] = y
        Z[:, F] -= self.y0
        Z[:, F + 1] = 1.0
        self.G += Z.T @ Z

    def __add__(self, other: "RidgeStats") -> "RidgeStats":
        return RidgeStats(self.n_features, self.G + other.G, self.x0, self.y0)

    def __sub__(self, other: "RidgeStats") -> "RidgeStats":
        return RidgeStats(self.n_features, self.G - other.G, self.x0, self.y0)

    @property
    def n(self) -> float:
        return float(self.G[-1, -1])

    def centred(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(X_c^T X_c, X_c^T y_c, y_c^T y_c) about the sample means."""
        F, G, n = self.n_features, self.G, self.n
        mx, my = G[:F, -1] / n, G[F, -1] / n
        return G[:F, :F] - n * np.outer(mx, mx), G[:F, F] - n * mx * my, float(G[F, F] - n * my * my)

    def fit(self, alpha: float) -> tuple[Float[Array, " f"], float]:
        """Ridge with intercept: (coef, intercept) in the original (unshifted) coordinates."""
        if self.n < 2:
            raise UserError("too few training samples for a ridge probe")
        cxx, cxy, _ = self.centred()
        coef = np.linalg.solve(cxx + alpha * np.eye(self.n_features), cxy)
        return coef, self._intercept(coef)

    def _intercept(self, coef: np.ndarray) -> float:
        F, G, n = self.n_features, self.G, self.n
        mx, my = G[:F, -1] / n + self.x0, G[F, -1] / n + self.y0
        return float(my - mx @ coef)

    def sse(self, coef: np.ndarray, intercept: float) -> float:
        """Sum of squared residuals of y - X coef - intercept over these samples: w^T G w with
        w = (-coef, 1, -b0) and b0 the intercept in shifted coordinates."""
        b0 = intercept - self.y0 + self.x0 @ coef
        w = np.concatenate([-coef, [1.0, -b0]])
        return max(float(w @ self.G @ w), 0.0)

    def sst(self) -> float:
        return max(self.centred()[2], 0.0)

    def r2(self, coef: np.ndarray, intercept: float) -> float:
        sst = self.sst()
        return math.nan if sst == 0.0 or self.n == 0 else 1.0 - self.sse(coef, intercept) / sst


def select_alpha(folds: list[RidgeStats]) -> tuple[float, RidgeStats]:
    """The penalty with the least K-fold CV error (leaving out one training fold at a time) and
    the pooled training statistics. Penalties are ALPHA_GRID times the mean feature variance
    times the sample count; one eigendecomposition per fold serves every penalty."""
    train = folds[0]
    for st in folds[1:]:
        train = train + st
    if train.n < 2:
        raise UserError("too few training tasks for a ridge probe")
    unit = max(float(np.trace(train.centred()[0])) / train.n_features, 1e-300)
    alphas = unit * ALPHA_GRID
    cv = np.zeros(len(alphas))
    for held in folds:
        rest = train - held
        if held.n == 0 or rest.n < 2:
            continue
        cxx, cxy, _ = rest.centred()
        lam, U = np.linalg.eigh(cxx)
        proj = U.T @ cxy
        for i, a in enumerate(alphas):
            coef = U @ (proj / (np.maximum(lam, 0.0) + a))
            cv[i] += held.sse(coef, rest._intercept(coef))
    best = int(np.argmin(cv))  # the first (smallest) penalty among ties
    return float(alphas[best]), train


def fold_grouping(fold: Int[Array, " batch"], keep: Bool[Array, " batch"], k: int):
    """(order, bounds): prompts sorted by fold, fold f = order[bounds[f]:bounds[f+1]]; prompts
    not kept (no partner for the shuffled control) sort last and are left out."""
    key = np.where(keep, fold, k + 1)
    order = np.argsort(key, kind="stable")
    return order, np.searchsorted(key[order], np.arange(k + 2))


@dataclass
class ProbeAccumulator:
    """Fold-wise statistics of one probe (one layer, one hook) and of its shuffled control."""

    n_features: int
    """Features per sample."""
    k: int = 5
    """Training folds for choosing alpha; fold k is the held-out test set."""
    G: np.ndarray = field(default=None)
    x0: np.ndarray = field(default=None)
    y0: float = 0.0

    def __post_init__(self):
        self.G = np.zeros((self.k + 1, self.n_features + 3, self.n_features + 3))

    def update(self, X: Float[Array, "batch cols f"], y: Float[Array, "batch cols"],
               y_shuffled: Float[Array, "batch cols"], fold: Int[Array, " batch"], grouping=None) -> None:
        """Add samples (one per prompt and column). Prompts whose y_shuffled is NaN are skipped.

        `grouping` = fold_grouping(fold, keep, k) may be passed in when several probes
        share a chunk, so the prompts are sorted by fold once.
        """
        F = self.n_features
        if self.x0 is None:
            self.x0 = X.reshape(-1, F).mean(0, dtype=np.float64)
            self.y0 = float(np.mean(y, dtype=np.float64))
        if grouping is None:
            grouping = fold_grouping(fold, np.isfinite(y_shuffled).all(-1), self.k)
        order, bounds = grouping
        cols = X.shape[1]
        rows = order[: bounds[-1]]
        Z = np.empty((rows.size * cols, F + 3))  # rows sorted by fold, so each fold is a slice
        Z[:, :F] = X[rows].reshape(-1, F)
        Z[:, :F] -= self.x0
        Z[:, F] = y[rows].ravel()
        Z[:, F + 1] = y_shuffled[rows].ravel()
        Z[:, F : F + 2] -= self.y0
        Z[:, F + 2] = 1.0
        for f in range(self.k + 1):
            part = Z[bounds[f] * cols : bounds[f + 1] * cols]
            if part.shape[0]:
                self.G[f] += part.T @ part

    def _stats(self, shuffled: bool) -> list[RidgeStats]:
        F = self.n_features
        idx = list(range(F)) + [F + 1 if shuffled else F, F + 2]
        return [RidgeStats(F, g[np.ix_(idx, idx)].copy(), self.x0, self.y0) for g in self.G]

    def result(self) -> dict:
        """Held-out R^2 (fold k), the chosen alpha, the coefficients and the shuffled control's R^2."""
        out = {}
        for shuffled in (False, True):
            stats = self._stats(shuffled)
            test = stats[self.k]
            if test.n == 0:
                raise UserError("no held-out tasks for the probe: record more prompts")
            alpha, train = select_alpha(stats[: self.k])
            coef, b = train.fit(alpha)
            if shuffled:
                out["r2_shuffled"] = test.r2(coef, b)
            else:
                out.update({"r2": test.r2(coef, b), "alpha": alpha, "coef": coef, "intercept": b,
                            "n_train": int(train.n), "n_test": int(test.n)})
        return out
