"""Reference algorithms vs hand-worked cases, explicit loops and their own fixed points."""
from __future__ import annotations

import math

import numpy as np

from icrl_interp.tasks import envs, reference

from helpers import boyan, plain, raises_user, td_data


# --------------------------------------------------------------- batch TD(0)
def test_batch_td_hand_worked():
    # d = 1, n = 2: phi = (1, 2), phi' = (2, 1), r = (1, 0), gamma = 0.5, alpha = 1, query phi = 3.
    # gamma phi' - phi = (0, -1.5);  w1 = (1/2)(1*1 + 0*2) = 0.5;  delta(w1) = (1, -0.75);
    # w2 = 0.5 + (1/2)(1*1 - 0.75*2) = 0.25;  delta(w2) = (1, -0.375).
    A = np.array
    tr = reference.batch_td(A([[[1.0], [2.0]]]), A([[[2.0], [1.0]]]), A([[1.0, 0.0]]), A([[3.0]]), 0.5, 1.0, 2)
    np.testing.assert_allclose(tr.w[0, :, 0], [0.0, 0.5, 0.25], atol=1e-15)
    np.testing.assert_allclose(tr.td_errors[0], [[1.0, 0.0], [1.0, -0.75], [1.0, -0.375]], atol=1e-15)
    np.testing.assert_allclose(tr.query_values[0], [0.0, 1.5, 0.75], atol=1e-15)


def _batch_td_loop(phi, phi_next, r, phi_q, gamma, alpha, L, C):
    """Batch TD(0) written as explicit per-sample loops."""
    B, n, d = phi.shape
    ws, deltas = np.zeros((B, L + 1, d)), np.zeros((B, L + 1, n))
    for b in range(B):
        w = np.zeros(d)
        for l in range(L + 1):
            ws[b, l] = w
            acc = np.zeros(d)
            for i in range(n):
                deltas[b, l, i] = r[b, i] + gamma * w @ phi_next[b, i] - w @ phi[b, i]
                acc += deltas[b, l, i] * phi[b, i]
            w = w + alpha / n * (C @ acc)
    return ws, deltas, ws @ phi_q[:, :, None]


def test_batch_td_matches_an_explicit_loop_with_a_nonsymmetric_preconditioner():
    phi, phi_next, r, phi_q = td_data(batch=8, n=10, d=3, seed=1)
    C = np.eye(3) + 0.3 * np.random.default_rng(2).standard_normal((3, 3))
    tr = reference.batch_td(phi, phi_next, r, phi_q, 0.9, 0.3, 4, C)
    ws, deltas, vq = _batch_td_loop(phi, phi_next, r, phi_q, 0.9, 0.3, 4, C)
    np.testing.assert_allclose(tr.w, ws, atol=1e-12)
    np.testing.assert_allclose(tr.td_errors, deltas, atol=1e-12)
    np.testing.assert_allclose(tr.query_values, vq[..., 0], atol=1e-12)


def _lstd(phi, phi_next, r, gamma):
    """A = (1/n) sum phi_i (phi_i - gamma phi'_i)^T and b = (1/n) sum r_i phi_i, per task."""
    n = phi.shape[1]
    A = np.einsum("bni,bnj->bij", phi, phi - gamma * phi_next) / n
    b = np.einsum("bn,bni->bi", r, phi) / n
    return A, b


def _boyan_transitions(batch, n, seed, n_states=6, d=3):
    mrp = boyan(batch=batch, n_states=n_states, d=d, seed=seed)
    traj = mrp.sample(n, rng=seed)
    rows = np.arange(batch)[:, None]
    return mrp, traj, mrp.phi[rows, traj.states[:, :-1]], mrp.phi[rows, traj.states[:, 1:]], traj.rewards


