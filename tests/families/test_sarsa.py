"""SARSA home: the prompt builder, theta*'s documented nonzero pattern and the delta identity, and a
numpy-only LSA layer run with theta* reproduces the batch SARSA step exactly."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.tasks import layouts, reference
from icrl_interp.core.errors import UserError
from icrl_interp.families import sarsa

from helpers import boyan, mdps, plain, raises_user, random_policy, support, td_data


def test_sarsa_prompt_from_mdp_labels_and_columns():
    mdp = mdps(batch=3, n_states=4, n_actions=2, gamma=0.6)
    traj = mdp.sample(random_policy(mdp), 6, rng=3)
    w = np.random.default_rng(0).standard_normal((3, 8))
    p = sarsa.prompt_from_mdp(mdp, traj, w)
    lay = p.layout
    assert p.z.shape == (3, 7, 3 * 8 + 2)
    eye = np.eye(8)
    for b in range(3):
        for i in range(6):
            s, a = traj.states[b, i], traj.actions[b, i]
            s1, a1 = traj.states[b, i + 1], traj.actions[b, i + 1]
            col = p.z[b, i]
            # exact: the prompt holds copies and literal 0s and 1s
            np.testing.assert_array_equal(col[lay.slice("phi")], eye[s * 2 + a])
            np.testing.assert_allclose(col[lay.slice("gamma_phi_next")], 0.6 * eye[s1 * 2 + a1], atol=1e-15)
            assert col[lay.slice("reward")][0] == mdp.R[b, s, a] == p.rewards[b, i]
            assert col[lay.slice("param_one")][0] == 0 and np.all(col[lay.slice("w")] == 0)
            assert (p.states[b, i], p.actions[b, i]) == (s, a)
        last = p.z[b, 6]
        assert np.all(last[: 2 * 8 + 1] == 0) and last[lay.slice("param_one")][0] == 1.0
        np.testing.assert_array_equal(last[lay.slice("w")], w[b])
        assert (p.states[b, 6], p.actions[b, 6], p.rewards[b, 6]) == (-1, -1, 0)


def test_prompt_validates_its_inputs():
    phi, phi_next, r, phi_q = td_data(batch=2, n=4, d=3)
    sarsa_prompt = plain(sarsa.prompt)
    with raises_user("w", "shape"):
        sarsa_prompt(phi, phi_next, r, np.zeros((2, 2)), 0.5)
    with raises_user("w", "NaN"):
        sarsa_prompt(phi, phi_next, r, np.full((2, 3), np.nan), 0.5)
    with raises_user("gamma"):
        sarsa_prompt(phi, phi_next, r, np.zeros((2, 3)), -0.5)
    with raises_user("actions", "shape"):
        sarsa_prompt(phi, phi_next, r, np.zeros((2, 3)), 0.5, None, np.zeros((2, 3), dtype=int))


def test_sarsa_pattern_and_delta_identity():
    d = 3
    P12, V21 = sarsa.theta_star_blocks(d, alpha=0.7)
    g = np.random.default_rng(0)
    phi, phi_next, r, w = g.standard_normal(d), g.standard_normal(d), g.standard_normal(), g.standard_normal(d)
    x = np.concatenate([phi, 0.6 * phi_next, [r]])
    # x^T P12* [1; w] = delta = r + gamma w.phi+ - w.phi
    assert x @ P12 @ np.concatenate([[1.0], w]) == pytest.approx(r + 0.6 * w @ phi_next - w @ phi, abs=1e-14)
    assert not V21[0].any()  # keeps the '1'
    np.testing.assert_array_equal(V21[1:, :d], 0.7 * np.eye(d))  # exact: alpha times 0 or 1
    assert not V21[1:, d:].any()
    th = sarsa.theta_star(d, alpha=0.7, c=2.0)
    P, V = th["P"], th["V"]
    assert P.shape == V.shape == (3 * d + 2, 3 * d + 2)
    lay = sarsa.layout(d)
    trans, par = slice(0, lay.slice("reward").stop), slice(lay.slice("param_one").start, lay.d_model)
    np.testing.assert_array_equal(P[trans, par], 2.0 * P12)  # exact: scaling by a power of 2
    np.testing.assert_array_equal(V[par, trans], V21 / 2.0)
    P_rest, V_rest = P.copy(), V.copy()
    P_rest[trans, par], V_rest[par, trans] = 0, 0
    assert not P_rest.any() and not V_rest.any()  # lazy blocks P11, P21, P22, V11, V12, V22 are zero
    with raises_user("c", "non-zero"):
        sarsa.theta_star(d, c=0.0)


def _lsa_layer(H, P, V):
    """Liang & Lai: H + (1/n) (V H)(H^T P H); no softmax, no mask."""
    n = H.shape[1] - 1
    return H + (V @ H) @ (H.T @ P @ H) / n


def test_lsa_forward_with_theta_star_runs_sarsa():
    mdp = mdps(batch=4, n_states=3, n_actions=2, gamma=0.5, seed=7)
    traj = mdp.sample(random_policy(mdp), 10, rng=7)
    d = 6
    w = np.random.default_rng(7).standard_normal((4, d))
    prompt = sarsa.prompt_from_mdp(mdp, traj, w)
    lay = prompt.layout
    phi = prompt.z[:, :-1, lay.slice("phi")]
    phi_next = prompt.z[:, :-1, lay.slice("gamma_phi_next")] / mdp.gamma
    expected = reference.sarsa_update(phi, phi_next, traj.rewards, w, mdp.gamma, 0.8)
    for c in (1.0, 2.5, -0.3):  # every point of the scaling manifold gives the same update
        th = sarsa.theta_star(d, alpha=0.8, c=c)
        for b in range(4):
            H = prompt.z[b].T
            out = _lsa_layer(H, th["P"], th["V"])
            np.testing.assert_allclose(lay.readout(out.T[None])[0], expected[b], atol=1e-12)
            assert out[lay.slice("param_one"), -1][0] == pytest.approx(1.0, abs=1e-14)
            np.testing.assert_allclose(out[:, :-1], H[:, :-1], atol=1e-14)  # context columns unchanged
