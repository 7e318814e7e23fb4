"""Known answers of the candidate algorithms (icrl_interp.verdicts.candidates) against independent float64 code."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.verdicts import candidates as C
from icrl_interp.tasks import envs, reference
from icrl_interp.core.errors import UserError


def boyan(batch=6, n=12, d=3, gamma=0.8, seed=0):
    rng = np.random.default_rng(seed)
    mrp = envs.sample_boyan_chains(batch, 6, d, gamma, rng, "random", 1.0, "uniform")
    traj = mrp.sample(n, rng)
    phi = mrp.phi[np.arange(batch)[:, None], traj.states]
    q = rng.integers(0, 6, size=batch)
    return C.Transitions(phi[:, :-1], phi[:, 1:], traj.rewards, gamma, phi_query=mrp.phi[np.arange(batch), q]), traj


def random_tr(batch=4, n=5, d=3, gamma=0.7, seed=1, **kw):
    rng = np.random.default_rng(seed)
    phi = rng.standard_normal((batch, n + 1, d))
    return C.Transitions(phi[:, :-1], phi[:, 1:], rng.standard_normal((batch, n)), gamma,
                         phi_query=rng.standard_normal((batch, d)), **kw)


def test_td0_is_the_reference_batch_td():
    tr, _ = boyan()
    got = C.td_lambda(tr, 0.7, 4)
    ref = reference.batch_td(tr.phi, tr.phi_next, tr.rewards, tr.phi_query, tr.gamma, 0.7, 4)
    np.testing.assert_allclose(got.outputs[..., 0], ref.query_values, atol=1e-12)
    np.testing.assert_allclose(got.internals["td_error"], ref.td_errors, atol=1e-12)
    assert np.abs(got.outputs[:, 2]).max() > 1e-3  # not trivially zero


def test_td_lambda_zero_is_td0_and_others_differ():
    tr = random_tr()
    a = C.CANDIDATES["td0"].run(tr, {"alpha": 0.5}, 3).outputs
    b = C.td_lambda(tr, 0.5, 3, lam=0.0).outputs
    np.testing.assert_allclose(a, b, atol=1e-14)
    assert np.abs(C.td_lambda(tr, 0.5, 3, lam=0.5).outputs[:, 1:] - a[:, 1:]).max() > 1e-3


def test_td_one_update_is_the_truncated_monte_carlo_update_plus_the_bootstrap_tail():
    """sum_i delta_i e_i (lambda = 1) = sum_j phi_j (G_j + gamma^{n-j} w.phi'_{n-1} - w.phi_j): the telescoping
    identity, which a wrong discount power or trace index breaks."""
    tr = random_tr(n=6)
    w = np.random.default_rng(3).standard_normal((tr.shape[0], tr.shape[2]))
    tr1 = C.Transitions(tr.phi, tr.phi_next, tr.rewards, tr.gamma, w0=w, phi_query=tr.phi_query)
    step = C.td_lambda(tr1, 1.0, 1, lam=1.0)
    n = tr.shape[1]
    G = tr.returns()
    tail = tr.gamma ** (n - np.arange(n))[None, :] * np.einsum("bd,bd->b", w, tr.phi_next[:, -1])[:, None]
    err = G + tail - np.einsum("bnd,bd->bn", tr.phi, w)
    w1 = w + np.einsum("bn,bnd->bd", err, tr.phi) / n
    np.testing.assert_allclose(step.outputs[:, 1, 0], np.einsum("bd,bd->b", w1, tr.phi_query), atol=1e-10)


def test_returns_by_hand():
    tr = C.Transitions(np.zeros((1, 3, 1)), np.zeros((1, 3, 1)), np.array([[1.0, 2.0, 4.0]]), 0.5)
    np.testing.assert_allclose(tr.returns(), [[1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4, 4.0]])


def test_lstd_is_the_fixed_point_of_batch_td():
    tr, _ = boyan(batch=4, n=40, d=3, gamma=0.5)
    w = C.lstd_weights(tr)
    n = tr.shape[1]
    # A w = b: the expected TD update vanishes at LSTD
    update = np.einsum("bn,bnd->bd", C.td_error(tr, w), tr.phi) / n
    assert np.abs(update).max() < 1e-10
    # and batch TD(0) with a small step converges to it
    long = reference.batch_td(tr.phi, tr.phi_next, tr.rewards, tr.phi_query, tr.gamma, 0.5, 4000)
    np.testing.assert_allclose(long.w[:, -1], w, atol=1e-8)
    out = C.lstd(tr, {}, 3)
    assert out.closed_form and np.allclose(out.outputs[:, 0], out.outputs[:, 3])


def test_mc_regression_converges_to_least_squares():
    tr = random_tr(batch=3, n=10, d=3)
    G = tr.returns()
    ls = np.stack([np.linalg.lstsq(tr.phi[b], G[b], rcond=None)[0] for b in range(3)])
    out = C.mc_regression(tr, 0.5, 3000)
    np.testing.assert_allclose(out.outputs[:, -1, 0], np.einsum("bd,bd->b", ls, tr.phi_query), atol=1e-8)
    np.testing.assert_allclose(out.internals["return"][:, 0], G)


def test_residual_gradient_descends_the_squared_td_error():
    tr = random_tr()
    w = np.random.default_rng(5).standard_normal((tr.shape[0], tr.shape[2]))
    tr1 = C.Transitions(tr.phi, tr.phi_next, tr.rewards, tr.gamma, w0=w, phi_query=tr.phi_query)
    alpha, n = 1e-3, tr.shape[1]
    loss = lambda v: 0.5 * (C.td_error(tr, v) ** 2).sum(1) / n  # noqa: E731
    grad = np.zeros_like(w)
    for j in range(w.shape[1]):
        e = np.zeros_like(w)
        e[:, j] = 1e-6
        grad[:, j] = (loss(w + e) - loss(w - e)) / 2e-6
    w1_expected = w - alpha * grad
    out = C.residual_gradient(tr1, alpha, 1)
    np.testing.assert_allclose(out.outputs[:, 1, 0], np.einsum("bd,bd->b", w1_expected, tr.phi_query), atol=1e-9)


def control_tr(n_actions=1, seed=0, policy=None):
    rng = np.random.default_rng(seed)
    B, n, S = 3, 8, 4
    d = S * n_actions
    table = np.eye(d).reshape(S, n_actions, d)
    s = rng.integers(0, S, size=(B, n + 1))
    a = rng.integers(0, n_actions, size=(B, n + 1))
    phi = table[s, a]
    pol = np.full((B, n, n_actions), 1.0 / n_actions) if policy is None else policy
    return C.Transitions(phi[:, :-1], phi[:, 1:], rng.standard_normal((B, n)), 0.6,
                         w0=rng.standard_normal((B, d)), next_options=table[s[:, 1:]], next_policy=pol)


def test_one_action_mdps_make_sarsa_expected_sarsa_and_q_learning_one():
    tr = control_tr(n_actions=1)
    outs = [C.CANDIDATES[c].run(tr, {"alpha": 0.8}, 3).outputs for c in ("batch_sarsa", "expected_sarsa", "q_learning")]
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-13)
    np.testing.assert_allclose(outs[0], outs[2], atol=1e-13)


def test_q_learning_bootstraps_on_the_max_and_expected_sarsa_on_the_mean():
    tr = control_tr(n_actions=3)
    w = tr.w0
    q_next = np.einsum("bnad,bd->bna", tr.next_options, w)
    n = tr.shape[1]
    for name, boot in (("q_learning", q_next.max(-1)), ("expected_sarsa", q_next.mean(-1))):
        delta = tr.rewards + tr.gamma * boot - np.einsum("bnd,bd->bn", tr.phi, w)
        w1 = w + 0.4 / n * np.einsum("bn,bnd->bd", delta, tr.phi)
        got = C.CANDIDATES[name].run(tr, {"alpha": 0.4}, 1)
        np.testing.assert_allclose(got.outputs[:, 1], w1, atol=1e-12)
        np.testing.assert_allclose(got.internals["td_error"][:, 0], delta, atol=1e-12)
    sarsa = C.CANDIDATES["batch_sarsa"].run(tr, {"alpha": 0.4}, 1).outputs
    assert np.abs(sarsa - C.CANDIDATES["q_learning"].run(tr, {"alpha": 0.4}, 1).outputs).max() > 1e-3


def test_actor_critic_is_the_reference_update_and_keeps_lam_elsewhere():
    rng = np.random.default_rng(2)
    base = control_tr(n_actions=2)
    m = 5
    scores = rng.standard_normal(base.shape[:2] + (m,))
    lam = rng.standard_normal((base.shape[0], m))
    tr = C.Transitions(base.phi, base.phi_next, base.rewards, base.gamma, w0=base.w0, scores=scores, lam0=lam)
    got = C.actor_critic(tr, 0.3, 0.7, 1).outputs[:, 1]
    w1, lam1 = reference.actor_critic_update(tr.phi, tr.phi_next, tr.rewards, scores, tr.w0, lam, tr.gamma, 0.3, 0.7)
    np.testing.assert_allclose(got, np.concatenate([w1, lam1], -1), atol=1e-13)
    sarsa = C.CANDIDATES["batch_sarsa"].run(tr, {"alpha": 0.7}, 1).outputs[:, 1]
    np.testing.assert_allclose(sarsa[:, : tr.shape[2]], w1, atol=1e-13)  # the critic is SARSA
    np.testing.assert_allclose(sarsa[:, tr.shape[2]:], lam, atol=0)  # a critic alone leaves lam


def test_softmax_and_tabular_candidates_are_the_references():
    rng = np.random.default_rng(4)
    states = rng.integers(0, 3, size=(2, 7))
    x = np.eye(3)[states] * 2.0
    r = rng.standard_normal((2, 6))
    tr = C.Transitions(x[:, :-1], x[:, 1:], r, 0.9, x=x, states=states)
    got = C.softmax_td(tr, 0.5, 4.0, 3)
    ref = reference.weighted_softmax_td(x, r, 0.9, 0.5, 3, A11=4.0 * np.eye(3))
    np.testing.assert_allclose(got.outputs[..., 0], ref.values[:, :, -1], atol=1e-14)
    np.testing.assert_allclose(got.internals["td_error"], ref.td_errors, atol=1e-14)
    tab = C.tabular_td(tr, 0.5, 3)
    np.testing.assert_allclose(tab.outputs[..., 0], reference.tabular_td(states, r, 0.9, 0.5, 3).values[:, :, -1])
    # the linear candidates on a trajectory output the value of S_n
    lin = C.td_lambda(tr, 0.5, 2)
    w = lin.outputs  # [B, 3, 1]
    assert w.shape == (2, 3, 1)


def test_fit_recovers_the_step_size_and_the_step():
    tr, _ = boyan(batch=20, n=15)
    alpha = float(C.ALPHA_GRID[40])
    target = C.td_lambda(tr, alpha, 5).outputs[:, 3]
    (f,) = C.fit(C.CANDIDATES["td0"], tr, target[None], 5)
    assert f.step == 3 and f.hyper["alpha"] == alpha and f.sse < 1e-20  # alpha: the grid's own value, a copy
    assert f.hyper["gamma"] == tr.gamma  # exact: the task's gamma is on the gamma' grid
    (g,) = C.fit(C.CANDIDATES["mc_regression"], tr, target[None], 5)
    assert g.sse > 1e-6 * g.sst  # another algorithm cannot match it exactly
    (h,) = C.fit(C.CANDIDATES["lstd"], tr, target[None], 5)
    assert h.step is None and set(h.hyper) == {"gamma"}  # LSTD fits only its discount


def test_applicability_says_why():
    tr = random_tr()
    ok, why = C.applicable(tr)
    names = {c.name for c in ok}
    assert {"td0", "td_lambda_0.5", "mc_regression", "lstd", "residual_gradient"} <= names
    assert "batch_sarsa" not in names and "q_learning" in why and "softmax_td" in why
    ok, why = C.applicable(control_tr(n_actions=2))
    assert {"batch_sarsa", "expected_sarsa", "q_learning"} <= {c.name for c in ok} and "td0" in why
    assert "actor_critic" in why
    with pytest.raises(UserError, match="unknown candidate"):
        C.applicable(tr, ["nope"])
