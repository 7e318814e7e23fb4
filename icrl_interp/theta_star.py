"""The explicit parameters theta* of each construction, as float64 numpy matrices.

Matrices act on the d_model axis (column vectors in the papers' orientation);
`constructions.md` sections 1-3 give the formulas. The torch models load these
into ordinary parameters, so a theta* model is just a model.
"""
from __future__ import annotations

import numpy as np

from . import layouts
from .errors import UserError


def linear_td(d: int, alpha: float = 1.0, C: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Wang et al.: P* = alpha e_{2d+1} e_{2d+1}^T, Q* = [[-C^T, C^T, 0], [0, 0, 0], [0, 0, 0]]."""
    lay = layouts.td_layout(d)
    D = lay.d_model
    C = np.eye(d) if C is None else np.asarray(C, dtype=np.float64)
    if C.shape != (d, d):
        raise UserError(f"preconditioner C has shape {C.shape}, expected ({d}, {d})")
    P = np.zeros((D, D))
    P[D - 1, D - 1] = alpha
    Q = np.zeros((D, D))
    Q[lay.slice("phi"), lay.slice("phi")] = -C.T
    Q[lay.slice("phi"), lay.slice("gamma_phi_next")] = C.T
    return {"P": P, "Q": Q}


def _delta_row(lay: layouts.PromptLayout) -> np.ndarray:
    """Row vector reading R + target - current (= delta_k under the construction)."""
    row = np.zeros(lay.d_model)
    row[lay.slice("reward")] = 1.0
    row[lay.slice("target_mem")] = 1.0
    row[lay.slice("current_mem")] = -1.0
    return row


def softmax_td(d: int, alpha: float = 1.0, gamma: float = 0.9, score_scale: float = 1.0) -> dict[str, np.ndarray]:
    """Xie et al.: A* = score_scale * diag(I_d, 0, 0, 0); V* = alpha e_current (1, 1, -1) on (R, target, current).

    `V_target` is the second head of the dual-head form: gamma * alpha e_target (1, 1, -1).
    """
    lay = layouts.softmax_layout(d)
    D = lay.d_model
    A = np.zeros((D, D))
    A[lay.slice("x"), lay.slice("x")] = score_scale * np.eye(d)
    V = np.zeros((D, D))
    V[lay.slice("current_mem").start] = alpha * _delta_row(lay)
    V_target = np.zeros((D, D))
    V_target[lay.slice("target_mem").start] = gamma * alpha * _delta_row(lay)
    return {"A": A, "V": V, "V_target": V_target}


def sarsa_blocks(d: int, alpha: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(P12*, V21*) of Liang & Lai: P12* maps [1; w] to (-w, w, 1); V21* = [[0], [alpha I_d, 0, 0]]."""
    P12 = np.zeros((2 * d + 1, d + 1))
    P12[:d, 1:] = -np.eye(d)
    P12[d : 2 * d, 1:] = np.eye(d)
    P12[2 * d, 0] = 1.0
    V21 = np.zeros((d + 1, 2 * d + 1))
    V21[1:, :d] = alpha * np.eye(d)
    return P12, V21


def sarsa(d: int, alpha: float = 1.0, c: float = 1.0) -> dict[str, np.ndarray]:
    """Liang & Lai: P = [[0, c P12*], [0, 0]], V = [[0, 0], [c^-1 V21*, 0]]; lazy blocks zero."""
    if c == 0:
        raise UserError("the scaling-manifold constant c must be non-zero")
    D = 3 * d + 2
    P12, V21 = sarsa_blocks(d, alpha)
    P = np.zeros((D, D))
    P[: 2 * d + 1, 2 * d + 1 :] = c * P12
    V = np.zeros((D, D))
    V[2 * d + 1 :, : 2 * d + 1] = V21 / c
    return {"P": P, "V": V}


def for_config(config: dict, names) -> dict[str, np.ndarray]:
    """theta* of a checkpoint config's family, under the given parameter names.

    Each name's last component (`blocks.0.attn.P` -> `P`) picks the matrix; names
    without a counterpart, and families without a construction, are left out.
    """
    family, d = config.get("family"), int(config.get("d", 0) or 0)
    alpha = float(config.get("alpha", 1.0) or 1.0)
    if family == "linear-td":
        mats = linear_td(d, alpha)
    elif family == "softmax-td":
        origin = config.get("origin") or {}
        mats = softmax_td(d, alpha, float(config.get("gamma", 0.9)), float(origin.get("score_scale", 1.0)))
    elif family == "sarsa":
        mats = sarsa(d, alpha, 1.0)
    elif family == "actor-critic" and config.get("m"):
        from . import actor_critic  # numpy-only construction module

        mats = actor_critic.theta_star(d, int(config["m"]), *actor_critic.steps_of(config))
    else:
        return {}
    return {name: mats[name.rsplit(".", 1)[-1]] for name in names if name.rsplit(".", 1)[-1] in mats}
