"""The behavioural fit of the episode verdict (icrl_interp.verdicts.behaviour_fit) on known answers: agents
simulated here, by per-step loops written independently of icrl_interp.tasks.learners, in small random tabular
MDPs (one per history) with terminations and time limits; and decoys that no candidate rule explains."""
from __future__ import annotations

import math

import numpy as np
import pytest

from icrl_interp.core.errors import UserError
from icrl_interp.tasks.episodes import Episodes
from icrl_interp.verdicts import behaviour_fit as BF

S, A, HORIZON = 6, 3, 10


def _softmax(q, beta):
    z = [beta * x for x in q]
    m = max(z)
    e = [math.exp(x - m) for x in z]
    return [x / sum(e) for x in e]


def _draw(p, u):
    acc = 0.0
    for i, x in enumerate(p):
        acc += x
        if u < acc:
            return i
    return len(p) - 1


def simulate(kind: str, H: int, T: int, seed: int, alpha=0.3, gamma=0.9, beta=3.0) -> Episodes:
    """H learning histories of T steps of an agent of `kind` (a rule acting by softmax(beta Q), or a decoy),
    each in its own random MDP: start state 0, terminal states end an episode, HORIZON steps truncate it."""
    rng = np.random.default_rng(seed)
    cols = {k: np.zeros((H, T), np.int64) for k in ("o", "a", "n")}
    cols["r"] = np.zeros((H, T))
    cols["te"], cols["tr"] = np.zeros((H, T), bool), np.zeros((H, T), bool)
    for h in range(H):
        P = rng.dirichlet(np.full(S, 0.5), size=(S, A)).tolist()
        R = (2.0 * rng.normal(size=(S, A))).tolist()
        terminal = (rng.random(S) < 0.25).tolist()
        terminal[0] = False
        fixed = rng.dirichlet(np.ones(A), size=S).tolist()
        Q = [[0.0] * A for _ in range(S)]
        s, k, last, pending, episode = 0, 0, int(rng.integers(A)), None, []
        u = rng.random((T, 4)).tolist()
        noise = rng.normal(size=T).tolist()
        for t in range(T):
            if kind == "perseverate":
                a = last if u[t][0] < 0.85 else int(u[t][1] * A)
            elif kind == "fixed":
                a = _draw(fixed[s], u[t][0])
            elif kind == "cycle":
                a = (last + 1) % A if u[t][0] < 0.9 else int(u[t][1] * A)
            else:
                a = _draw(_softmax(Q[s], beta), u[t][0])
            if pending is not None:  # SARSA: the previous step's update, with the action just chosen
                ps, pa, pr, ps2 = pending
                Q[ps][pa] += alpha * (pr + gamma * Q[ps2][a] - Q[ps][pa])
                pending = None
            s2 = _draw(P[s][a], u[t][2])
            r = R[s][a] + 0.5 * noise[t]
            k += 1
            te = terminal[s2]
            tr = (not te) and k >= HORIZON
            if kind == "q_learning":
                Q[s][a] += alpha * (r + (0.0 if te else gamma * max(Q[s2])) - Q[s][a])
            elif kind == "sarsa":
                if te or tr:
                    nxt = sum(p * x for p, x in zip(_softmax(Q[s2], beta), Q[s2]))
                    Q[s][a] += alpha * (r + (0.0 if te else gamma * nxt) - Q[s][a])
                else:
                    pending = (s, a, r, s2)
            elif kind == "mc_control":
                episode.append((s, a, r))
                if te or tr:
                    G, ret = 0.0, []
                    for es, ea, er in reversed(episode):
                        G = er + gamma * G
                        ret.append(G)
                    for (es, ea, _), g in zip(episode, reversed(ret)):
                        Q[es][ea] += alpha * (g - Q[es][ea])
                    episode = []
            for key, val in zip(("o", "a", "r", "n", "te", "tr"), (s, a, r, s2, te, tr)):
                cols[key][h, t] = val
            last = a
            s, k = (0, 0) if te or tr else (s2, k)
    return Episodes(observations=cols["o"], actions=cols["a"], rewards=cols["r"], next_observations=cols["n"],
                    terminations=cols["te"], truncations=cols["tr"], valid=np.ones((H, T), bool), n_actions=A,
                    n_observations=S, meta={"agent": kind})


FAST = ["q_learning", "sarsa", "mc_control"]


