"""The tabular learning rules (icrl_interp.tasks.learners) against plain-Python per-step loops written here,
independently: one history and one parameter setting at a time, scalar float64 arithmetic, lists for tables."""
from __future__ import annotations

import math

import numpy as np
import pytest

from icrl_interp.core.errors import UserError
from icrl_interp.tasks import learners as L
from icrl_interp.tasks.episodes import Episodes

S, A = 4, 3
PARAMS = {"q_learning": dict(alpha=0.3, gamma=0.9, beta=2.0), "sarsa": dict(alpha=0.4, gamma=0.8, beta=1.5),
          "expected_sarsa": dict(alpha=0.35, gamma=0.85, beta=3.0),
          "sarsa_lambda": dict(alpha=0.25, gamma=0.9, beta=1.0, lam=0.7),
          "mc_control": dict(alpha=0.2, gamma=0.95, beta=2.5), "model_based": dict(gamma=0.7, beta=1.2)}


def random_episodes(seed=0, H=5, T=30, p_end=0.12) -> Episodes:
    """Random histories: episodes ending by termination or truncation, the next row starting at a reset
    observation, shorter histories padded (garbage in the padding)."""
    rng = np.random.default_rng(seed)
    obs = np.zeros((H, T), np.int64)
    nxt = rng.integers(0, S, (H, T))
    u = rng.random((H, T))
    term, trunc = u < p_end, (u >= p_end) & (u < 2 * p_end)
    obs[:, 0] = rng.integers(0, S, H)
    for t in range(1, T):
        done = term[:, t - 1] | trunc[:, t - 1]
        obs[:, t] = np.where(done, rng.integers(0, S, H), nxt[:, t - 1])
    valid = np.arange(T)[None] < rng.integers(T // 2, T + 1, H)[:, None]
    valid[0] = True
    actions = rng.integers(0, A, (H, T))
    rewards = rng.normal(size=(H, T))
    junk = ~valid
    obs[junk], actions[junk], nxt[junk] = 99, -1, -5  # the rules must not read the padding
    return Episodes(observations=obs, actions=actions, rewards=rewards, next_observations=nxt, terminations=term,
                    truncations=trunc, valid=valid, n_actions=A, n_observations=S)


def softmax(q, beta):
    m = max(q)
    e = [math.exp(beta * (x - m)) for x in q]
    z = sum(e)
    return [x / z for x in e]


def reference(name, ep: Episodes, h: int, alpha=None, gamma=None, beta=None, lam=None):
    """Per-step loop on history h: (q [T][A] the table row acted from, delta [T])."""
    Q = [[0.0] * A for _ in range(S)]
    T = int(ep.valid[h].sum())
    steps = []
    for t in range(T):
        term = bool(ep.terminations[h, t])
        trunc = (bool(ep.truncations[h, t]) or t == T - 1) and not term
        steps.append((int(ep.observations[h, t]), int(ep.actions[h, t]), float(ep.rewards[h, t]),
                      int(ep.next_observations[h, t]), term, trunc))
    qs, delta = [], [None] * T
    expect = lambda s: sum(p * x for p, x in zip(softmax(Q[s], beta), Q[s]))  # noqa: E731
    pending, E, episode, model = None, {}, [], {}
    for t, (s, a, r, s2, term, trunc) in enumerate(steps):
        qs.append(list(Q[s]))
        if name in ("q_learning", "expected_sarsa"):
            nxt = max(Q[s2]) if name == "q_learning" else expect(s2)
            d = r + (0.0 if term else gamma * nxt) - Q[s][a]
            Q[s][a] += alpha * d
            delta[t] = d
        elif name in ("sarsa", "sarsa_lambda"):
            def update(ps, pa, d, end):
                if name == "sarsa":
                    Q[ps][pa] += alpha * d
                    return
                E[(ps, pa)] = E.get((ps, pa), 0.0) + 1.0
                for (x, y), e in E.items():
                    Q[x][y] += alpha * d * e
                for k in E:
                    E[k] *= gamma * lam
                if end:
                    E.clear()
            if pending is not None:
                ps, pa, pr, ps2, pt = pending
                d = pr + gamma * Q[ps2][a] - Q[ps][pa]
                update(ps, pa, d, False)
                delta[pt] = d
                pending = None
            if term or trunc:
                d = r + (0.0 if term else gamma * expect(s2)) - Q[s][a]
                update(s, a, d, True)
                delta[t] = d
            else:
                pending = (s, a, r, s2, t)
        elif name == "mc_control":
            episode.append((t, s, a, r))
            if term or trunc:
                G, ret = 0.0, {}
                for k, _, _, rk in reversed(episode):
                    G = rk + gamma * G
                    ret[k] = G
                for k, sk, ak, _ in episode:
                    delta[k] = ret[k] - Q[sk][ak]
                    Q[sk][ak] += alpha * delta[k]
                episode = []
        elif name == "model_based":
            delta[t] = r + (0.0 if term else gamma * max(Q[s2])) - Q[s][a]
            model.setdefault((s, a), []).append((r, s2, 0.0 if term else gamma))
            for _ in range(L.SWEEPS):
                V = [max(row) for row in Q]
                new = [[0.0] * A for _ in range(S)]
                for (x, y), trs in model.items():
                    new[x][y] = sum(rr + c * V[n2] for rr, n2, c in trs) / len(trs)
                Q = new
    return np.array(qs), np.array(delta)


@pytest.mark.parametrize("name", list(PARAMS))
def test_each_rule_matches_its_per_step_loop(name):
    ep = random_episodes(seed=1)
    p = PARAMS[name]
    out = L.replay(name, ep, **p)
    assert ep.truncations.any() and ep.terminations.any() and not ep.valid.all()
    for h in range(ep.n_histories):
        q, d = reference(name, ep, h, **p)
        T = len(d)
        scale = 1.0 + np.abs(q).max()
        np.testing.assert_allclose(out.q[h, :T], q, rtol=0, atol=1e-12 * scale)
        np.testing.assert_allclose(out.delta[h, :T], d, rtol=0, atol=1e-12 * scale)
        lp = [math.log(softmax(list(q[t]), p["beta"])[ep.actions[h, t]]) for t in range(T)]
        np.testing.assert_allclose(out.log_prob[h, :T], lp, rtol=0, atol=1e-12 * scale * p["beta"])
        pi = np.array([softmax(list(q[t]), p["beta"]) for t in range(T)])
        v = q.max(1) if name in ("q_learning", "model_based") else (pi * q).sum(1)
        np.testing.assert_allclose(out.v[h, :T], v, rtol=0, atol=1e-12 * scale)
        assert np.isnan(out.q[h, T:]).all() and np.isnan(out.delta[h, T:]).all()  # padding is NaN, exactly
    assert np.abs(out.delta[ep.valid]).max() > 0.1  # the histories do move the tables


def test_a_batch_of_parameters_is_each_setting_alone():
    ep = random_episodes(seed=2, H=3, T=20)
    alpha = np.array([[0.1], [0.6]])
    gamma = np.array([0.0, 0.5, 1.0])
    out = L.replay("sarsa_lambda", ep, alpha=alpha, gamma=gamma, beta=2.0, lam=0.5)
    assert out.q.shape == (2, 3, 3, 20, A)
    for i in range(2):
        for j in range(3):
            one = L.replay("sarsa_lambda", ep, alpha=float(alpha[i, 0]), gamma=float(gamma[j]), beta=2.0, lam=0.5)
            np.testing.assert_array_equal(out.q[i, j], one.q)  # the same operations per row: exact
            np.testing.assert_array_equal(out.delta[i, j], one.delta)


def test_sarsa_lambda_at_zero_is_sarsa():
    ep = random_episodes(seed=3)
    a = L.replay("sarsa_lambda", ep, alpha=0.3, gamma=0.9, beta=1.0, lam=0.0)
    b = L.replay("sarsa", ep, alpha=0.3, gamma=0.9, beta=1.0)
    np.testing.assert_allclose(a.q, b.q, rtol=0, atol=1e-13)


def test_online_learner_acts_by_the_table_replay_reconstructs():
    """A learner acting in a small random MDP: the policy it sampled from at each step equals the replay's
    (one update code for both), for the deferred rule and the episodic one."""
    rng = np.random.default_rng(4)
    P = rng.dirichlet(np.ones(S), size=(S, A))
    R = rng.normal(size=(S, A))
    for name in ("sarsa", "mc_control", "expected_sarsa"):
        n, T = 3, 40
        agent = L.OnlineLearner(name, n, S, A, **PARAMS[name], seed=5)
        s = np.zeros(n, np.int64)
        cols = {k: [] for k in ("obs", "act", "rew", "nxt", "term", "trunc", "probs")}
        for t in range(T):
            cols["probs"].append(agent.probs(s))
            a = agent.act(s)
            s2 = np.array([rng.choice(S, p=P[i, j]) for i, j in zip(s, a)])
            term = rng.random(n) < 0.1
            trunc = ~term & (t % 7 == 6)
            agent.observe(s, a, R[s, a], s2, term, trunc)
            for k, v in zip(("obs", "act", "rew", "nxt", "term", "trunc"), (s, a, R[s, a], s2, term, trunc)):
                cols[k].append(v)
            s = np.where(term | trunc, 0, s2)
        st = lambda k: np.stack(cols[k], 1)  # noqa: E731
        ep = Episodes(observations=st("obs"), actions=st("act"), rewards=st("rew"), next_observations=st("nxt"),
                      terminations=st("term"), truncations=st("trunc"), valid=np.ones((n, T), bool), n_actions=A,
                      n_observations=S)
        out = L.replay(name, ep, **PARAMS[name])
        np.testing.assert_allclose(L.policy(out.q, PARAMS[name]["beta"]), st("probs"), rtol=0, atol=1e-14)
        assert np.ptp(st("probs")) > 0.05  # it did learn


def test_refusals():
    ep = random_episodes()
    with pytest.raises(UserError, match="needs parameter lam"):
        L.replay("sarsa_lambda", ep, alpha=0.1, gamma=0.9, beta=1.0)
    with pytest.raises(UserError, match="has no parameter alpha"):
        L.replay("model_based", ep, alpha=0.1, gamma=0.9, beta=1.0)
    with pytest.raises(UserError, match=r"alpha must lie in \(0, 1\]"):
        L.replay("q_learning", ep, alpha=0.0, gamma=0.9, beta=1.0)
    with pytest.raises(UserError, match="gamma must lie"):
        L.replay("q_learning", ep, alpha=0.5, gamma=1.01, beta=1.0)
    with pytest.raises(UserError, match="unknown learning rule"):
        L.replay("td_zero", ep, alpha=0.5, gamma=0.9, beta=1.0)
    box = Episodes(observations=np.zeros((1, 2, 3)), actions=np.zeros((1, 2), np.int64), rewards=np.zeros((1, 2)),
                   next_observations=np.zeros((1, 2, 3)), terminations=np.zeros((1, 2), bool),
                   truncations=np.zeros((1, 2), bool), valid=np.ones((1, 2), bool), n_actions=2, n_observations=None)
    with pytest.raises(UserError, match="discrete observations"):
        L.replay("q_learning", box, alpha=0.5, gamma=0.9, beta=1.0)