def test_batch_td_converges_to_the_lstd_solution():
    mrp, _, phi, phi_next, r = _boyan_transitions(8, 300, seed=3)
    A, b = _lstd(phi, phi_next, r, mrp.gamma)
    w_lstd = np.linalg.solve(A, b[..., None])[..., 0]
    alpha = 1.0
    rho = np.abs(np.linalg.eigvals(np.eye(3) - alpha * A)).max(-1)
    ok = rho < 0.98  # on-policy data: TD is stable on every task, but some contract slowly; skip those
    assert ok.sum() >= 6
    L = int(np.ceil(np.log(1e-14) / np.log(rho[ok].max())))
    tr = reference.batch_td(phi[ok], phi_next[ok], r[ok], phi[ok, 0], mrp.gamma, alpha, L)
    np.testing.assert_allclose(tr.w[:, -1], w_lstd[ok], atol=1e-10)
    # at the fixed point the mean TD update vanishes: sum_i delta_i phi_i = 0
    assert np.max(np.abs(np.einsum("bn,bnd->bd", tr.td_errors[:, -1], phi[ok]))) < 1e-9


def test_batch_td_with_the_inverse_lstd_preconditioner_reaches_lstd_in_one_step():
    # w1 = alpha C (b - A 0) = A^{-1} b when C = (alpha A)^{-1}: checks C (not C^T) is applied
    phi, phi_next, r, phi_q = td_data(batch=1, n=20, d=3, seed=4)
    A, b = _lstd(phi, phi_next, r, 0.8)
    C = np.linalg.inv(0.7 * A[0])
    assert np.max(np.abs(C - C.T)) > 1e-3
    tr = reference.batch_td(phi, phi_next, r, phi_q, 0.8, 0.7, 2, C)
    np.testing.assert_allclose(tr.w[0, 1], np.linalg.solve(A[0], b[0]), atol=1e-10)
    np.testing.assert_allclose(tr.w[0, 2], tr.w[0, 1], atol=1e-10)  # and stays there


# ------------------------------------------------------- weighted softmax TD
def test_softmax_kernel_hand_worked_and_normalised():
    x = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]])  # S = (0, 1, 0), one-hot, A11 = I
    K = reference.softmax_kernel(x)
    e = math.e
    np.testing.assert_allclose(K[0, :, 0], [e / (1 + e), 1 / (1 + e)], atol=1e-15)
    np.testing.assert_allclose(K[0, :, 1], [1 / (1 + e), e / (1 + e)], atol=1e-15)
    np.testing.assert_allclose(K[0, :, 2], K[0, :, 0], atol=1e-15)
    A11 = np.array([[0.0, 2.0], [0.0, 0.0]])  # g(S_j, S_{k-1}) = x(S_{k-1})^T A11 x(S_j)
    K2 = reference.softmax_kernel(x, A11)
    np.testing.assert_allclose(K2[0, :, 1], [e**2 / (1 + e**2), 1 / (1 + e**2)], atol=1e-15)  # source 0 -> target 1
    np.testing.assert_allclose(K2[0, :, 0], [0.5, 0.5], atol=1e-15)
    rand = np.random.default_rng(0).standard_normal((4, 9, 3)) * 5
    np.testing.assert_allclose(reference.softmax_kernel(rand).sum(axis=1), 1.0, atol=1e-14)


def test_weighted_softmax_td_hand_worked():
    x = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]])
    e = math.e
    tr = reference.weighted_softmax_td(x, np.array([[1.0, 2.0]]), gamma=0.5, alpha=1.0, n_iters=2)
    v1_0, v1_1 = (e * 1 + 2) / (1 + e), (1 + e * 2) / (1 + e)  # kernel-weighted mean of delta^0 = R
    np.testing.assert_allclose(tr.values[0, 1], [v1_0, v1_1, v1_0], atol=1e-15)
    d1 = np.array([1 + 0.5 * v1_1 - v1_0, 2 + 0.5 * v1_0 - v1_1])
    np.testing.assert_allclose(tr.td_errors[0, 1], d1, atol=1e-15)
    v2_0 = v1_0 + (e * d1[0] + d1[1]) / (1 + e)
    v2_1 = v1_1 + (d1[0] + e * d1[1]) / (1 + e)
    np.testing.assert_allclose(tr.values[0, 2], [v2_0, v2_1, v2_0], atol=1e-15)