@pytest.mark.parametrize("teacher", ["q_learning", "mc_control"])
def test_the_fit_names_the_teacher_and_its_step_size(teacher):
    ep = simulate(teacher, H=60, T=120, seed=11)
    v = BF.fit_behaviour(ep, split_seed=0, candidates=FAST[:2] if teacher == "q_learning" else FAST[::2], bootstrap=200,
                         fit_resamples=20)
    alpha = v["candidates"][teacher]["params"]["alpha"]
    assert v["verdict"]["label"] == teacher, v["verdict"]["text"]
    assert abs(alpha["value"] - 0.3) < 0.2 * 0.3
    assert alpha["ci"][0] <= alpha["value"] <= alpha["ci"][1]
    for b in BF.BASELINES:
        assert v["verdict"]["checks"][b]["passes"]


@pytest.mark.parametrize("decoy", ["perseverate", "fixed", "cycle"])
def test_decoys_fit_none(decoy):
    ep = simulate(decoy, H=40, T=80, seed=12)
    v = BF.fit_behaviour(ep, split_seed=0, candidates=["q_learning", "mc_control"], bootstrap=200, fit_resamples=0)
    assert v["verdict"]["label"] == "none fits", v["verdict"]["text"]
    assert not v["verdict"]["clear"] and v["verdict"]["best"] is None
    if decoy == "fixed":  # a fixed policy drawn per history: the within-history frequency refuses it by a wide
        hf = v["verdict"]["checks"]["history_frequency"]  # margin (measured -0.19 [-0.28, -0.11] nats per step), not
        assert hf["ci"][1] < -0.05, hf  # narrowly (it beat the action-sequence baseline by +0.006 [-0.013, 0.026])


@pytest.mark.slow
@pytest.mark.parametrize("teacher", ["q_learning", "sarsa", "mc_control"])
def test_full_size_known_answers(teacher):
    ep = simulate(teacher, H=200, T=200, seed=21)
    v = BF.fit_behaviour(ep, split_seed=1)
    assert v["verdict"]["label"] == teacher, v["verdict"]["text"]
    assert abs(v["candidates"][teacher]["params"]["alpha"]["value"] - 0.3) < 0.2 * 0.3


@pytest.mark.slow
@pytest.mark.parametrize("decoy", ["perseverate", "fixed", "cycle"])
def test_full_size_decoys(decoy):
    v = BF.fit_behaviour(simulate(decoy, H=200, T=200, seed=22), split_seed=1)
    assert v["verdict"]["label"] == "none fits", v["verdict"]["text"]


# ------------------------------------------------------------------ the parts
def test_split_is_disjoint_and_covers_every_history():
    for n, f in ((4, 0.3), (10, 0.5), (101, 0.3)):
        train, test = BF.split(n, f, seed=3)
        assert np.intersect1d(train, test).size == 0
        assert np.union1d(train, test).tolist() == list(range(n))
        assert train.size >= 2 and test.size >= 2
    a, b = BF.split(50, 0.3, 0), BF.split(50, 0.3, 1)
    assert not np.array_equal(a[1], b[1])  # the seed moves the split


def test_held_out_score_is_the_candidates_log_likelihood_on_the_held_out_histories():
    from icrl_interp.tasks import learners

    ep = simulate("q_learning", H=12, T=40, seed=5)
    v = BF.fit_behaviour(ep, split_seed=2, candidates=["q_learning"], bootstrap=100, fit_resamples=0)
    held = v["histories"]["held_out_indices"]
    assert v["histories"]["train"] + len(held) == ep.n_histories
    p = {k: x["value"] for k, x in v["candidates"]["q_learning"]["params"].items()}
    lp = learners.replay("q_learning", ep.select(held), **p).log_prob
    assert v["candidates"]["q_learning"]["held_out_loglik"] == pytest.approx(lp.mean(), rel=1e-12)
    train = [h for h in range(ep.n_histories) if h not in held]
    lp_train = learners.replay("q_learning", ep.select(train), **p).log_prob
    assert v["candidates"]["q_learning"]["train_loglik"] == pytest.approx(lp_train.mean(), rel=1e-9)
    # the within-history baseline: fitted on the training histories only, scored on the held-out ones
    tr, te = ep.select(train), ep.select(held)
    c = BF.fit_history_frequency(tr, BF.targets(tr))
    hf = v["baselines"]["history_frequency"]
    assert hf["params"] == {"c_state": c[0], "c_history": c[1]}  # the same call on the same arrays: exact
    held_ll = BF.history_frequency_loglik(te, BF.targets(te), *c).sum() / te.valid.sum()
    assert hf["held_out_loglik"] == pytest.approx(held_ll, rel=1e-12)
    grid = np.asarray(BF.CONCENTRATIONS)  # the fit is a maximum: no grid point does better on the training histories
    best = BF.history_frequency_loglik(tr, BF.targets(tr), *c).sum()
    for cs in grid:
        assert BF.history_frequency_loglik(tr, BF.targets(tr), cs, grid).sum(-1).max() <= best + 1e-9 * abs(best)


