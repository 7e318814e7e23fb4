"""Convergence analyzers: value error against depth, distance to the teacher, and Wang's VD/SS/IWS.

Array-level functions on float64 numpy arrays, batched over tasks (leading axis).
Definitions: docs/concepts.md, sections Linear-attention TD(0) (VD, SS, IWS) and Softmax TD
(value error).
"""
from __future__ import annotations

import math

import numpy as np
from jaxtyping import Float, Int

from ..core.errors import UserError
from ..tasks.layouts import PromptLayout

Array = np.ndarray


def state_values(
    v_pos: Float[Array, "batch pos"], states: Int[Array, "batch pos"], n_states: int
) -> Float[Array, "batch s"]:
    """Per-state value estimates: the mean over the positions holding each state (NaN if none)."""
    B = v_pos.shape[0]
    ok = states >= 0
    flat = (np.arange(B)[:, None] * n_states + states)[ok]
    sums = np.bincount(flat, weights=v_pos[ok], minlength=B * n_states).reshape(B, n_states)
    counts = np.bincount(flat, minlength=B * n_states).reshape(B, n_states)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / counts


def value_errors(
    v_hat: Float[Array, "batch s"], v_true: Float[Array, "batch s"], mu: Float[Array, "batch s"] | None = None
) -> tuple[Float[Array, " batch"], Float[Array, " batch"]]:
    """Per task: ||v_hat - v_pi||_inf and the mu-weighted RMS error, over the states v_hat covers (non-NaN).

    The RMS renormalises mu over the covered states: sqrt(sum mu e^2 / sum mu); uniform if mu is None.
    """
    err = v_hat - v_true
    ok = np.isfinite(err)
    inf = np.where(ok, np.abs(err), -np.inf).max(-1)
    w = np.ones_like(v_true) if mu is None else np.asarray(mu, dtype=np.float64)
    w = np.where(ok, w, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rms = np.sqrt((w * np.where(ok, err, 0.0) ** 2).sum(-1) / w.sum(-1))
    return np.where(ok.any(-1), inf, np.nan), rms


def teacher_distance(
    out: Float[Array, "batch k"], teacher: Float[Array, "batch k"]
) -> tuple[Float[Array, " batch"], Float[Array, " batch"]]:
    """Per task: ||out - teacher||_2 and the same relative to ||teacher||_2 (LSA: output vs w_SARSA)."""
    dist = np.linalg.norm(out - teacher, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return dist, dist / np.linalg.norm(teacher, axis=-1)


def _batched_cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def wls_weights(
    phi: Float[Array, "batch s d"], d_pi: Float[Array, "batch s"], v: Float[Array, "batch s"]
) -> Float[Array, "batch d"]:
    """w = (X^T D X)^{-1} X^T D v: the d_pi-weighted least-squares linear fit of v on the features."""
    XtD = np.swapaxes(phi, -1, -2) * d_pi[:, None, :]
    lhs = XtD @ phi
    rhs = (XtD @ v[..., None])[..., 0]
    try:
        return np.linalg.solve(lhs, rhs[..., None])[..., 0]
    except np.linalg.LinAlgError:
        return (np.linalg.pinv(lhs) @ rhs[..., None])[..., 0]


def vd_ss_iws(
    v_tf: Float[Array, "batch s"],
    v_td: Float[Array, "batch s"],
    grad_tf: Float[Array, "batch s d"],
    grad_td: Float[Array, "batch s d"],
    phi: Float[Array, "batch s d"],
    d_pi: Float[Array, "batch s"],
    w_td: Float[Array, "batch d"],
) -> dict[str, np.ndarray]:
    """Wang et al.'s metrics per task, each state's phi(s) put in the query of one context.

    VD  = sum_s d_pi(s) (v_tf(s) - v_td(s))^2
    SS  = sum_s d_pi(s) cos(grad_{phi_q} v_tf(s), grad_{phi_q} v_td(s))
    IWS = cos(w_tf, w_td), w_tf = (X^T D X)^{-1} X^T D v_tf (weighted least squares)
    """
    return {
        "VD": (d_pi * (v_tf - v_td) ** 2).sum(-1),
        "SS": (d_pi * _batched_cos(grad_tf, grad_td)).sum(-1),
        "IWS": _batched_cos(wls_weights(phi, d_pi, v_tf), w_td),
    }


def linear_td_query_weights(
    contexts: list[Float[Array, "batch n D"]],
    P: list[Float[Array, "D D"]],
    Q: list[Float[Array, "D D"]],
    layout: PromptLayout,
) -> Float[Array, "batch d"]:
    """The implicit weight w_tf of a linear-attention TD model: v_tf(phi_q) = w_tf . phi_q.

    The query column is never a source (mask M), so given the context columns Z_l of
    each layer the query column evolves linearly: z_q <- (I + (1/n) P_l C_l Q_l) z_q with
    C_l = sum_{i<n} z_i z_i^T. The query starts as [phi_q; 0; 0], so
    v_tf = readout_sign * e_readout^T T_{L-1} ... T_0 [phi_q; 0; 0] is linear in phi_q.
    `contexts[l]` holds the n context columns entering layer l.
    """
    if not (len(contexts) == len(P) == len(Q)) or not contexts:
        raise UserError("need one context, P and Q per layer")
    B, n, D = contexts[0].shape
    phi = layout.slice("phi")
    row = np.zeros(D)
    row[layout.slice(layout.readout_block)] = layout.readout_sign
    # propagate the readout row backwards: r^T T_{L-1} ... T_0, as a [B, D] row per task
    r = np.broadcast_to(row, (B, D)).copy()
    for Z, P_l, Q_l in reversed(list(zip(contexts, P, Q))):
        C = np.einsum("bnd,bne->bde", Z, Z)
        r = r + np.einsum("bd,de,bef,fg->bg", r, P_l, C, Q_l) / n
    return r[:, phi]


def _log_rate(layers, errors) -> float | None:
    """exp of the least-squares slope of log(error) on layer: the error's factor per layer."""
    if len(layers) < 2:
        return None
    x, y = np.asarray(layers, dtype=np.float64), np.log(np.asarray(errors, dtype=np.float64))
    x = x - x.mean()
    return float(np.exp((x * (y - y.mean())).sum() / (x * x).sum()))


def depth_summary(layers, errors, reference=None) -> dict | None:
    """How a value-error curve falls with depth (the layers' value errors, None where absent).
    first / last: the error at the first and last layer that has one; ratio = last / first;
    rate: the geometric factor per layer, exp of the least-squares slope of log(error) on the layer
    (< 1: the error falls; needs two positive errors); decreasing: the share of consecutive layers
    where it falls. With `reference` (the reference algorithm's error at the same depths, None where
    it has no step), the same rate of the reference over the layers both have (`reference_rate`) and
    last_over_reference = the model's last error / the reference's at that layer (1: as converged as
    the algorithm at that depth). None when no layer has an error.
    """
    pts = [(int(l), float(e)) for l, e in zip(layers, errors) if e is not None and math.isfinite(e)]
    if not pts:
        return None
    ls, es = [l for l, _ in pts], [e for _, e in pts]
    pos = [(l, e) for l, e in pts if e > 0]
    steps = list(zip(es, es[1:]))
    out = {"layers": ls, "first": es[0], "last": es[-1],
           "ratio": es[-1] / es[0] if es[0] > 0 else None,
           "rate": _log_rate([l for l, _ in pos], [e for _, e in pos]),
           "decreasing": sum(b < a for a, b in steps) / len(steps) if steps else None,
           "reference_rate": None, "last_over_reference": None}
    if reference is not None:
        ref = {int(l): float(r) for l, r in zip(layers, reference) if r is not None and math.isfinite(r)}
        both = [(l, ref[l]) for l, _ in pos if ref.get(l, 0.0) > 0]
        out["reference_rate"] = _log_rate([l for l, _ in both], [r for _, r in both])
        last = ref.get(ls[-1])
        out["last_over_reference"] = es[-1] / last if last else None
    return out
