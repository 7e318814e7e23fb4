"""Edits of a layer's features along a direction (docs/causal.md, "What is measured"): every edit is
x -> x - c (b.x - m) + v (`Edit`): the erasures (mean- and zero-ablation of a projection:
`projection_edit`; LEACE: `leace_edit`), steering (v), and the random directions of the control, bent
to erase as much variance as the TD erasure (`random_directions`, `variance_matched`). Plain numpy: the
edit is applied to a torch tensor inside the forward pass by `sites.Runner`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import UserError


@dataclass(frozen=True)
class Edit:
    """x -> x - c (b.x - m) + v on the feature vector x of every context column.

    Erasures set (c, b, m) with b.c = 1 (a rank-one projection: mean-ablation c = b = u, m = mean;
    zero-ablation m = 0; LEACE an oblique one); steering sets v. Either part may be absent."""

    c: np.ndarray | None = None
    """Direction that is removed (None: no erasure)."""
    b: np.ndarray | None = None
    """Functional that reads the part removed (b.c = 1)."""
    m: float = 0.0
    """Value b.x is set to."""
    v: np.ndarray | None = None
    """Vector added (None: no steering)."""

    def apply(self, x):
        """The edited features (numpy or torch, last axis = features)."""
        if self.c is not None:
            c, b = self._as(x, self.c), self._as(x, self.b)
            x = x - ((x @ b) - self.m)[..., None] * c
        if self.v is not None:
            x = x + self._as(x, self.v)
        return x

    @staticmethod
    def _as(x, a: np.ndarray):
        if isinstance(x, np.ndarray):
            return np.asarray(a, dtype=np.float64)
        import torch

        return torch.as_tensor(np.asarray(a), dtype=x.dtype, device=x.device)


def projection_edit(u: np.ndarray, m: float = 0.0) -> Edit:
    """Set the projection on the unit direction u to m: x -> x - u (u.x - m) (m = mean: mean-ablation)."""
    u = unit(u, "direction")
    return Edit(c=u, b=u, m=float(m))


def leace_edit(cov_x: np.ndarray, cov_xz: np.ndarray, mean_x: np.ndarray) -> Edit:
    """LEACE for one scalar concept z: x -> x - W^+ P_{W Cov(x,z)} W (x - mean_x), W = (Cov(x)^{1/2})^+.

    With c = Cov(x, z) (which lies in the range of Cov(x)), W^+ P W = c (Cov(x)^+ c)^T / (c^T Cov(x)^+ c):
    a rank-one oblique projection that leaves the mean unchanged and makes Cov(edited x, z) = 0."""
    cov_x = np.asarray(cov_x, dtype=np.float64)
    c = np.asarray(cov_xz, dtype=np.float64)
    pinv = pinv_psd(cov_x)
    q = pinv @ c
    denom = float(c @ q)
    if not denom > 0.0:
        raise UserError("LEACE: the concept has no covariance with the features at this site (nothing to erase)")
    b = q / denom
    return Edit(c=c, b=b, m=float(b @ np.asarray(mean_x, dtype=np.float64)))


MATCH_POWER = 30.0
"""Largest |p| of the control's Cov(x)^p g; beyond it the erased variance is that of an eigenvector."""


def erased_variance(cov: np.ndarray, edit: Edit) -> float:
    """Variance a rank-one erasure removes, E||x - edit(x)||^2 = ||c||^2 b.Cov.b (mean-ablation along a unit
    u: u.Cov.u; LEACE of a concept with cross-covariance c: ||c||^2 / c.Cov^+.c)."""
    c, b = np.asarray(edit.c, dtype=np.float64), np.asarray(edit.b, dtype=np.float64)
    return float(c @ c * (b @ cov @ b))


def variance_matched(cov: np.ndarray, g: np.ndarray, target: float, leace: bool = False) -> np.ndarray:
    """Cov^p g with p chosen so that its erasure removes `target` variance: the unit direction's u.Cov.u
    (mean- or zero-ablation) or, with `leace`, the LEACE eraser's ||c||^2 / c.Cov^+.c for c = Cov^p g.

    Both are means of Cov's eigenvalues weighted by lambda^{2p} (g.e)^2 (LEACE: by lambda^{2p-1} (g.e)^2,
    a harmonic mean), so they grow with p: p is found by bisection in [-MATCH_POWER, MATCH_POWER]. p = 0
    is g itself (mean-ablation), p = 1 the eraser of the raw concept g.x (LEACE). A target beyond the
    reachable range gives the nearest end (an eigenvector's variance). Only the range of Cov counts."""
    lam, U = np.linalg.eigh((cov + cov.T) / 2)
    keep = lam > 1e-10 * max(float(lam.max(initial=0.0)), 1e-300)
    lam, U = lam[keep], U[:, keep]
    a = U.T @ np.asarray(g, dtype=np.float64)
    if lam.size == 0 or not float(a @ a) > 0:
        raise UserError("the features do not vary along the random direction: no variance to erase")
    log_l = np.log(lam / lam.max())
    with np.errstate(divide="ignore"):
        log_a2 = np.log(a ** 2)

    def variance(p: float) -> float:
        e = log_a2 + 2 * p * log_l
        w = np.exp(e - e.max())  # the weights up to a constant, without overflow
        return float(w.sum() / (w @ (1 / lam))) if leace else float(w @ lam / w.sum())

    lo, hi = -MATCH_POWER, MATCH_POWER
    for _ in range(200):
        mid = (lo + hi) / 2
        if variance(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13:
            break
    p = (lo + hi) / 2
    return U @ (np.exp(p * log_l - np.max(p * log_l)) * a)  # Cov^p g up to a positive constant


def pinv_psd(S: np.ndarray, rtol: float = 1e-10) -> np.ndarray:
    """Pseudo-inverse of a symmetric positive semi-definite matrix (eigenvalues below rtol * max dropped)."""
    lam, U = np.linalg.eigh((S + S.T) / 2)
    keep = lam > rtol * max(float(lam.max(initial=0.0)), 1e-300)
    return (U[:, keep] / lam[keep]) @ U[:, keep].T


def unit(u, what: str) -> np.ndarray:
    """u / ||u|| as a flat float64 vector; a zero or non-finite u is refused, naming `what` it is."""
    u = np.asarray(u, dtype=np.float64).ravel()
    norm = float(np.linalg.norm(u))
    if not np.isfinite(norm) or norm == 0.0:
        raise UserError(f"the {what} is zero or not finite: nothing to erase or steer along")
    return u / norm


def random_directions(width: int, draws: int, seed: int, layer: int = 0) -> np.ndarray:
    """[draws, width] unit vectors, uniform on the sphere, a pure function of (seed, layer)."""
    g = np.random.default_rng([int(seed), int(layer), 0xCA05A1]).standard_normal((int(draws), int(width)))
    return g / np.linalg.norm(g, axis=1, keepdims=True)
