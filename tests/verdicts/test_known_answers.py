"""Known answers of the verdict's truth-telling (issue 24): fitted gamma' with intervals, reward regression,
steps per layer, decoy explanations, Bonferroni-adjusted decisions, "how many more tasks", the refits'
intervals and the out-of-distribution checks. Each test names the mutant it kills.

Targets are built in numpy from the prompts' transitions: a TD(0) teacher with discount 0.5 on gamma = 0.9
tasks, an immediate-reward teacher (TD with gamma' = 0), a teacher running 4 TD(0) steps per layer, and a
copy of the last reward. Small runs (120 tasks, 30 refits, a few candidates) keep the file fast.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from icrl_interp.families import linear_td, registry
from icrl_interp.tasks import envs
from icrl_interp.verdicts import behaviour as VD
from icrl_interp.verdicts import candidates as C
from icrl_interp.verdicts import decoys as D
from icrl_interp.verdicts import ood as O

CANDS = ["td0", "td_lambda_0.5", "mc_regression", "lstd"]
EPS = np.finfo(np.float64).eps


def _data(tasks=120, n=10, seed=0):
    rng = np.random.default_rng(seed)
    mrp = envs.sample_boyan_chains(tasks, 6, 3, 0.9, rng, "random", 1.0, "uniform")
    p = linear_td.prompt_from_mrp(mrp, mrp.sample(n, rng), rng.integers(0, 6, size=tasks))
    return VD.VerdictData(z=p.z, layout=p.layout, gamma=0.9, task_id=np.arange(tasks),
                          hints=registry.get("linear-td").hints, readouts={}, output=np.zeros((tasks, 1)),
                          readout_kind="layout", states=p.states, task_family="linear-td")


def _teacher(tr: C.Transitions, alpha: float, gamma: float, k: int) -> np.ndarray:
    """k steps of batch TD(0) with discount `gamma`, written here (not with candidates.py): w_0 = 0,
    w += (alpha / n) sum_i (r_i + gamma w.phi'_i - w.phi_i) phi_i; the output w.phi_q."""
    B, n, d = tr.phi.shape
    w = np.zeros((B, d))
    for _ in range(k):
        delta = tr.rewards + gamma * np.einsum("bnd,bd->bn", tr.phi_next, w) - np.einsum("bnd,bd->bn", tr.phi, w)
        w = w + alpha / n * np.einsum("bn,bnd->bd", delta, tr.phi)
    return np.einsum("bd,bd->b", w, tr.phi_query)[:, None]


def _judge(make, layers=1, **kw):
    data = _data()
    tr = VD.transitions(data)
    data.readouts = {l: make(tr, l) for l in range(layers)}
    data.output = data.readouts[layers - 1]
    return VD.run(data, candidates=CANDS, resamples=100, fit_resamples=30, **kw)


def test_a_td0_teacher_with_discount_half_gets_gamma_half_not_the_tasks():
    """Mutants: gamma' not fitted (the grid without it, or `candidates.run` ignoring hyper['gamma']): td0 at
    gamma 0.9 cannot match, and the label and interval say 0.9."""
    v = _judge(lambda tr, l: _teacher(tr, 0.5, 0.5, 3), steps=4)["verdict"]
    assert v["best"] == "td0" and v["fits"]
    half = C.gamma_spacing(0.9)  # every refit agrees on the grid value 0.5; the interval reaches half a spacing
    assert v["params"]["gamma"]["value"] == 0.5  # exact: a grid value
    np.testing.assert_allclose(v["params"]["gamma"]["ci"], [0.5 - half, 0.5 + half], rtol=0, atol=64 * EPS)
    assert v["params"]["step"]["value"] == 3 and v["params"]["lambda"]["value"] == 0.0
    lo, hi = v["params"]["alpha"]["ci"]
    assert lo <= 0.5 <= hi and hi / lo < 1.05  # 0.5 is between grid points: the interval holds it, narrowly
    assert v["label"] == "td0" and v["text"].startswith("td0 with discount 0.5 [0.458333, 0.541667] (the task's: 0.9)")


def test_a_discount_between_the_grid_values_is_fitted_between_them_and_covered():
    """Mutants: no `refined_gammas` (gamma' 0.7 fitted as the grid's 0.75, with an interval that misses 0.7), the
    interval not widened by `gamma_spacing`, refinement on the wrong side of the best grid value."""
    v = _judge(lambda tr, l: _teacher(tr, 0.5, 0.7, 3), steps=4)["verdict"]
    assert v["best"] == "td0" and v["fits"]
    g = v["params"]["gamma"]
    assert abs(g["value"] - 0.7) <= C.gamma_spacing(0.9) and g["value"] not in C.gamma_grid(0.9)
    assert g["ci"][0] <= 0.7 <= g["ci"][1] and g["ci"][1] - g["ci"][0] < 0.25  # covered, narrower than a grid gap


def test_refined_gammas_cut_each_gap_next_to_the_best_evenly():
    """Mutants: the neighbours' gaps not cut evenly, the best value itself repeated, a far gap refined."""
    grid = C.gamma_grid(0.9)  # 0, 0.25, 0.5, 0.75, 0.9
    np.testing.assert_allclose(C.refined_gammas(grid, [2]), [1 / 3, 5 / 12, 7 / 12, 2 / 3], rtol=0, atol=4 * EPS)
    np.testing.assert_allclose(C.refined_gammas(grid, [0]), [1 / 12, 1 / 6], rtol=0, atol=4 * EPS)
    assert C.gamma_spacing(0.9) == pytest.approx(0.25 / 3 / 2, abs=4 * EPS)


def test_an_immediate_reward_teacher_is_reward_regression_never_td():
    """Mutants: `label` ignoring gamma' = 0 (or its interval) calls it td0; the top-level best not renamed."""
    v = _judge(lambda tr, l: _teacher(tr, 1.0, 0.0, 3), steps=4)["verdict"]
    assert v["best"] == VD.REWARD_REGRESSION and v["label"] == VD.REWARD_LABEL and v["fits"]
    assert v["params"]["gamma"]["value"] == 0.0 and v["params"]["gamma"]["ci"][0] == 0.0
    assert v["text"].startswith("reward regression (no bootstrapping)")
    # td_lambda_0.5 at gamma' = 0 has traces e_i = phi_i: the same predictions, an equivalent, not a runner-up
    assert "td_lambda_0.5" in v["equivalent"] and v["runner_up"] not in ("td0", "td_lambda_0.5")


def test_four_steps_per_layer_are_found_with_intervals_and_grow():
    """Layer l runs 4 (l + 1) TD(0) steps. Mutants: no doubling of the step budget when the best candidate
    needs all of it (2 L + 2 = 6 < 8 cuts the last layer); the step read off the wrong axis of the flattened
    grid; `growth` on the points alone."""
    v = _judge(lambda tr, l: _teacher(tr, 0.3, 0.9, 4 * (l + 1)), layers=2)
    assert v["settings"]["max_steps"] == 12  # 6, doubled once
    g = v["step_growth"]["td0"]
    assert g["steps"] == [4, 8] and g["step_ci"] == [[4.0, 4.0], [8.0, 8.0]] and g["grows_with_layer"] is True
    assert g["steps_per_layer"] == {"value": 4.0, "ci": [4.0, 4.0]}
    assert v["verdict"]["params"]["step"] == {"value": 8, "ci": [8.0, 8.0]}
    assert v["verdict"]["params"]["steps_per_layer"] == g["steps_per_layer"]


def test_copy_of_the_last_reward_fits_no_candidate_and_is_its_own_decoy():
    """Mutant: the decoy reads r_0 instead of r_{n-1} (its R^2 would not be 1)."""
    v = _judge(lambda tr, l: 2.0 * tr.rewards[:, -1:])
    assert v["verdict"]["best"] is None and v["verdict"]["label"] == "none fits" and not v["verdict"]["clear"]
    assert v["output"]["baselines"]["decoys"]["last_reward"]["r2"] == pytest.approx(1.0, abs=1e-9)


def test_decoy_features_by_hand():
    """One prompt, n = 3, gamma 0.5: r = (1, 2, 4), states phi = (a, b, a), query a. Mutants: mean without
    1 / (1 - gamma); the discounted sum in reverse order; the lookup averaging every column."""
    a, b = [1.0, 0.0], [0.0, 1.0]
    tr = C.Transitions(np.array([[a, b, a]]), np.zeros((1, 3, 2)), np.array([[1.0, 2.0, 4.0]]), 0.5,
                       phi_query=np.array([a]))
    f = D.features(tr)
    assert list(f) == list(D.NAMES)
    np.testing.assert_allclose([f[k][0] for k in D.NAMES], [4.0, 14 / 3, 1 + 1 + 1, 2.5], rtol=4 * EPS)
    miss = D.features(replace(tr, phi_query=np.array([[0.5, 0.5]])))
    assert miss["nearest_state"][0] == pytest.approx(7 / 3, rel=4 * EPS)  # no column matches: the mean reward
    assert D.features(replace(tr, phi_query=None)) == {}  # a control task outputs parameters: no decoys


def _boot(*cols):
    return np.stack([np.asarray(c, dtype=np.float64) for c in cols], 1)


def test_clear_needs_beating_every_decoy_and_the_input():
    """Mutant: the decoy (or input) checks left out of `clear`."""
    best, other = np.full(1001, 0.9), np.full(1001, 0.5)
    ok = VD.decide(["a", "b"], np.array([0.9, 0.5]), _boot(best, other), 0.2, np.full(1001, 0.2), 0.5,
                   decoys={"last_reward": (0.3, np.full(1001, 0.3))})
    assert ok["clear"] and all(c["passes"] for c in ok["checks"].values())
    spread = np.linspace(0.7, 1.1, 1001)  # a decoy as good as the winner on some resamples
    dec = VD.decide(["a", "b"], np.array([0.9, 0.5]), _boot(best, other), 0.2, np.full(1001, 0.2), 0.5,
                    decoys={"nearest_state": (0.88, spread)})
    assert dec["fits"] and not dec["clear"] and not dec["checks"]["nearest_state"]["passes"]
    assert "does not beat nearest_state" in dec["text"]
    inp = VD.decide(["a", "b"], np.array([0.9, 0.5]), _boot(best, other), 0.85, spread, 0.5)
    assert not inp["clear"] and not inp["checks"]["input_ridge"]["passes"]


def test_the_decision_is_bonferroni_adjusted():
    """A margin whose plain 95 % interval lies above 0 but whose interval at 2.5 / 20 % does not: clear with
    one comparison, not with 20. Mutants: `comparisons` ignored; the tail 2.5 / m -> 5 / m."""
    margin = np.linspace(-0.005, 0.395, 100001)  # percentiles: 2.5 % -> 0.005, 0.125 % -> -0.0045
    b = _boot(0.5 + margin, np.full(margin.size, 0.5))
    one = VD.decide(["a", "b"], np.array([0.7, 0.5]), b, np.nan, np.zeros(margin.size), 0.5)
    assert one["clear"]
    m20 = VD.decide(["a", "b"], np.array([0.7, 0.5]), b, np.nan, np.zeros(margin.size), 0.5, comparisons=20,
                    n_tasks=40)
    assert not m20["clear"] and m20["comparisons"] == 20
    lo, hi = m20["margin_ci_adjusted"]
    assert lo == pytest.approx(-0.005 + 0.4 * 0.00125, abs=1e-9)
    assert hi == pytest.approx(0.395 - 0.4 * 0.00125, abs=1e-9)
    assert VD.adjusted(margin, 10) == pytest.approx([-0.005 + 0.4 * 0.0025, 0.395 - 0.4 * 0.0025], abs=1e-9)
    assert VD.adjusted_resamples(20, 1000) == 8000 and VD.adjusted_resamples(1, 1000) == 1000


def test_more_tasks_scales_the_interval_width_by_the_square_root():
    """h = 0.2 at d = 0.1 on 50 tasks: (h / d)^2 = 4 times the tasks. Mutants: (h / d) not squared; a failing
    difference at or below 0 given a number (more tasks cannot make it positive)."""
    failing = {"runner_up": {"difference": 0.1, "ci_adjusted": [-0.1, 0.3], "passes": False}}
    assert VD.more_tasks(failing, 50) == {"held_out_tasks_now": 50, "held_out_tasks_needed": 200}
    assert VD.more_tasks({"x": {"difference": -0.01, "ci_adjusted": [-0.2, 0.18], "passes": False}}, 50) is None
    margin = np.linspace(-0.005, 0.395, 100001)
    b = _boot(0.5 + margin, np.full(margin.size, 0.5))
    out = VD.decide(["a", "b"], np.array([0.7, 0.5]), b, np.nan, np.zeros(margin.size), 0.5, comparisons=20,
                    n_tasks=40)
    h = (out["margin_ci_adjusted"][1] - out["margin_ci_adjusted"][0]) / 2
    assert out["more_tasks"]["held_out_tasks_needed"] == int(np.ceil(40 * (h / 0.2) ** 2))
    assert "held-out tasks would likely resolve it" in out["text"]


def test_refit_intervals_are_outward_grid_quantiles_widened_to_ties():
    """Mutants: the 97.5 % quantile -> 95 % (drops the 3 % at 0.75); ties not widening; steps' interval."""
    s = np.r_[np.full(97, 0.5), np.full(3, 0.75)]
    f = C.Fit({"gamma": 0.5, "alpha": 1.0}, 2, 0.0, 1.0, {"gamma": s, "alpha": np.ones(100), "step": np.full(100, 2.0)})
    assert f.interval("gamma") == [0.5, 0.75] and f.interval("alpha") == [1.0, 1.0] and f.interval("step") == [2.0, 2.0]
    f.ties = {"gamma": [0.0, 0.99]}
    assert f.interval("gamma") == [0.0, 0.99]
    f.resolution = 1.5
    assert f.interval("alpha") == [1 / 1.5, 1.5]
    assert C.Fit({"alpha": 1.0}, 2, 0.0, 1.0).interval("alpha") is None  # no refits: no interval


def test_training_resamples_weigh_each_prompt_by_its_tasks_draws():
    """Mutant: counts indexed by prompt instead of by task."""
    task = np.array([5, 5, 9, 2, 9, 9])
    W = VD.train_resamples(task, 0, 40)
    assert W.shape == (40, 6)
    np.testing.assert_array_equal(W[:, 0], W[:, 1])  # exact: the same task's count
    np.testing.assert_array_equal(W[:, 2], W[:, 5])
    np.testing.assert_array_equal(W[:, [3, 0, 2]].sum(1), np.full(40, 3.0))  # 3 tasks drawn 3 times
    assert VD.train_resamples(task, 0, 0) is None


def test_the_refits_of_a_noisy_target_spread_and_cover_the_truth():
    """td0 (alpha 1, gamma 0.9, 2 steps) plus noise: the refits on resampled tasks vary (an interval, not a
    point) and hold the truth. Mutant: the resample weights not applied (every refit is the point fit)."""
    data = _data(tasks=80)
    tr = VD.transitions(data)
    y = _teacher(tr, 1.0, 0.9, 2)
    y = y + 0.5 * y.std() * np.random.default_rng(1).standard_normal(y.shape)
    W = VD.train_resamples(data.task_id, 0, 60)
    (f,) = C.fit(C.CANDIDATES["td0"], tr, y[None], 3, W)
    assert f.samples["alpha"].size == 60 and np.unique(f.samples["alpha"]).size > 1
    assert f.interval("alpha")[0] <= 1.0 <= f.interval("alpha")[1]
    assert f.interval("gamma")[0] <= 0.9 <= f.interval("gamma")[1]


def _ood_verdict(data, alpha=1.0, gamma=0.9, step=2):
    return {"verdict": {"candidate": "td0", "clear": True, "text": "td0"},
            "output": {"behaviour": {"td0": {"hyperparameters": {"alpha": alpha, "gamma": gamma}, "step": step,
                                             "r2": 1.0}}}}


def test_ood_a_model_that_runs_td_keeps_matching_and_a_saturating_one_does_not():
    """The 'model' runs TD(0) on the prompt it is given (reading the gamma phi' block as it comes); a second one
    clips its output at the in-distribution range. Mutants: the candidate's gamma' not moved with the prompt's
    gamma (the TD model fails 'gamma'); the R^2 threshold or the drop not checked (the clipped one passes)."""
    data = _data(tasks=60)
    test = np.arange(60) % 2 == 0

    def td(z):
        return C.td_lambda(VD.transitions(replace(data, z=z)), 1.0, 2).outputs[:, 2]

    v = _ood_verdict(data)
    ood = O.check(v, data, td, test, 0)
    assert set(ood["checks"]) == {"reward_scale", "shuffled_order", "gamma", "longer_context"}
    for k in ("reward_scale", "shuffled_order", "gamma"):
        assert ood["checks"][k]["r2"] == pytest.approx(1.0, abs=1e-9) and ood["checks"][k]["passes"], k
    longer = ood["checks"]["longer_context"]
    assert not longer["available"] and "no task config" in longer["reason"]
    assert ood["passes"] is True
    top = np.percentile(np.abs(td(data.z)), 95)
    clipped = O.check(v, data, lambda z: np.clip(td(z), -top, top), test, 0)
    assert not clipped["checks"]["reward_scale"]["passes"] and clipped["passes"] is False
    assert clipped["checks"]["shuffled_order"]["passes"]  # mostly in range: nearly TD
    O.apply(v, clipped)
    assert v["verdict"]["clear"] is False and "out of distribution (reward_scale)" in v["verdict"]["text"]


def test_ood_thresholds_are_frozen_and_both_apply():
    """Mutants: the minimum R^2 or the largest drop left out, or made strict."""
    assert (O.OOD_MIN_R2, O.OOD_MAX_DROP, O.REWARD_SCALE) == (0.5, 0.2, 3.0)
    assert O.passes(0.5, 0.7) and O.passes(0.85, 1.0)  # both bounds inclusive
    assert not O.passes(0.45, 0.6)  # a small drop, below the minimum
    assert not O.passes(0.7, 1.0)  # above the minimum, too far below in distribution
    assert not O.passes(None, 1.0) and not O.passes(0.9, None)


def test_growth_needs_the_first_layers_step_interval_below_the_last():
    """Mutant: `_grows` on the point steps alone (overlapping intervals would say it grows)."""
    assert VD._grows([1, 2, 3], [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]) is True
    assert VD._grows([1, 2, 3], [[1.0, 2.0], [2.0, 2.0], [2.0, 3.0]]) is False  # 2 is in both: not shown to grow
    assert VD._grows([1, 2, 3], [None, [2.0, 2.0], [3.0, 3.0]]) is False  # no interval: not shown
