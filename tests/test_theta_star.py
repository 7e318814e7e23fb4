"""theta*: the documented nonzero patterns, and numpy-only forwards of each layer (written here,
independently of the torch models) run with theta* reproduce the reference algorithms exactly."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp import layouts, reference, theta_star
from icrl_interp.errors import UserError

from helpers import boyan, mdps, plain, raises_user, random_policy, td_data


def _support(M: np.ndarray) -> set[tuple[int, int]]:
    return {tuple(ix) for ix in np.argwhere(M != 0)}


# ---------------------------------------------------------- nonzero patterns
def test_linear_td_pattern():
    d = 3
    C = np.arange(1.0, 10.0).reshape(3, 3)
    th = theta_star.linear_td(d, alpha=0.4, C=C)
    P, Q = th["P"], th["Q"]
    assert P.shape == Q.shape == (7, 7)
    assert _support(P) == {(6, 6)} and P[6, 6] == 0.4
    np.testing.assert_array_equal(Q[:3, :3], -C.T)
    np.testing.assert_array_equal(Q[:3, 3:6], C.T)
    Q_rest = Q.copy()
    Q_rest[:3, :6] = 0
    assert not Q_rest.any()
    np.testing.assert_array_equal(theta_star.linear_td(2)["Q"][:2, :4], [[-1, 0, 1, 0], [0, -1, 0, 1]])
    with raises_user("C", "shape"):
        theta_star.linear_td(3, C=np.eye(2))


def test_softmax_td_pattern():
    d = 2
    th = theta_star.softmax_td(d, alpha=0.5, gamma=0.8, score_scale=3.0)
    lay = layouts.softmax_layout(d)
    A, V, Vt = th["A"], th["V"], th["V_target"]
    assert A.shape == V.shape == Vt.shape == (5, 5)
    np.testing.assert_array_equal(A, np.diag([3.0, 3.0, 0, 0, 0]))
    r, t, c = lay.slice("reward").start, lay.slice("target_mem").start, lay.slice("current_mem").start
    assert _support(V) == {(c, r), (c, t), (c, c)}
    np.testing.assert_array_equal(V[c, [r, t, c]], [0.5, 0.5, -0.5])  # signs (+, +, -): R + gamma v' - v
    assert _support(Vt) == {(t, r), (t, t), (t, c)}
    np.testing.assert_allclose(Vt[t, [r, t, c]], [0.4, 0.4, -0.4], atol=1e-15)


def test_sarsa_pattern_and_delta_identity():
    d = 3
    P12, V21 = theta_star.sarsa_blocks(d, alpha=0.7)
    g = np.random.default_rng(0)
    phi, phi_next, r, w = g.standard_normal(d), g.standard_normal(d), g.standard_normal(), g.standard_normal(d)
    x = np.concatenate([phi, 0.6 * phi_next, [r]])
    # x^T P12* [1; w] = delta = r + gamma w.phi+ - w.phi
    assert x @ P12 @ np.concatenate([[1.0], w]) == pytest.approx(r + 0.6 * w @ phi_next - w @ phi, abs=1e-14)
    assert not V21[0].any()  # keeps the '1'
    np.testing.assert_array_equal(V21[1:, :d], 0.7 * np.eye(d))
    assert not V21[1:, d:].any()
    th = theta_star.sarsa(d, alpha=0.7, c=2.0)
    P, V = th["P"], th["V"]
    assert P.shape == V.shape == (3 * d + 2, 3 * d + 2)
    lay = layouts.sarsa_layout(d)
    trans, par = slice(0, lay.slice("reward").stop), slice(lay.slice("param_one").start, lay.d_model)
    np.testing.assert_array_equal(P[trans, par], 2.0 * P12)
    np.testing.assert_array_equal(V[par, trans], V21 / 2.0)
    P_rest, V_rest = P.copy(), V.copy()
    P_rest[trans, par], V_rest[par, trans] = 0, 0
    assert not P_rest.any() and not V_rest.any()  # lazy blocks P11, P21, P22, V11, V12, V22 are zero
    with raises_user("c", "non-zero"):
        theta_star.sarsa(d, c=0.0)


# ---------------------------------------------- numpy forwards, paper orientation
def _wang_layer(Z, P, Q):
    """Z + (1/n) P Z M (Z^T Q Z), M = diag(1, ..., 1, 0): the query column is never a source."""
    n = Z.shape[1] - 1
    M = np.diag(np.r_[np.ones(n), 0.0])
    return Z + (P @ Z @ M @ (Z.T @ Q @ Z)) / n


def test_wang_forward_with_theta_star_runs_batch_td():
    d, n, L, gamma, alpha = 3, 9, 4, 0.85, 0.6
    phi, phi_next, r, phi_q = td_data(batch=5, n=n, d=d, seed=3)
    C = np.eye(d) + 0.4 * np.random.default_rng(4).standard_normal((d, d))
    th = theta_star.linear_td(d, alpha, C)
    prompt = layouts.td_prompt(phi, phi_next, r, phi_q, gamma)
    ref = reference.batch_td(phi, phi_next, r, phi_q, gamma, alpha, L, C)
    reward_row = prompt.layout.slice("reward").start
    for b in range(5):
        Z = prompt.z[b].T.copy()
        for layer in range(L + 1):
            # after layer l: reward row = delta_i(w_l), query cell = -w_l . phi_q
            np.testing.assert_allclose(Z[reward_row, :n], ref.td_errors[b, layer], atol=1e-10)
            assert prompt.layout.readout(Z.T[None])[0, 0] == pytest.approx(ref.query_values[b, layer], abs=1e-10)
            np.testing.assert_array_equal(Z[:reward_row], prompt.z[b].T[:reward_row])  # features untouched
            Z = _wang_layer(Z, th["P"], th["Q"])


def test_wang_forward_gauge():
    d = 2
    phi, phi_next, r, phi_q = td_data(batch=1, n=6, d=d, seed=5)
    Z = layouts.td_prompt(phi, phi_next, r, phi_q, 0.9).z[0].T
    th = theta_star.linear_td(d)
    for c in (3.0, -0.25):  # (cP, Q/c) gives the same forward
        np.testing.assert_allclose(_wang_layer(Z, c * th["P"], th["Q"] / c), _wang_layer(Z, th["P"], th["Q"]), atol=1e-12)


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
    prompt = layouts.softmax_prompt_from_mrp(mrp, traj)
    lay, L, alpha = prompt.layout, 4, 0.7
    th = theta_star.softmax_td(3, alpha=alpha, gamma=mrp.gamma)
    x = mrp.phi[np.arange(4)[:, None], traj.states]
    ref = reference.weighted_softmax_td(x, traj.rewards, mrp.gamma, alpha, L)
    t, c = lay.slice("target_mem").start, lay.slice("current_mem").start
    for b in range(4):
        Z = prompt.z[b].T.copy()
        for layer in range(L + 1):
            v = ref.values[b, layer]
            np.testing.assert_allclose(Z[c], v, atol=1e-10)  # current memory: v_l(S_{k-1}), last column v_l(S_n)
            np.testing.assert_allclose(Z[t, :-1], mrp.gamma * v[1:], atol=1e-10)  # target: gamma v_l(S_k)
            assert Z[t, -1] == 0
            assert lay.readout(Z.T[None])[0, 0] == pytest.approx(v[-1], abs=1e-10)
            Z = _xie_dual_head(Z, th) if form == "dual-head" else _xie_tsm(Z, th, mrp.gamma, lay)


def _lsa_layer(H, P, V):
    """Liang & Lai: H + (1/n) (V H)(H^T P H); no softmax, no mask."""
    n = H.shape[1] - 1
    return H + (V @ H) @ (H.T @ P @ H) / n


def test_lsa_forward_with_theta_star_runs_sarsa():
    mdp = mdps(batch=4, n_states=3, n_actions=2, gamma=0.5, seed=7)
    traj = mdp.sample(random_policy(mdp), 10, rng=7)
    d = 6
    w = np.random.default_rng(7).standard_normal((4, d))
    prompt = layouts.sarsa_prompt_from_mdp(mdp, traj, w)
    lay = prompt.layout
    phi = prompt.z[:, :-1, lay.slice("phi")]
    phi_next = prompt.z[:, :-1, lay.slice("gamma_phi_next")] / mdp.gamma
    expected = reference.sarsa_update(phi, phi_next, traj.rewards, w, mdp.gamma, 0.8)
    for c in (1.0, 2.5, -0.3):  # every point of the scaling manifold gives the same update
        th = theta_star.sarsa(d, alpha=0.8, c=c)
        for b in range(4):
            H = prompt.z[b].T
            out = _lsa_layer(H, th["P"], th["V"])
            np.testing.assert_allclose(lay.readout(out.T[None])[0], expected[b], atol=1e-12)
            assert out[lay.slice("param_one"), -1][0] == pytest.approx(1.0, abs=1e-14)
            np.testing.assert_allclose(out[:, :-1], H[:, :-1], atol=1e-14)  # context columns unchanged


def test_theta_star_helpers_need_matching_shapes():
    with pytest.raises(UserError):
        plain(theta_star.linear_td)(2, 1.0, np.eye(3))