def test_history_frequency_by_hand():
    """One history, two observations, two actions, c_state 1, c_history 2: the predictive probabilities counted by
    hand from the actions BEFORE each step (a count that includes the step's own action, or that mixes the
    observations, or that counts the weights instead of the history's actions, gives other numbers)."""
    o, a = np.array([[0, 0, 1, 0]]), np.array([[1, 1, 0, 0]])
    z = np.zeros_like(o)
    ep = Episodes(observations=o, actions=a, rewards=z.astype(float), next_observations=z,
                  terminations=z.astype(bool), truncations=z.astype(bool), valid=np.ones(o.shape, bool),
                  n_actions=2, n_observations=2)
    # p_t(0), p_t(1): t0 no counts (1/2, 1/2); t1 history (0, 1) -> (1/3, 2/3), obs 0 (0, 1) -> (1/6, 5/6);
    # t2 obs 1 unseen -> history (0, 2): (1/4, 3/4); t3 history (1, 2) -> (2/5, 3/5), obs 0 (0, 2) -> (2/15, 13/15)
    p = np.array([[1 / 2, 1 / 2], [1 / 6, 5 / 6], [1 / 4, 3 / 4], [2 / 15, 13 / 15]])
    got = BF.history_frequency_loglik(ep, BF.targets(ep), 1.0, 2.0)
    assert got.shape == (1,)
    assert got[0] == pytest.approx(np.log(p[np.arange(4), a[0]]).sum(), rel=1e-14)
    soft = np.tile([0.25, 0.75], (1, 4, 1))
    got = BF.history_frequency_loglik(ep, BF.targets(ep, soft), 1.0, 2.0)
    assert got[0] == pytest.approx((soft[0] * np.log(p)).sum(), rel=1e-14)
    total, state = BF.history_counts(ep)
    assert total[0, 3].tolist() == [1.0, 2.0] and state[0, 3].tolist() == [0.0, 2.0]  # counts of 0/1: exact


def test_baselines_by_hand():
    """Two observations, two actions: the baselines' held-out log-likelihoods counted by hand."""
    def ep(obs, act):
        o, a = np.array(obs), np.array(act)
        z = np.zeros_like(o)
        return Episodes(observations=o, actions=a, rewards=z.astype(float), next_observations=z,
                        terminations=z.astype(bool), truncations=z.astype(bool), valid=np.ones(o.shape, bool),
                        n_actions=2, n_observations=2)
    train, test = ep([[0, 0, 1]], [[1, 1, 0]]), ep([[0, 1]], [[1, 1]])
    b = BF.baseline_logliks(train, BF.targets(train), test, BF.targets(test))
    assert b["uniform"][0] == pytest.approx(2 * math.log(0.5), rel=1e-15)
    # static: obs 0 -> counts (1, 3) with add-one, obs 1 -> (2, 1)
    assert b["static"][0] == pytest.approx(math.log(3 / 4) + math.log(1 / 3), rel=1e-14)
    # sequence: (start, 0) -> a=1 once: (1, 2); (a=1, 0) -> a=1 once: (1, 2); (a=1, 1) -> a=0 once: (2, 1)
    assert b["action_sequence"][0] == pytest.approx(math.log(2 / 3) + math.log(1 / 3), rel=1e-14)
    probs = np.zeros((1, 2, 2))
    probs[0, :, 0] = 0.25
    probs[0, :, 1] = 0.75
    w = BF.targets(test, probs)
    assert BF.baseline_logliks(train, BF.targets(train), test, w)["static"][0] == pytest.approx(
        0.25 * math.log(1 / 4) + 0.75 * math.log(3 / 4) + 0.25 * math.log(2 / 3) + 0.75 * math.log(1 / 3), rel=1e-14)


