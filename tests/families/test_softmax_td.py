"""Softmax TD home: the prompt builder, theta*'s documented nonzero pattern, and numpy-only forwards of
Xie et al.'s layer (dual-head and TSM forms) run with theta* reproduce weighted softmax TD exactly."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.tasks import layouts, reference
from icrl_interp.core.errors import UserError
from icrl_interp.families import softmax_td

from helpers import boyan, mdps, plain, raises_user, random_policy, support, td_data


def test_softmax_prompt_from_mrp_labels_and_columns():
    mrp = boyan(batch=3, n_states=5, d=2)
    traj = mrp.sample(7, rng=2)
    p = softmax_td.prompt_from_mrp(mrp, traj)
    lay = p.layout
    assert p.z.shape == (3, 8, 5)
    for b in range(3):
        for k in range(8):  # 0-based column k holds x(S_k), and R_{k+1} = r(S_k) for k < n
            s = traj.states[b, k]
            np.testing.assert_array_equal(p.z[b, k, lay.slice("x")], mrp.phi[b, s])
            reward = mrp.r[b, s] if k < 7 else 0.0
            assert p.z[b, k, lay.slice("reward")][0] == reward == p.rewards[b, k]
            assert p.states[b, k] == s
    # exact: the memories start as literal zeros; the other entries are copies
    assert np.all(p.z[:, :, lay.slice("target_mem")] == 0) and np.all(p.z[:, :, lay.slice("current_mem")] == 0)


def test_prompt_validates_its_inputs():
    soft = plain(softmax_td.prompt)
    with raises_user("rewards", "shape"):
        soft(np.zeros((2, 5, 3)), np.zeros((2, 5)))
    with raises_user("x", "NaN"):
        soft(np.full((2, 5, 3), np.nan), np.zeros((2, 4)))


def test_softmax_td_pattern():
    d = 2
    th = softmax_td.theta_star(d, alpha=0.5, gamma=0.8, score_scale=3.0)
    lay = softmax_td.layout(d)
    A, V, Vt = th["A"], th["V"], th["V_target"]
    assert A.shape == V.shape == Vt.shape == (5, 5)
    np.testing.assert_array_equal(A, np.diag([3.0, 3.0, 0, 0, 0]))  # exact: theta* is written entry by entry
    r, t, c = lay.slice("reward").start, lay.slice("target_mem").start, lay.slice("current_mem").start
    assert support(V) == {(c, r), (c, t), (c, c)}
    np.testing.assert_array_equal(V[c, [r, t, c]], [0.5, 0.5, -0.5])  # signs (+, +, -): R + gamma v' - v
    assert support(Vt) == {(t, r), (t, t), (t, c)}
    np.testing.assert_allclose(Vt[t, [r, t, c]], [0.4, 0.4, -0.4], atol=1e-15)


def _softmax_attention(Z, A):
    """Kernel softmax over sources i of z_i^T A z_j, with the last column masked as a source."""
    S = Z.T @ A @ Z
    S[-1, :] = -np.inf
    S -= S.max(axis=0, keepdims=True)
    E = np.exp(S)
    return E / E.sum(axis=0, keepdims=True)


def _shift(Y):
    """Y Pi with Pi[k+1, k] = 1: column k takes column k+1, the last column becomes 0."""
    out = np.zeros_like(Y)
    out[:, :-1] = Y[:, 1:]
    return out


def _xie_dual_head(Z, th):
    K = _softmax_attention(Z, th["A"])
    return Z + th["V"] @ Z @ K + _shift(th["V_target"] @ Z @ K)


def _xie_tsm(Z, th, gamma, lay):
    K = _softmax_attention(Z, th["A"])
    Zh = Z + th["V"] @ Z @ K
    t, c = lay.slice("target_mem").start, lay.slice("current_mem").start
    U, W = np.eye(Z.shape[0]), np.zeros((Z.shape[0], Z.shape[0]))
    U[t, t] = 0.0
    W[t, c] = gamma
    return U @ Zh + _shift(W @ Zh)


@pytest.mark.parametrize("form", ["dual-head", "tsm"])
def test_xie_forward_with_theta_star_runs_weighted_softmax_td(form):
    mrp = boyan(batch=4, n_states=5, d=3, gamma=0.8, seed=6)
    traj = mrp.sample(12, rng=6)
    prompt = softmax_td.prompt_from_mrp(mrp, traj)
    lay, L, alpha = prompt.layout, 4, 0.7
    th = softmax_td.theta_star(3, alpha=alpha, gamma=mrp.gamma)
    x = mrp.phi[np.arange(4)[:, None], traj.states]
    ref = reference.weighted_softmax_td(x, traj.rewards, mrp.gamma, alpha, L)
    t, c = lay.slice("target_mem").start, lay.slice("current_mem").start
    for b in range(4):
        Z = prompt.z[b].T.copy()
        for layer in range(L + 1):
            v = ref.values[b, layer]
            np.testing.assert_allclose(Z[c], v, atol=1e-10)  # current memory: v_l(S_{k-1}), last column v_l(S_n)
            np.testing.assert_allclose(Z[t, :-1], mrp.gamma * v[1:], atol=1e-10)  # target: gamma v_l(S_k)
            assert Z[t, -1] == 0  # exact: nothing writes there (row t of V* and of U is literal zeros)
            assert lay.readout(Z.T[None])[0, 0] == pytest.approx(v[-1], abs=1e-10)
            Z = _xie_dual_head(Z, th) if form == "dual-head" else _xie_tsm(Z, th, mrp.gamma, lay)