def test_weighted_softmax_td_matches_explicit_loops():
    g = np.random.default_rng(5)
    B, n, d, L, gamma, alpha = 3, 6, 2, 3, 0.8, 0.7
    x, R, A11 = g.standard_normal((B, n + 1, d)), g.standard_normal((B, n)), g.standard_normal((d, d))
    tr = reference.weighted_softmax_td(x, R, gamma, alpha, L, A11=A11)
    for b in range(B):
        K = np.zeros((n, n + 1))
        for j in range(n + 1):
            s = [math.exp(x[b, k] @ A11 @ x[b, j]) for k in range(n)]
            K[:, j] = np.array(s) / sum(s)
        v = np.zeros(n + 1)
        for l in range(L + 1):
            np.testing.assert_allclose(tr.values[b, l], v, atol=1e-12)
            delta = [R[b, k - 1] + gamma * v[k] - v[k - 1] for k in range(1, n + 1)]
            np.testing.assert_allclose(tr.td_errors[b, l], delta, atol=1e-12)
            v = v + alpha * np.array([sum(K[k, j] * delta[k] for k in range(n)) for j in range(n + 1)])
        np.testing.assert_allclose(tr.kernel[b], K, atol=1e-14)


def test_tabular_kernel_known_answer():
    K = reference.tabular_kernel(np.array([[0, 1, 0, 2]]))  # sources 0, 1, 0; target 2 never a source
    np.testing.assert_allclose(K[0], [[0.5, 0, 0.5, 1 / 3], [0, 1, 0, 1 / 3], [0.5, 0, 0.5, 1 / 3]])


def test_tabular_td_fixed_point_is_the_certainty_equivalence_value():
    mrp = boyan(batch=6, n_states=5, d=2, seed=6)
    traj = mrp.sample(300, rng=6)
    s, R = traj.states, traj.rewards
    assert all(set(s[b, -1:]) <= set(s[b, :-1]) for b in range(6))  # S_n was also a source
    tr = reference.tabular_td(s, R, mrp.gamma, 1.0, 320)  # alpha = 1: contraction factor gamma
    for b in range(6):
        counts, rsum = np.zeros((5, 5)), np.zeros(5)
        for k in range(300):
            counts[s[b, k], s[b, k + 1]] += 1
            rsum[s[b, k]] += R[b, k]
        visits = counts.sum(-1)
        seen = visits > 0
        P_hat = counts[seen][:, seen] / visits[seen, None]
        v_ce = np.linalg.solve(np.eye(seen.sum()) - mrp.gamma * P_hat, rsum[seen] / visits[seen])
        full = np.zeros(5)
        full[seen] = v_ce
        np.testing.assert_allclose(tr.values[b, -1], full[s[b]], atol=1e-10)
        assert np.max(np.abs(tr.td_errors[b, -1] @ (s[b, :-1, None] == np.arange(5)))) < 1e-9


def test_softmax_td_with_sharp_onehot_features_approaches_tabular_td():
    mrp = boyan(batch=6, n_states=6, seed=7, features="onehot")
    traj = mrp.sample(10, rng=7)  # short: some targets are never sources (uniform-kernel convention)
    assert any(traj.states[b, -1] not in traj.states[b, :-1] for b in range(6))
    tab = reference.tabular_td(traj.states, traj.rewards, mrp.gamma, 0.5, 6)
    errors = []
    for beta in (0.5, 1.0, 2.0, 3.0, 8.0):
        x = (beta * np.eye(6))[traj.states]
        soft = reference.weighted_softmax_td(x, traj.rewards, mrp.gamma, 0.5, 6)
        errors.append(np.max(np.abs(soft.values - tab.values)))
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[0] > 1e-2 and errors[-1] < 1e-10