@pytest.mark.parametrize("which", BF.BASELINES)
def test_every_baseline_can_veto_the_winner(which):
    """A best candidate that does not beat one baseline is 'none fits', whichever baseline it is."""
    rng = np.random.default_rng(0)
    names = ["x", "y"]
    R, B = 2000, len(BF.BASELINES)
    noise = 0.01 * rng.normal(size=(R, 2 + B))
    mean = np.array([-1.0, -1.2] + [-2.0] * B)
    mean[2 + BF.BASELINES.index(which)] = -0.9
    d = BF.decide(names, mean, mean + noise, 1 + B, 50, 0.3)
    assert d["label"] == "none fits" and not d["fits"]
    mean[2 + BF.BASELINES.index(which)] = -2.0
    d = BF.decide(names, mean, mean + noise, 1 + B, 50, 0.3)
    assert d["label"] == "x" and d["clear"]
    for c in d["checks"].values():  # Bonferroni over 1 + B comparisons: wider than the plain 95 % interval
        assert c["ci_adjusted"][0] < c["ci"][0] and c["ci_adjusted"][1] > c["ci"][1]


def test_indistinguishable_pair_and_nested_rule():
    rng = np.random.default_rng(1)
    names = ["sarsa", "expected_sarsa", "sarsa_lambda"]
    B = len(BF.BASELINES)
    mean = np.array([-1.0, -1.001, -0.9999] + [-2.0] * B)
    boot = mean + 0.01 * rng.normal(size=(4000, 3 + B))
    d = BF.decide(names, mean, boot, 2 + B, 50, 0.3, reduces={"sarsa_lambda": "sarsa"})
    assert d["label"] == "sarsa" and "sarsa_lambda" in d["equivalent"] and not d["clear"]
    assert d["pairs"][0]["indistinguishable"] and "indistinguishable here from expected_sarsa" in d["text"]
    assert d["more_histories"] is not None
    d = BF.decide(names, mean, boot, 2 + B, 50, 0.3)
    assert d["label"] == "sarsa_lambda"


def test_action_probs_refusals():
    ep = simulate("fixed", H=4, T=5, seed=0)
    with pytest.raises(UserError, match="action_probs has shape"):
        BF.targets(ep, np.ones((4, 5, 2)))
    with pytest.raises(UserError, match="sum to 1"):
        BF.targets(ep, np.ones((4, 5, 3)))
    with pytest.raises(UserError, match="at least 4 histories"):
        BF.fit_behaviour(simulate("fixed", H=3, T=5, seed=0))


def test_one_hot_action_probs_fit_as_the_actions():
    """A model's action probabilities that are one-hot on the episodes' actions give the actions' fit, number
    for number; soft probabilities change the score (the expected log-likelihood)."""
    ep = simulate("q_learning", H=10, T=40, seed=6)
    kw = dict(split_seed=0, candidates=["q_learning"], bootstrap=100, fit_resamples=0)
    a = BF.fit_behaviour(ep, **kw)
    b = BF.fit_behaviour(ep, action_probs=np.eye(A)[ep.actions], **kw)
    assert a["fitted_to"] == "actions" and b["fitted_to"] == "action_probs"
    for v in (a, b):
        del v["candidates"]["q_learning"]["fit_seconds"]
    assert a["candidates"] == b["candidates"] and a["baselines"] == b["baselines"]  # the same sums: exact
    soft = 0.5 * np.eye(A)[ep.actions] + 0.5 / A
    c = BF.fit_behaviour(ep, action_probs=soft, **kw)
    assert c["baselines"]["uniform"]["held_out_loglik"] == pytest.approx(-math.log(A), rel=1e-14)
    assert c["candidates"]["q_learning"]["held_out_loglik"] < a["candidates"]["q_learning"]["held_out_loglik"]


def test_rules_with_identical_choices_are_named_together():
    """Rules whose held-out choices are identical (every rule on a bandit) are one answer: the text names them
    all, so a `clear` label is never read as one rule beating its exact equivalents."""
    rng = np.random.default_rng(2)
    names = ["q_learning", "sarsa", "mc_control"]
    col = rng.normal(size=3000)
    B = len(BF.BASELINES)
    boot = np.stack([-1.0 + 0.01 * col, -1.0 + 0.01 * col, -1.3 + 0.01 * rng.normal(size=3000),
                     *(-2.0 + 0.01 * rng.normal(size=(B, 3000)))], 1)
    d = BF.decide(names, boot.mean(0), boot, 2 + B, 50, 0.3)
    assert d["label"] == "q_learning" and d["equivalent"] == ["sarsa"] and d["runner_up"] == "mc_control"
    assert "identical action probabilities here to sarsa" in d["text"]
