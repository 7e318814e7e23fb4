"""Linear-attention TD home: the prompt builder puts every quantity in its block, theta* has the documented
nonzero pattern, and a numpy-only forward of Wang's layer (written here, independently of the torch
models) run with theta* reproduces batch TD(0) exactly."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.tasks import layouts, reference
from icrl_interp.core.errors import UserError
from icrl_interp.families import linear_td

from helpers import boyan, mdps, plain, raises_user, random_policy, support, td_data


# ------------------------------------------------------------------ builders
def test_td_prompt_puts_every_quantity_in_its_block():
    phi, phi_next, r, phi_q = td_data(batch=3, n=5, d=2)
    states = np.arange(3 * 6).reshape(3, 6)
    p = linear_td.prompt(phi, phi_next, r, phi_q, 0.8, states)
    lay = p.layout
    assert p.z.shape == (3, 6, 5) and p.n == 5
    # exact: the prompt holds copies, literal zeros and gamma * phi_next, computed as here
    np.testing.assert_array_equal(p.z[:, :5, lay.slice("phi")], phi)
    np.testing.assert_allclose(p.z[:, :5, lay.slice("gamma_phi_next")], 0.8 * phi_next, rtol=0, atol=0)
    np.testing.assert_array_equal(p.z[:, :5, lay.slice("reward")][..., 0], r)
    np.testing.assert_array_equal(p.z[:, 5, lay.slice("phi")], phi_q)
    assert np.all(p.z[:, 5, 2:] == 0)  # query column: gamma phi' and reward are zero
    np.testing.assert_array_equal(p.rewards[:, :5], r)
    assert np.all(p.rewards[:, 5] == 0)
    np.testing.assert_array_equal(p.states, states)
    assert np.all(p.actions == -1)
    assert set(p.labels()) == {"state", "action", "reward"}


def test_td_prompt_from_mrp_labels_and_columns():
    mrp = boyan(batch=4, n_states=6, d=3, gamma=0.7)
    traj = mrp.sample(9, rng=1)
    q = np.array([0, 5, 2, 3])
    p = linear_td.prompt_from_mrp(mrp, traj, q)
    lay = p.layout
    for b in range(4):
        for i in range(9):
            s, s1 = traj.states[b, i], traj.states[b, i + 1]
            col = p.z[b, i]
            np.testing.assert_array_equal(col[lay.slice("phi")], mrp.phi[b, s])  # exact: copies
            np.testing.assert_allclose(col[lay.slice("gamma_phi_next")], 0.7 * mrp.phi[b, s1], atol=1e-15)
            assert col[lay.slice("reward")][0] == mrp.r[b, s] == p.rewards[b, i]
            assert p.states[b, i] == s
        np.testing.assert_array_equal(p.z[b, 9, lay.slice("phi")], mrp.phi[b, q[b]])
        assert p.states[b, 9] == q[b]


def test_prompt_validates_its_inputs():
    phi, phi_next, r, phi_q = td_data(batch=2, n=4, d=3)
    td = plain(linear_td.prompt)
    with raises_user("phi_next", "shape"):
        td(phi, phi_next[:, :3], r, phi_q, 0.9)
    with raises_user("rewards", "shape"):
        td(phi, phi_next, r[:, :3], phi_q, 0.9)
    with raises_user("phi_query", "shape"):
        td(phi, phi_next, r, phi_q[:, :2], 0.9)
    with raises_user("gamma"):
        td(phi, phi_next, r, phi_q, 1.0)
    with raises_user("phi", "NaN"):
        td(np.where(phi > 1, np.nan, phi), phi_next, r, phi_q, 0.9)
    with raises_user("rewards", "NaN"):
        td(phi, phi_next, np.full_like(r, np.inf), phi_q, 0.9)
    with raises_user("states", "shape"):
        td(phi, phi_next, r, phi_q, 0.9, np.zeros((2, 4), dtype=int))


# ---------------------------------------------------------- nonzero patterns
def test_linear_td_pattern():
    d = 3
    C = np.arange(1.0, 10.0).reshape(3, 3)
    th = linear_td.theta_star(d, alpha=0.4, C=C)
    P, Q = th["P"], th["Q"]
    assert P.shape == Q.shape == (7, 7)
    assert support(P) == {(6, 6)} and P[6, 6] == 0.4  # exact: theta* is written entry by entry
    np.testing.assert_array_equal(Q[:3, :3], -C.T)
    np.testing.assert_array_equal(Q[:3, 3:6], C.T)
    Q_rest = Q.copy()
    Q_rest[:3, :6] = 0
    assert not Q_rest.any()
    np.testing.assert_array_equal(linear_td.theta_star(2)["Q"][:2, :4], [[-1, 0, 1, 0], [0, -1, 0, 1]])
    with raises_user("C", "shape"):
        linear_td.theta_star(3, C=np.eye(2))


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
    th = linear_td.theta_star(d, alpha, C)
    prompt = linear_td.prompt(phi, phi_next, r, phi_q, gamma)
    ref = reference.batch_td(phi, phi_next, r, phi_q, gamma, alpha, L, C)
    reward_row = prompt.layout.slice("reward").start
    for b in range(5):
        Z = prompt.z[b].T.copy()
        for layer in range(L + 1):
            # after layer l: reward row = delta_i(w_l), query cell = -w_l . phi_q
            np.testing.assert_allclose(Z[reward_row, :n], ref.td_errors[b, layer], atol=1e-10)
            assert prompt.layout.readout(Z.T[None])[0, 0] == pytest.approx(ref.query_values[b, layer], abs=1e-10)
            # features untouched, exactly: P*'s rows above the reward row are literal zeros, so they add 0
            np.testing.assert_array_equal(Z[:reward_row], prompt.z[b].T[:reward_row])
            Z = _wang_layer(Z, th["P"], th["Q"])


def test_wang_forward_gauge():
    d = 2
    phi, phi_next, r, phi_q = td_data(batch=1, n=6, d=d, seed=5)
    Z = linear_td.prompt(phi, phi_next, r, phi_q, 0.9).z[0].T
    th = linear_td.theta_star(d)
    for c in (3.0, -0.25):  # (cP, Q/c) gives the same forward
        np.testing.assert_allclose(_wang_layer(Z, c * th["P"], th["Q"] / c), _wang_layer(Z, th["P"], th["Q"]), atol=1e-12)


def test_theta_star_helpers_need_matching_shapes():
    with pytest.raises(UserError):
        plain(linear_td.theta_star)(2, 1.0, np.eye(3))
