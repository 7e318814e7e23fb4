"""The episode zoo: its exact teachers against the candidates' own code (`tasks/learners.py`), the decoys'
defining properties, the scoring of the verdict's answers, and the runner (rows, resume, JSON)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from icrl_interp.core.errors import UserError  # noqa: E402
from icrl_interp.tasks import learners  # noqa: E402
from icrl_interp.tasks.environments import env_from_spec  # noqa: E402
from icrl_interp.zoo import episode_teachers as T  # noqa: E402
from icrl_interp.zoo import episode_zoo as Z  # noqa: E402

TEACHERS = [e for e in Z.ENTRIES if not e.truth.decoy and e.env == Z.LEDGE]
BANDIT = next(e for e in Z.ENTRIES if e.env == Z.BANDIT)
DECOYS = [e for e in Z.ENTRIES if e.truth.decoy]
EPS = 64 * np.finfo(np.float64).eps
"""Q-values of order 1 summed over a few hundred updates in another order: agreement to well below 1e-12."""


# ------------------------------------------------------------------ teachers vs the candidates' code
@pytest.mark.parametrize("entry", TEACHERS, ids=lambda e: e.name)
def test_replaying_a_teachers_history_gives_the_values_and_log_probs_it_acted_with(entry):
    short = replace(entry, env_kwargs={**entry.env_kwargs, "horizon": 6})  # time limits hit often
    eps, q, log_prob = Z.generate(short, histories=4, steps=150, seed=3, trace=True)
    assert eps.terminations.sum() >= 8 and eps.truncations.sum() >= 8  # both kinds of episode end are exercised
    r = learners.replay(entry.truth.rule, eps, **entry.truth.params)
    assert np.abs(r.q - q).max() <= 1e-12 and np.abs(r.log_prob - log_prob).max() <= 1e-12
    assert np.abs(q).max() > 0.1  # it learned something: the comparison is not of zero tables
    other = Z.TWIN[1] if entry.truth.rule == Z.TWIN[0] else Z.TWIN[0]
    wrong = learners.replay(other, eps, **entry.truth.params)  # the check can tell the rules apart
    assert np.abs(wrong.q - q).max() > 1e-6


def test_on_a_bandit_the_one_step_rules_and_monte_carlo_coincide():
    """The premise of the bandit entry (every step ends its episode): the four rules replay to the same values."""
    eps, q, log_prob = Z.generate(BANDIT, histories=4, steps=60, seed=0, trace=True)
    assert len({tuple(t["probs"]) for t in eps.meta["tasks"]}) == 4  # a task per history
    for rule in (learners.q_learning, learners.sarsa, learners.expected_sarsa, learners.mc_control):
        r = learners.replay(rule.__name__, eps, **BANDIT.truth.params)
        assert np.abs(r.q - q).max() <= 1e-12 and np.abs(r.log_prob - log_prob).max() <= 1e-12


def test_teachers_draw_their_actions_from_the_softmax_they_report():
    """Kills a teacher acting greedily (or by another temperature): per action, the number of times it was chosen
    matches the sum of the probabilities softmax(beta Q) gave it, within 4 standard errors."""
    e = Z.entry(f"{learners.q_learning.__name__}_a0.5")
    eps, q, _ = Z.generate(e, histories=12, steps=150, seed=5, trace=True)
    p = learners.policy(q, e.truth.params["beta"]).reshape(-1, eps.n_actions)
    chosen = np.eye(eps.n_actions)[eps.actions.ravel()]
    greedy = np.eye(eps.n_actions)[q.reshape(-1, eps.n_actions).argmax(1)]
    se = np.sqrt((p * (1 - p)).sum(0))
    assert np.all(np.abs(chosen.sum(0) - p.sum(0)) <= 4 * se)
    assert (chosen * greedy).sum() < 0.9 * len(chosen)  # not greedy: the test above has power against it
    assert np.any(np.abs(greedy.sum(0) - p.sum(0)) > 4 * se)


def test_histories_are_seeded_one_by_one():
    e = TEACHERS[0]
    a = Z.generate(e, histories=3, steps=40, seed=9)
    b = Z.generate(e, histories=5, steps=40, seed=9)
    np.testing.assert_array_equal(a.actions, b.actions[:3])  # exact: the same draws
    assert not np.array_equal(b.actions[0], b.actions[1])


# ------------------------------------------------------------------ decoys
def _actions(agent, steps=120, seed=0, **env_kwargs):
    env = env_from_spec(Z.LEDGE, **{**Z.LEDGE_KWARGS, **env_kwargs})
    return T.run_history(env, agent, steps, seed, 0)


def test_perseverating_repeats_its_first_action_and_cycling_counts_up():
    firsts = set()
    for h in range(8):
        p = T.run_history(env_from_spec(Z.LEDGE, **Z.LEDGE_KWARGS), T.Perseverating(), 60, 0, h)
        assert np.all(p["actions"] == p["actions"][0])
        firsts.add(int(p["actions"][0]))
        c = T.run_history(env_from_spec(Z.LEDGE, **Z.LEDGE_KWARGS), T.Cycling(), 60, 0, h)
        np.testing.assert_array_equal(c["actions"], (c["actions"][0] + np.arange(60)) % 4)
    assert len(firsts) > 1  # the first action is drawn per history


@pytest.mark.parametrize("make", [T.FixedPolicy, T.Perseverating, T.Cycling], ids=lambda m: m.__name__)
def test_reward_blind_decoys_act_the_same_whatever_the_rewards(make):
    """Kills a decoy that secretly learns: the same dynamics with other rewards give the same actions."""
    a = _actions(make())
    b = _actions(make(), goal_reward=-3.0, ledge_reward=2.0, step_reward=0.5)
    assert not np.array_equal(a["rewards"], b["rewards"])
    np.testing.assert_array_equal(a["actions"], b["actions"])
    np.testing.assert_array_equal(a["observations"], b["observations"])


def test_fixed_policy_is_one_policy_for_every_history():
    e = Z.entry("decoy_fixed_policy")
    eps = Z.generate(e, histories=30, steps=100, seed=1)
    policy = T.FixedPolicy(0)
    policy.start(eps.n_observations, eps.n_actions, np.random.default_rng(0))
    start = eps.observations == eps.observations[0, 0]
    counts = np.bincount(eps.actions[start], minlength=eps.n_actions)
    p = policy.policy[eps.observations[0, 0]]
    se = np.sqrt(start.sum() * p * (1 - p))
    assert np.all(np.abs(counts - start.sum() * p) <= 4 * se)


def test_final_policy_acts_by_the_optimal_values_and_learns_nothing():
    env = env_from_spec(Z.LEDGE, **Z.LEDGE_KWARGS)
    nxt, rew, term = env.unwrapped.model()  # the environment's own tables: an independent check of the search
    q = np.zeros(rew.shape)
    for _ in range(500):
        q = rew + Z.GAMMA * np.where(term, 0.0, q.max(1)[nxt])
    e = Z.entry("decoy_final_policy")
    eps, trace, _ = Z.generate(e, histories=3, steps=120, seed=2, trace=True)
    np.testing.assert_allclose(trace, q[eps.observations], rtol=0, atol=1e-10)  # the same Q* at every step
    teacher = Z.generate(TEACHERS[0], histories=3, steps=120, seed=2)
    assert eps.rewards[:, :40].mean() > teacher.rewards[:, :40].mean()  # it acts well from the start


# ------------------------------------------------------------------ scoring
def _fit(label, clear=False, alpha=None, indistinguishable=True):
    cands = {} if alpha is None else {label: {"params": {"alpha": {"value": alpha, "ci": [alpha / 2, alpha * 2]}}}}
    pairs = [{"candidates": list(Z.TWIN), "indistinguishable": indistinguishable}]
    return {"verdict": {"label": label, "clear": clear, "pairs": pairs}, "candidates": cands}


def test_score_names_alpha_and_clear_wrong():
    s, e = Z.TWIN
    truth = Z.Truth(s, {"alpha": 0.3, "gamma": 0.9, "beta": 3.0})
    assert Z.score(truth, _fit(s, True, 0.33), None)["right"]
    assert not Z.score(truth, _fit(s, True, 0.37), None)["right"]  # 23 % off
    wrong = Z.score(truth, _fit(learners.q_learning.__name__, True, 0.3), None)
    assert not wrong["named_right"] and wrong["clear_wrong"]
    same = {"twin": e, "differ": False}
    assert Z.score(truth, _fit(e, False, 0.3), same)["named_right"]  # the twins where the data cannot tell them
    assert not Z.score(truth, _fit(e, False, 0.3), {"twin": e, "differ": True})["named_right"]
    assert not Z.score(truth, _fit(e, False, 0.3, indistinguishable=False), same)["named_right"]
    equivalent = _fit(learners.q_learning.__name__, False, 0.3)
    assert not Z.score(truth, equivalent, None)["named_right"]
    equivalent["verdict"]["equivalent"] = [s, e]  # identical choices on these histories
    assert Z.score(truth, equivalent, None)["right"]
    decoy = Z.Truth("cycling", decoy=True)
    assert Z.score(decoy, _fit("none fits"), None)["right"]
    bad = Z.score(decoy, _fit(learners.q_learning.__name__, True), None)
    assert not bad["right"] and bad["clear_wrong"]


def test_twin_gap_sees_the_rules_differ_on_their_own_histories():
    e = Z.entry(f"{Z.TWIN[1]}_a0.3")
    eps = Z.generate(e, histories=24, steps=150, seed=0)
    g = Z.twin_gap(eps, e.truth, 0, bootstrap=200)  # positive (a KL in expectation) on each of 5 seeds tried
    assert g["twin"] == Z.TWIN[0] and g["loglik_gap_per_step"] > 0 and g["mean_tv"] > 0
    assert Z.twin_gap(eps, Z.Truth("cycling", decoy=True), 0) is None


# ------------------------------------------------------------------ the runner and its command
def test_command_line_runs_the_episode_set_resumes_and_refuses_a_foreign_directory(tmp_path, monkeypatch, capsys):
    from icrl_interp import cli
    from icrl_interp.verdicts import behaviour_fit

    real = Z.run_episode_zoo
    monkeypatch.setattr(behaviour_fit, "CANDIDATES", (learners.q_learning.__name__,))  # a fast fit
    monkeypatch.setattr(Z, "run_episode_zoo", lambda out, seed, progress: real(
        out, histories=6, steps=30, seed=seed, only=["decoy_perseverating"], bootstrap=40, fit_resamples=0))
    argv = ["zoo", "run", "--set", "episodes", "--out", str(tmp_path / "z"), "--no-progress"]
    assert cli.main(argv) == 0
    assert "decoys 'none fits' 1/1" in capsys.readouterr().out
    row = json.loads((tmp_path / "z" / "rows" / "decoy_perseverating.json").read_text())
    out = json.loads((tmp_path / "z" / "episode_zoo.json").read_text())
    assert out["schema"] == Z.SCHEMA and out["rows"] == [row] and row["verdict"]["label"] == "none fits"
    assert out["summary"]["decoys_none_fits"] == 1 and out["confusion"]["counts"] == [[1]]
    monkeypatch.setattr(Z, "judge", lambda *a: pytest.fail("a stored row was judged again"))
    assert cli.main(argv) == 0  # resumed: the stored row is reused
    with pytest.raises(UserError, match="no episode-zoo entry"):
        real(tmp_path / "z", only=["nope"])
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert cli.main(["zoo", "run", "--set", "episodes", "--out", str(foreign)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a zoo directory" in err and len(err.splitlines()) == 1
    assert (foreign / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_episode_zoo_names_a_teacher_and_refuses_a_decoy(tmp_path):
    """Two rows of the measured zoo (docs/zoo.md, "Episode zoo"), at its size: 4 minutes here, at a load of 6."""
    out = Z.run_episode_zoo(tmp_path, histories=200, steps=400, seed=0,
                            only=[f"{learners.q_learning.__name__}_a0.5", "decoy_final_policy"])
    teacher, decoy = out["rows"]
    assert teacher["score"]["right"], teacher["verdict"]
    assert decoy["score"]["right"] and out["summary"]["clear_wrong"] == 0