# ---------------------------------------------------- SARSA and actor-critic
def test_sarsa_update_hand_worked():
    # phi = (e0, e1), phi+ = (e1, e0), r = (1, -1), w = (0.5, 0.25), gamma = 0.5, alpha = 1:
    # delta = (1 + 0.125 - 0.5, -1 + 0.25 - 0.25) = (0.625, -1); w' = w + (1/2)(0.625, -1).
    e = np.eye(2)
    A = np.array
    w = reference.sarsa_update(A([[e[0], e[1]]]), A([[e[1], e[0]]]), A([[1.0, -1.0]]), A([[0.5, 0.25]]), 0.5, 1.0)
    np.testing.assert_allclose(w, [[0.8125, -0.25]], atol=1e-15)


def _sarsa_loop(phi, phi_next, r, w, gamma):
    B, n, d = phi.shape
    delta = np.zeros((B, n))
    for b in range(B):
        for i in range(n):
            delta[b, i] = r[b, i] + gamma * w[b] @ phi_next[b, i] - w[b] @ phi[b, i]
    return delta


def test_sarsa_and_actor_critic_match_explicit_loops():
    g = np.random.default_rng(8)
    phi, phi_next, r, _ = td_data(batch=5, n=7, d=4, seed=8)
    w, lam, scores = g.standard_normal((5, 4)), g.standard_normal((5, 2)), g.standard_normal((5, 7, 2))
    delta = _sarsa_loop(phi, phi_next, r, w, 0.6)
    w_sarsa = reference.sarsa_update(phi, phi_next, r, w, 0.6, 0.3)
    w_ac, lam_ac = reference.actor_critic_update(phi, phi_next, r, scores, w, lam, 0.6, 0.2, 0.3)
    for b in range(5):
        critic = w[b] + 0.3 / 7 * sum(delta[b, i] * phi[b, i] for i in range(7))
        actor = lam[b] + 0.2 / 7 * sum(0.6**i * delta[b, i] * scores[b, i] for i in range(7))
        np.testing.assert_allclose(w_sarsa[b], critic, atol=1e-12)
        np.testing.assert_allclose(w_ac[b], critic, atol=1e-12)
        np.testing.assert_allclose(lam_ac[b], actor, atol=1e-12)


def test_actor_critic_hand_worked():
    # same transitions as the SARSA case, scores g = (1, 2), lambda = 0.1, actor step 1, critic step 1:
    # lambda' = 0.1 + (1/2)(0.5^0 * 0.625 * 1 + 0.5^1 * (-1) * 2) = -0.0875
    e = np.eye(2)
    A = np.array
    w, lam = reference.actor_critic_update(A([[e[0], e[1]]]), A([[e[1], e[0]]]), A([[1.0, -1.0]]), A([[[1.0], [2.0]]]),
                                           A([[0.5, 0.25]]), A([[0.1]]), 0.5, 1.0, 1.0)
    np.testing.assert_allclose(w, [[0.8125, -0.25]], atol=1e-15)
    np.testing.assert_allclose(lam, [[-0.0875]], atol=1e-15)


def test_policy_score_is_the_gradient_of_log_pi():
    g = np.random.default_rng(9)
    B, S, A, m = 2, 3, 4, 5
    phi_pi, lam = g.standard_normal((B, S, A, m)), g.standard_normal((B, m))
    states, actions = g.integers(0, S, (B, 6)), g.integers(0, A, (B, 6))
    score = reference.policy_score(lam, phi_pi, states, actions)

    def log_pi(lam_):
        return np.log(envs.softmax_policy(np.einsum("bsam,bm->bsa", phi_pi, lam_)))

    h, rows = 1e-6, np.arange(B)[:, None]
    for k in range(m):
        dl = np.zeros((B, m))
        dl[:, k] = h
        fd = (log_pi(lam + dl) - log_pi(lam - dl)) / (2 * h)
        np.testing.assert_allclose(score[..., k], fd[rows, states, actions], atol=1e-7)
    all_sa = reference.policy_score(lam, phi_pi, np.repeat(np.arange(S), A)[None].repeat(B, 0),
                                    np.tile(np.arange(A), S)[None].repeat(B, 0)).reshape(B, S, A, m)
    pi = envs.softmax_policy(np.einsum("bsam,bm->bsa", phi_pi, lam))
    assert np.max(np.abs(np.einsum("bsa,bsam->bsm", pi, all_sa))) < 1e-12  # E_pi[score] = 0


