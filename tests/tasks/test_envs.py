"""Known-answer tests for the task distributions (Boyan chains, random tabular MDPs)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from icrl_interp.tasks import envs
from icrl_interp.core.errors import UserError

from helpers import boyan, build_plain, mdps, plain, raises_user, random_policy, repeated, se_tolerance


# ------------------------------------------------------------ Boyan chains
@pytest.mark.parametrize("n_states", [3, 4, 10])
def test_boyan_transitions_have_the_documented_structure(n_states):
    P = envs.boyan_transitions(50, n_states, rng=1)
    s = n_states
    np.testing.assert_allclose(P.sum(-1), 1.0, atol=1e-12)
    assert np.all(P >= 0)
    for i in range(s - 2):
        # only i+1 and i+2 are reachable, and the step probability lies in [0.01, 0.99]
        others = np.delete(P[:, i], [i + 1, i + 2], axis=-1)
        assert np.all(others == 0)  # exact: unreachable entries are never written
        assert np.all((P[:, i, i + 1] >= 0.01) & (P[:, i, i + 1] <= 0.99))
        np.testing.assert_allclose(P[:, i, i + 1] + P[:, i, i + 2], 1.0, atol=1e-15)
    assert np.all(P[:, s - 2, s - 1] == 1.0)  # exact: a literal 1
    assert np.all(P[:, s - 1] > 0)  # the last state can jump anywhere: continuing and ergodic
    assert len({P[b].tobytes() for b in range(50)}) == 50  # every task draws a fresh chain


def test_boyan_needs_three_states():
    with raises_user("3 states", "got 2"):
        envs.boyan_transitions(1, 2, rng=0)


def test_values_satisfy_the_bellman_equation():
    mrp = boyan(batch=32, n_states=10, d=4)
    v = mrp.values()
    residual = v - (mrp.r + mrp.gamma * np.einsum("bst,bt->bs", mrp.P, v))
    assert np.max(np.abs(residual)) < 1e-10
    # and equal the truncated Neumann series sum_t gamma^t P^t r computed independently
    series, term = np.zeros_like(v), mrp.r.copy()
    for _ in range(400):
        series += term
        term = mrp.gamma * np.einsum("bst,bt->bs", mrp.P, term)
    np.testing.assert_allclose(v, series, atol=1e-10)


def test_stationary_distribution_is_stationary_and_sums_to_one():
    mrp = boyan(batch=32, n_states=10)
    mu = mrp.stationary()
    np.testing.assert_allclose(mu.sum(-1), 1.0, atol=1e-12)
    assert np.all(mu > 0)
    np.testing.assert_allclose(np.einsum("bs,bst->bt", mu, mrp.P), mu, atol=1e-12)
    # independently: the eigenvector of P^T with eigenvalue closest to 1
    for b in range(4):
        lam, vecs = np.linalg.eig(mrp.P[b].T)
        u = np.real(vecs[:, np.argmin(np.abs(lam - 1))])
        np.testing.assert_allclose(mu[b], u / u.sum(), atol=1e-10)


def test_stationary_distribution_of_a_hand_worked_chain():
    # 3-state Boyan chain: 0 -> 1 (p) or 2 (1-p); 1 -> 2; 2 -> (q0, q1, q2).
    p, q = 0.3, np.array([0.5, 0.2, 0.3])
    P = np.array([[[0, p, 1 - p], [0, 0, 1], q]])
    # balance: mu0 = q0 mu2, mu1 = p mu0 + q1 mu2, normalised
    mu2 = 1 / (q[0] + (p * q[0] + q[1]) + 1)
    expected = np.array([q[0] * mu2, (p * q[0] + q[1]) * mu2, mu2])
    np.testing.assert_allclose(envs.stationary_distribution(P)[0], expected, atol=1e-14)


def test_onehot_features_and_representable_rewards():
    mrp = boyan(batch=5, n_states=6, features="onehot", beta=2.5)
    assert mrp.d == 6
    np.testing.assert_array_equal(mrp.phi, np.broadcast_to(2.5 * np.eye(6), (5, 6, 6)))  # exact: beta times 0 or 1
    rep = boyan(batch=16, n_states=10, d=3, rewards="representable")
    v = rep.values()
    for b in range(16):  # v lies in the span of the features: v = phi w exactly
        w, *_ = np.linalg.lstsq(rep.phi[b], v[b], rcond=None)
        assert np.max(np.abs(rep.phi[b] @ w - v[b])) < 1e-10
    uni = boyan(batch=64, n_states=10, d=3)
    assert np.all(np.abs(uni.r) <= 1) and np.all(np.abs(uni.phi) <= 1)
    assert uni.phi.shape == (64, 10, 3)


def test_transition_frequencies_converge_to_P():
    mrp = boyan(batch=3, n_states=5, seed=3)
    n = 20_000
    traj = mrp.sample(n, rng=7)
    for b in range(mrp.batch):
        counts = np.zeros((5, 5))
        np.add.at(counts, (traj.states[b, :-1], traj.states[b, 1:]), 1)
        visits = counts.sum(-1, keepdims=True)
        assert np.all(visits > 300)
        # by the strong Markov property the successors of s are i.i.d. draws from P[s]
        tol = se_tolerance(mrp.P[b], visits)
        assert np.all(np.abs(counts / visits - mrp.P[b]) <= tol)
    np.testing.assert_array_equal(traj.rewards, np.take_along_axis(mrp.r, traj.states[:, :-1], 1))  # exact: looked up


def test_stationary_start_stays_stationary_across_independent_runs():
    copies = 20_000
    mrp = repeated(boyan(batch=1, n_states=5, seed=4), copies)
    mu = mrp.stationary()[0]
    traj = mrp.sample(6, rng=8)
    for t in (0, 6):
        freq = np.bincount(traj.states[:, t], minlength=5) / copies
        assert np.all(np.abs(freq - mu) <= se_tolerance(mu, copies))


def test_start_options():
    mrp = boyan(batch=4, n_states=5)
    traj = mrp.sample(3, rng=0, start=np.array([0, 1, 2, 4]))
    np.testing.assert_array_equal(traj.states[:, 0], [0, 1, 2, 4])
    uni = repeated(mrp, 10_000).sample(1, rng=0, start="uniform").states[:, 0]
    freq = np.bincount(uni, minlength=5) / 10_000
    assert np.all(np.abs(freq - 0.2) <= se_tolerance(np.full(5, 0.2), 10_000))
    with raises_user("start", "'middle'"):
        mrp.sample(3, rng=0, start="middle")
    with raises_user("start states", "shape"):
        plain(mrp.sample)(3, 0, np.array([0, 1]))


def test_sampled_transitions_are_possible_in_every_task():
    mrp = boyan(batch=64, n_states=8, seed=5)
    traj = mrp.sample(50, rng=1)
    rows = np.arange(64)[:, None]
    assert np.all(mrp.P[rows, traj.states[:, :-1], traj.states[:, 1:]] > 0)


def test_seeds_make_tasks_and_trajectories_reproducible():
    a, b, c = boyan(seed=11), boyan(seed=11), boyan(seed=12)
    for f in ("P", "r", "phi"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))  # exact: the same computation rerun
        assert not np.array_equal(getattr(a, f), getattr(c, f))
    t1, t2, t3 = a.sample(40, rng=3), a.sample(40, rng=3), a.sample(40, rng=4)
    np.testing.assert_array_equal(t1.states, t2.states)
    assert not np.array_equal(t1.states, t3.states)
    # a Generator is used (and advanced), never global state
    g = np.random.default_rng(3)
    first, second = a.sample(40, rng=g), a.sample(40, rng=g)
    np.testing.assert_array_equal(first.states, t1.states)
    assert not np.array_equal(first.states, second.states)
    np.random.seed(123)
    again = a.sample(40, rng=3)
    np.testing.assert_array_equal(again.states, t1.states)


def test_mrp_validation_names_the_culprit():
    good = boyan(batch=2, n_states=4, d=2)
    kw = dict(P=good.P, r=good.r, phi=good.phi, gamma=0.9)
    bad_P = good.P.copy()
    bad_P[0, 0, 0] += 0.1
    with raises_user("transition matrix P", "row-stochastic"):
        build_plain(envs.MRPBatch, **{**kw, "P": bad_P})
    neg = good.P.copy()
    neg[0, 0] = [-0.5, 1.5, 0, 0]
    with raises_user("transition matrix P", "non-negative"):
        build_plain(envs.MRPBatch, **{**kw, "P": neg})
    with raises_user("P", "shape"):
        build_plain(envs.MRPBatch, **{**kw, "P": good.P[0]})
    with raises_user("r", "shape (2, 3)"):
        build_plain(envs.MRPBatch, **{**kw, "r": good.r[:, :3]})
    with raises_user("phi", "shape"):
        build_plain(envs.MRPBatch, **{**kw, "phi": good.phi[:, :3]})
    nan_phi = good.phi.copy()
    nan_phi[1, 2, 0] = np.nan
    with raises_user("features phi", "NaN"):
        build_plain(envs.MRPBatch, **{**kw, "phi": nan_phi})
    with raises_user("rewards r", "NaN"):
        build_plain(envs.MRPBatch, **{**kw, "r": np.full((2, 4), np.inf)})
    for gamma in (-0.1, 1.0, 1.5, float("nan")):
        with raises_user("gamma", "[0, 1)"):
            build_plain(envs.MRPBatch, **{**kw, "gamma": gamma})
        with raises_user("gamma"):
            plain(envs.sample_boyan_chains)(2, 4, 2, gamma)
    with raises_user("features", "'gaussian'"):
        plain(envs.sample_boyan_chains)(2, 4, features="gaussian")
    with raises_user("rewards", "'normal'"):
        plain(envs.sample_boyan_chains)(2, 4, rewards="normal")
    with raises_user("start states", "0..3"):
        plain(good.sample)(2, 0, np.array([0, 4]))


# --------------------------------------------------------------- policies
def test_epsilon_greedy_known_answer():
    q = np.array([[[1.0, 3.0, 2.0], [5.0, 5.0, 0.0]]])
    pi = envs.epsilon_greedy(q, 0.3)
    np.testing.assert_allclose(pi, [[[0.1, 0.8, 0.1], [0.8, 0.1, 0.1]]])  # ties go to the first action
    np.testing.assert_array_equal(envs.epsilon_greedy(q, 0.0), [[[0, 1, 0], [1, 0, 0]]])  # exact: 1 - 0 and 0 / 3
    np.testing.assert_allclose(envs.epsilon_greedy(q, 1.0), np.full((1, 2, 3), 1 / 3))
    rand = np.random.default_rng(0).standard_normal((5, 4, 6))
    np.testing.assert_allclose(envs.epsilon_greedy(rand, 0.17).sum(-1), 1.0, atol=1e-15)
    for eps in (-0.1, 1.5, float("nan")):
        with raises_user("epsilon", "[0, 1]"):
            envs.epsilon_greedy(q, eps)


def test_softmax_policy_known_answer():
    pi = envs.softmax_policy(np.array([[[0.0, np.log(3.0)], [1000.0, 1000.0]]]))
    np.testing.assert_allclose(pi, [[[0.25, 0.75], [0.5, 0.5]]], atol=1e-15)  # no overflow at 1000
    rand = np.random.default_rng(0).standard_normal((5, 4, 6))
    np.testing.assert_allclose(envs.softmax_policy(rand).sum(-1), 1.0, atol=1e-15)
    np.testing.assert_allclose(envs.softmax_policy(rand + 7.0), envs.softmax_policy(rand), atol=1e-15)


def test_state_action_onehot():
    phi = envs.state_action_onehot(3, 2)
    assert phi.shape == (3, 2, 6)
    for s, a in itertools.product(range(3), range(2)):
        np.testing.assert_array_equal(phi[s, a], np.eye(6)[s * 2 + a])  # exact: literal 0s and 1s
    np.testing.assert_array_equal(mdps(batch=1, n_states=3, n_actions=2).features(), phi)


def test_mdps_with_their_own_features():
    """A batch may carry per-task features [B, s, a, d]; they are validated, and one-hot stays the default."""
    mdp = mdps(batch=3, n_states=3, n_actions=2)
    assert mdp.phi is None and mdp.d == 6 and mdp.feature_table().shape == (3, 3, 2, 6)
    phi = np.random.default_rng(0).standard_normal((3, 3, 2, 4))
    own = mdp.with_features(phi)
    assert own.d == 4 and own.features() is own.phi and np.array_equal(own.phi, phi)  # exact: copies
    np.testing.assert_array_equal(own.P, mdp.P)
    with raises_user("phi"):
        build_plain(envs.MDPBatch, P=mdp.P, R=mdp.R, start=mdp.start, gamma=0.5, phi=phi[:2])
    with raises_user("features phi"):
        mdp.with_features(np.full((3, 3, 2, 4), np.nan))


# -------------------------------------------------------------------- MDPs
def test_mdp_laws():
    mdp = mdps(batch=200, n_states=4, n_actions=3)
    np.testing.assert_allclose(mdp.P.sum(-1), 1.0, atol=1e-12)
    assert np.all(mdp.P > 0) and np.all(np.abs(mdp.R) <= 1)
    np.testing.assert_array_equal(mdp.start, np.full((200, 4), 0.25))  # exact: 1 / 4
    # Dirichlet(1) rows: each entry has mean 1/S and variance (S-1)/(S^2 (S+1))
    S, count = 4, mdp.P.size // 4
    var = (S - 1) / (S**2 * (S + 1))
    assert abs(mdp.P.mean() - 1 / S) < 5 * np.sqrt(var / count)
    # U(-1, 1) rewards: mean 0, variance 1/3
    assert abs(mdp.R.mean()) < 5 * np.sqrt(1 / 3 / mdp.R.size)
    sharp = envs.sample_tabular_mdps(50, 4, 3, rng=0, concentration=0.05)
    assert sharp.P.max(-1).mean() > 0.8  # small concentration: nearly deterministic rows


def _bellman_q(mdp, pi, q):
    v = np.einsum("bsa,bsa->bs", pi, q)
    return mdp.R + mdp.gamma * np.einsum("bsat,bt->bsa", mdp.P, v)


def test_q_values_satisfy_their_bellman_equation():
    mdp = mdps(batch=16, n_states=5, n_actions=3, gamma=0.8)
    pi = random_policy(mdp, seed=1)
    q = mdp.q_values(pi)
    assert np.max(np.abs(q - _bellman_q(mdp, pi, q))) < 1e-10
    np.testing.assert_allclose(np.einsum("bsa,bsa->bs", pi, q), mdp.state_values(pi), atol=1e-12)


def test_discounted_return_equals_an_independent_linear_solve():
    mdp = mdps(batch=6, n_states=4, n_actions=3, gamma=0.7)
    pi = random_policy(mdp, seed=2)
    got = mdp.discounted_return(pi)
    for b in range(mdp.batch):
        P_pi = np.zeros((4, 4))
        r_pi = np.zeros(4)
        for s, a in itertools.product(range(4), range(3)):
            P_pi[s] += pi[b, s, a] * mdp.P[b, s, a]
            r_pi[s] += pi[b, s, a] * mdp.R[b, s, a]
        expected = mdp.start[b] @ np.linalg.inv(np.eye(4) - mdp.gamma * P_pi) @ r_pi
        assert abs(got[b] - expected) < 1e-12


def test_discounted_return_hand_worked():
    # two absorbing-ish states: action 0 stays, action 1 switches; R(0, .) = 1, R(1, .) = 0
    P = np.zeros((1, 2, 2, 2))
    P[0, 0, 0, 0] = P[0, 1, 0, 1] = 1.0
    P[0, 0, 1, 1] = P[0, 1, 1, 0] = 1.0
    R = np.array([[[1.0, 1.0], [0.0, 0.0]]])
    mdp = envs.MDPBatch(P=P, R=R, start=np.array([[1.0, 0.0]]), gamma=0.5)
    stay = np.array([[[1.0, 0.0], [1.0, 0.0]]])
    switch = np.array([[[0.0, 1.0], [0.0, 1.0]]])
    assert mdp.discounted_return(stay)[0] == pytest.approx(2.0, abs=1e-14)  # 1 / (1 - 0.5)
    assert mdp.discounted_return(switch)[0] == pytest.approx(4 / 3, abs=1e-14)  # 1 + 0.25 + ...
    q, pi, ret = mdp.optimal()
    np.testing.assert_array_equal(pi, [[[1, 0], [0, 1]]])  # stay in 0, leave 1
    assert ret[0] == pytest.approx(2.0, abs=1e-10)
    np.testing.assert_allclose(q, [[[2.0, 1.5], [0.5, 1.0]]], atol=1e-10)  # Q(0,1) = 1 + 0.5 V(1), V(1) = 1


def test_value_iteration_is_optimal():
    mdp = mdps(batch=12, n_states=4, n_actions=3, gamma=0.9, seed=3)
    q_star, pi_star, ret_star = mdp.optimal()
    # Bellman optimality and consistency with the exact Q of the greedy policy
    assert np.max(np.abs(q_star - (mdp.R + mdp.gamma * np.einsum("bsat,bt->bsa", mdp.P, q_star.max(-1))))) < 1e-10
    np.testing.assert_allclose(mdp.q_values(pi_star), q_star, atol=1e-9)
    # no single-state improvement: switching any state to any action never helps
    v_star = mdp.state_values(pi_star)
    assert np.all(mdp.q_values(pi_star) <= v_star[..., None] + 1e-10)
    # not beaten by any deterministic policy (all 3^4 of them) nor by random stochastic ones
    for actions in itertools.product(range(3), repeat=4):
        det = np.broadcast_to(np.eye(3)[list(actions)], mdp.R.shape)
        assert np.all(mdp.discounted_return(det) <= ret_star + 1e-10)
    for seed in range(20):
        assert np.all(mdp.discounted_return(random_policy(mdp, seed)) <= ret_star + 1e-10)


def test_mdp_sampling_frequencies_converge():
    mdp = mdps(batch=2, n_states=3, n_actions=2, seed=5)
    pi = random_policy(mdp, seed=5)
    n = 20_000
    traj = mdp.sample(pi, n, rng=9)
    assert traj.actions.shape == (2, n + 1) and traj.states.shape == (2, n + 1)
    rows = np.arange(2)[:, None]
    np.testing.assert_array_equal(traj.rewards, mdp.R[rows, traj.states[:, :-1], traj.actions[:, :-1]])  # looked up
    for b in range(2):
        sa = np.zeros((3, 2))
        np.add.at(sa, (traj.states[b], traj.actions[b]), 1)
        visits = sa.sum(-1, keepdims=True)
        assert np.all(np.abs(sa / visits - pi[b]) <= se_tolerance(pi[b], visits))
        sas = np.zeros((3, 2, 3))
        np.add.at(sas, (traj.states[b, :-1], traj.actions[b, :-1], traj.states[b, 1:]), 1)
        n_sa = sas.sum(-1, keepdims=True)
        assert np.all(np.abs(sas / n_sa - mdp.P[b]) <= se_tolerance(mdp.P[b], n_sa))


def test_mdp_sampling_is_seeded():
    mdp = mdps()
    pi = random_policy(mdp)
    t1, t2, t3 = mdp.sample(pi, 30, rng=1), mdp.sample(pi, 30, rng=1), mdp.sample(pi, 30, rng=2)
    np.testing.assert_array_equal(t1.states, t2.states)
    np.testing.assert_array_equal(t1.actions, t2.actions)
    assert not np.array_equal(t1.states, t3.states)
    np.testing.assert_array_equal(mdps(seed=4).P, mdps(seed=4).P)  # exact: the same computation rerun
    assert not np.array_equal(mdps(seed=4).R, mdps(seed=5).R)
    fixed = mdp.sample(pi, 5, rng=0, start_states=np.arange(8) % 4)
    np.testing.assert_array_equal(fixed.states[:, 0], np.arange(8) % 4)


def test_mdp_validation_names_the_culprit():
    good = mdps(batch=2, n_states=3, n_actions=2)
    kw = dict(P=good.P, R=good.R, start=good.start, gamma=0.5)
    bad = good.P.copy()
    bad[1, 2, 1] *= 2
    with raises_user("transition tensor P", "row-stochastic"):
        build_plain(envs.MDPBatch, **{**kw, "P": bad})
    with raises_user("P", "shape"):
        build_plain(envs.MDPBatch, **{**kw, "P": good.P[:, :, :, :2] / good.P[:, :, :, :2].sum(-1, keepdims=True)})
    with raises_user("P", "shape"):
        build_plain(envs.MDPBatch, **{**kw, "P": np.array([0.5, 0.5])})
    with raises_user("R", "shape"):
        build_plain(envs.MDPBatch, **{**kw, "R": good.R[:, :2]})
    with raises_user("rewards R", "NaN"):
        build_plain(envs.MDPBatch, **{**kw, "R": np.where(good.R > 0, np.nan, good.R)})
    with raises_user("start distribution", "row-stochastic"):
        build_plain(envs.MDPBatch, **{**kw, "start": np.ones((2, 3))})
    with raises_user("gamma"):
        build_plain(envs.MDPBatch, **{**kw, "gamma": 1.0})
    with raises_user("policy", "shape"):
        plain(good.state_values)(np.full((2, 3, 3), 1 / 3))
    with raises_user("policy", "row-stochastic"):
        good.state_values(np.full((2, 3, 2), 0.4))
    with raises_user("concentration", "positive"):
        plain(envs.sample_tabular_mdps)(2, 3, 2, 0.5, 0, 0.0)
    with raises_user("gamma"):
        plain(envs.sample_tabular_mdps)(2, 3, 2, 1.2)
    with pytest.raises(UserError):
        plain(good.sample)(np.full((2, 3, 2), 0.5), 3, 0, np.array([0, 3]))


def test_categorical_draws_never_pick_zero_probability_entries():
    class Fixed:  # a stand-in Generator returning chosen uniforms, edge cases included
        def random(self, n):
            return np.array([0.0, 0.25, 0.5, 0.999999])[:n]

    cum = np.cumsum(np.tile([0.0, 0.5, 0.0, 0.5], (4, 1)), -1)
    np.testing.assert_array_equal(plain(envs._sample_rows)(cum, Fixed()), [1, 1, 3, 3])
    probs = np.array([[0.2, 0.3, 0.5]] * 30_000)
    freq = np.bincount(envs.sample_categorical(probs, 0), minlength=3) / 30_000
    assert np.all(np.abs(freq - probs[0]) <= se_tolerance(probs[0], 30_000))


def test_sizes_must_be_positive_integers():
    with raises_user("number of tasks", "-1"):
        envs.boyan_transitions(-1, 5, rng=0)
    with raises_user("number of actions", "0"):
        envs.sample_tabular_mdps(2, 3, 0)
    with raises_user("number of states", "0"):
        envs.sample_tabular_mdps(2, 0, 2)
    with raises_user("n_steps", "-2"):
        boyan(batch=2).sample(-2, rng=0)
    mdp = mdps(batch=2)
    with raises_user("n_steps"):
        mdp.sample(random_policy(mdp), -1, rng=0)
    assert boyan(batch=2).sample(0, rng=0).states.shape == (2, 1)