# -------------------------------------------------------------- validation
def test_reference_validation_names_the_culprit():
    phi, phi_next, r, phi_q = td_data(batch=2, n=5, d=3)
    td = plain(reference.batch_td)
    with raises_user("phi_next", "shape"):
        td(phi, phi_next[:, :, :2], r, phi_q, 0.9, 1.0, 2)
    with raises_user("rewards", "shape"):
        td(phi, phi_next, r[:1], phi_q, 0.9, 1.0, 2)
    with raises_user("phi_query", "shape"):
        td(phi, phi_next, r, phi_q[:, :2], 0.9, 1.0, 2)
    with raises_user("C", "shape"):
        td(phi, phi_next, r, phi_q, 0.9, 1.0, 2, np.eye(2))
    with raises_user("phi", "NaN"):
        td(np.full_like(phi, np.nan), phi_next, r, phi_q, 0.9, 1.0, 2)
    with raises_user("rewards", "NaN"):
        td(phi, phi_next, np.full_like(r, np.nan), phi_q, 0.9, 1.0, 2)
    for gamma in (-0.5, 1.0, 2.0):
        with raises_user("gamma", "[0, 1)"):
            td(phi, phi_next, r, phi_q, gamma, 1.0, 2)
    with raises_user("n_iters", "-1"):
        td(phi, phi_next, r, phi_q, 0.9, 1.0, -1)
    soft = plain(reference.weighted_softmax_td)
    x = np.zeros((2, 6, 3))
    with raises_user("rewards", "shape"):
        soft(x, r[:, :4], 0.9, 1.0, 2)
    with raises_user("x", "NaN"):
        soft(np.full_like(x, np.nan), r, 0.9, 1.0, 2)
    with raises_user("kernel", "shape"):
        soft(x, r, 0.9, 1.0, 2, None, np.zeros((2, 5, 5)))
    with raises_user("A11", "shape"):
        plain(reference.softmax_kernel)(x, np.eye(2))
    with raises_user("gamma"):
        soft(x, r, 1.0, 1.0, 2)
    with raises_user("n_iters"):
        soft(x, r, 0.9, 1.0, -3)
    with raises_user("states", "shape"):
        plain(reference.tabular_td)(np.zeros((2, 5), dtype=int), r, 0.9, 1.0, 2)
    sarsa = plain(reference.sarsa_update)
    with raises_user("w", "shape"):
        sarsa(phi, phi_next, r, np.zeros((2, 4)), 0.5, 1.0)
    with raises_user("w", "NaN"):
        sarsa(phi, phi_next, r, np.full((2, 3), np.nan), 0.5, 1.0)
    with raises_user("gamma"):
        sarsa(phi, phi_next, r, np.zeros((2, 3)), 1.0, 1.0)
    ac = plain(reference.actor_critic_update)
    scores, w, lam = np.zeros((2, 5, 2)), np.zeros((2, 3)), np.zeros((2, 2))
    with raises_user("phi_next", "shape"):
        ac(phi, phi_next[:, :4], r, scores, w, lam, 0.5, 1.0, 1.0)
    with raises_user("rewards", "shape"):
        ac(phi, phi_next, r[:, :4], scores, w, lam, 0.5, 1.0, 1.0)
    with raises_user("w", "shape"):
        ac(phi, phi_next, r, scores, np.zeros((2, 2)), lam, 0.5, 1.0, 1.0)
    with raises_user("lam", "shape"):
        ac(phi, phi_next, r, scores, w, np.zeros((2, 3)), 0.5, 1.0, 1.0)
    with raises_user("scores", "shape"):
        ac(phi, phi_next, r, scores[:, :4], w, lam, 0.5, 1.0, 1.0)
    with raises_user("scores", "NaN"):
        ac(phi, phi_next, r, np.full_like(scores, np.nan), w, lam, 0.5, 1.0, 1.0)
