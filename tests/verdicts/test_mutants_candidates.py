"""Hand-worked two-step cases of every linear candidate (candidates.py) and of the families' references
(families/*.py: their step counts), and the fit's choices, so that a one-line mutant (a sign, a step count,
a trace decay, a discount, a tie rule, a grid) fails a test.

The common case: one prompt, two context columns, d = 1: phi = (1, 2), phi' = (1, 0), r = (1, 0),
gamma = 0.5, alpha = 1, w_0 = 0, query phi_q = 1. Every number below is worked by hand (exact dyadic
fractions, so the comparisons are exact up to a few ulps).
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from icrl_interp.verdicts import candidates as C
from icrl_interp.tasks import reference
from icrl_interp.core.errors import UserError
from icrl_interp.families import linear_td, sarsa, softmax_td

TOL = 1e-14


def tr(**kw):
    return C.Transitions(np.array([[[1.0], [2.0]]]), np.array([[[1.0], [0.0]]]), np.array([[1.0, 0.0]]), 0.5,
                         phi_query=np.array([[1.0]]), **kw)


def test_td0_two_steps_by_hand():
    """w1 = (1/2)(1 . 1 + 0 . 2) = 0.5; delta(w1) = (1 + 0.25 - 0.5, 0 - 1) = (0.75, -1);
    w2 = 0.5 + (1/2)(0.75 - 2) = -0.125."""
    t = C.td_lambda(tr(), 1.0, 2)
    np.testing.assert_allclose(t.outputs[0, :, 0], [0.0, 0.5, -0.125], rtol=0, atol=TOL)
    np.testing.assert_allclose(t.internals["td_error"][0], [[1.0, 0.0], [0.75, -1.0], [1.0625, 0.25]], atol=TOL)
    np.testing.assert_allclose(t.internals["value"][0], [[0.0, 0.0], [0.5, 1.0], [-0.125, -0.25]], atol=TOL)
    np.testing.assert_allclose(C.td_lambda(tr(), 0.5, 1).outputs[0, :, 0], [0.0, 0.25], atol=TOL)  # alpha scales


def test_td0_from_a_starting_w0():
    """w0 = 1: delta = (1 + 0.5 - 1, 0 + 0 - 2) = (0.5, -2); w1 = 1 + (1/2)(0.5 - 4) = -0.75."""
    t = C.td_lambda(tr(w0=np.array([[1.0]])), 1.0, 1)
    np.testing.assert_allclose(t.outputs[0, :, 0], [1.0, -0.75], atol=TOL)


def test_td_lambda_half_two_steps_by_hand():
    """traces e = (1, 0.25 . 1 + 2) = (1, 2.25) (gamma lambda = 0.25); w1 = 0.5; w2 = 0.5 + (1/2)(0.75 - 2.25)."""
    np.testing.assert_allclose(tr().traces(0.5)[0, :, 0], [1.0, 2.25], atol=TOL)
    t = C.td_lambda(tr(), 1.0, 2, lam=0.5)
    np.testing.assert_allclose(t.outputs[0, :, 0], [0.0, 0.5, -0.25], atol=TOL)
    t1 = C.td_lambda(tr(), 1.0, 2, lam=1.0)  # e = (1, 2.5): w2 = 0.5 + (1/2)(0.75 - 2.5)
    np.testing.assert_allclose(t1.outputs[0, :, 0], [0.0, 0.5, -0.375], atol=TOL)


def test_residual_gradient_two_steps_by_hand():
    """D = phi - gamma phi' = (0.5, 2); w1 = (1/2)(1 . 0.5) = 0.25; delta(w1) = (1 + 0.125 - 0.25, -0.5);
    w2 = 0.25 + (1/2)(0.875 . 0.5 - 0.5 . 2) = -0.03125."""
    t = C.residual_gradient(tr(), 1.0, 2)
    np.testing.assert_allclose(t.outputs[0, :, 0], [0.0, 0.25, -0.03125], atol=TOL)


def test_mc_regression_two_steps_by_hand():
    """G = (1 + 0.5 . 0, 0) = (1, 0); w1 = (1/2)(1 . 1) = 0.5; errors (0.5, -1); w2 = 0.5 + (1/2)(0.5 - 2)."""
    t = C.mc_regression(tr(), 1.0, 2)
    np.testing.assert_allclose(t.outputs[0, :, 0], [0.0, 0.5, -0.25], atol=TOL)
    np.testing.assert_allclose(t.internals["mc_error"][0, 1], [0.5, -1.0], atol=TOL)
    np.testing.assert_allclose(t.internals["return"][0], [[1.0, 0.0]] * 3, atol=TOL)
    r = C.Transitions(np.ones((1, 3, 1)), np.ones((1, 3, 1)), np.array([[1.0, 2.0, 4.0]]), 0.5)
    np.testing.assert_allclose(r.returns()[0], [1 + 1 + 1, 2 + 2, 4], atol=TOL)  # 1 + .5 . 2 + .25 . 4


def test_lstd_by_hand():
    """A = (1/2)(1 . 0.5 + 2 . 2) = 2.25, b = (1/2)(1 . 1) = 0.5: w = 2/9, the same at every step."""
    t = C.lstd(tr(), {}, 2)
    assert t.closed_form
    np.testing.assert_allclose(t.outputs[0, :, 0], [2 / 9] * 3, rtol=4 * np.finfo(float).eps)
    np.testing.assert_allclose(C.lstd_weights(tr())[0], [2 / 9], rtol=4 * np.finfo(float).eps)


def test_outputs_of_control_and_trajectory_transitions():
    """No query: the output is w (control), [w; lam] (actor-critic), or the value of S_n = phi'_{n-1} (x)."""
    base = dict(phi=np.array([[[1.0], [2.0]]]), phi_next=np.array([[[1.0], [3.0]]]), rewards=np.array([[1.0, 0.0]]),
                gamma=0.5)
    ctl = C.Transitions(**base)
    assert ctl.control
    np.testing.assert_allclose(C.td_lambda(ctl, 1.0, 1).outputs[0, 1], [0.5], atol=TOL)
    x = C.Transitions(**base, x=np.zeros((1, 3, 2)))
    assert not x.control  # w1 = 0.5, S_n's value 0.5 . 3
    np.testing.assert_allclose(C.td_lambda(x, 1.0, 1).outputs[0, 1], [1.5], atol=TOL)
    ac = C.Transitions(**base, scores=np.ones((1, 2, 1)), lam0=np.array([[7.0]]))
    np.testing.assert_allclose(C.td_lambda(ac, 1.0, 1).outputs[0, 1], [0.5, 7.0], atol=TOL)


def test_greedy_and_expected_successors_by_hand():
    opts = np.array([[[[1.0, 0.0], [0.0, 1.0]]]])  # one column, two actions at s'
    t = C.Transitions(np.array([[[1.0, 0.0]]]), np.array([[[1.0, 0.0]]]), np.array([[0.0]]), 0.5,
                      next_options=opts, next_policy=np.array([[[0.25, 0.75]]]))
    np.testing.assert_allclose(C.greedy_values(t, np.array([[2.0, 3.0]]))[0], [3.0])
    np.testing.assert_allclose(C.expected_next(t)[0, 0], [0.25, 0.75])


# ------------------------------------------------------------------ the fit
def test_fit_picks_the_least_error_and_the_first_of_ties():
    t = tr()
    target = C.td_lambda(t, 1.0, 2).outputs[None]  # [1, B, K + 1, k]: every step a target
    fits = C.fit(C.CANDIDATES["td0"], t, target[:, :, 2], 3)
    assert fits[0].hyper == {"alpha": 1.0, "gamma": 0.5} and fits[0].step == 2
    assert fits[0].sse == pytest.approx(0.0, abs=1e-28)
    zero = C.fit(C.CANDIDATES["td0"], t, np.zeros((1, 1, 1)), 2)[0]  # alpha 0 and step 0 both give 0
    assert zero.hyper == {"gamma": 0.0, "alpha": 0.0} and zero.step == 0 and zero.sse == 0.0  # the first gamma'
    assert zero.ties == {"gamma": [0.0, 0.9]}  # alpha 0 fits every gamma' exactly: the interval says so
    closed = C.fit(C.CANDIDATES["lstd"], t, np.zeros((1, 1, 1)), 2)[0]
    assert closed.step is None and list(closed.hyper) == ["gamma"]


def test_fit_records_sst_and_train_r2():
    t = C.Transitions(np.ones((3, 2, 1)), np.zeros((3, 2, 1)), np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]), 0.5,
                      phi_query=np.ones((3, 1)))
    y = np.array([[[1.0], [2.0], [4.0]]])
    f = C.fit(C.CANDIDATES["td0"], t, y, 2)[0]
    assert f.sst == pytest.approx(14 / 3, rel=1e-14)  # about the mean 7/3: 16/9 + 1/9 + 25/9
    js = f.to_json()
    assert js["train_r2"] == pytest.approx(1 - f.sse / f.sst, rel=1e-14) and js["train_sse"] == f.sse
    flat = C.Fit({"alpha": 1.0}, 1, 0.5, 0.0).to_json()
    assert flat["train_r2"] is None and flat["hyperparameters"] == {"alpha": 1.0} and flat["step"] == 1


def test_fit_refuses_a_candidate_that_diverges_everywhere():
    t = C.Transitions(np.full((1, 2, 1), 1e200), np.zeros((1, 2, 1)), np.ones((1, 2)), 0.5, phi_query=np.ones((1, 1)))
    bad = C.Candidate("boom", "diverges", lambda tr, h, K: C.Trace(np.full((1, K + 1, 1), np.inf), {}),
                      {"alpha": np.array([1.0, 2.0])})
    with pytest.raises(UserError, match="boom diverges for every step size"):
        C.fit(bad, t, np.zeros((1, 1, 1)), 2)


def test_grids():
    assert C.ALPHA_GRID[0] == 0.0 and C.ALPHA_GRID.size == 56 and 1.0 in C.ALPHA_GRID
    assert C.ALPHA_GRID[1] == pytest.approx(1e-3) and C.ALPHA_GRID[-1] == pytest.approx(10 ** 1.5)
    points = C.grid_points(C.CANDIDATES["actor_critic"])  # both step sizes on the full grid, alpha innermost
    assert len(points) == C.ALPHA_GRID.size ** 2 and points[1] == {"beta": 0.0, "alpha": float(C.ALPHA_GRID[1])}
    assert C.CANDIDATES["actor_critic"].sweep and C.STEP_SIZES == ("alpha", "beta")
    assert C.grid_points(C.CANDIDATES["lstd"]) == [{}]
    assert [n for n in C.CANDIDATES if n.startswith("td_lambda")] == ["td_lambda_0.5", "td_lambda_0.9", "td_lambda_1"]
    run = C.CANDIDATES["td_lambda_0.9"].run(tr(), {"alpha": 1.0}, 2)
    np.testing.assert_allclose(run.outputs, C.td_lambda(tr(), 1.0, 2, lam=0.9).outputs, atol=TOL)


# ------------------------------------------------------------------ the families' references: step counts
def test_linear_td_reference_runs_one_step_per_layer():
    """The common case as a linear-td prompt (column [phi; gamma phi'; r], query [phi_q; 0; 0]): L = 2 layers
    give the query values (0, 0.5, -0.125) and output -0.125; L = 3 adds w3 = -0.125 + (1/2)(1.0625 + 0.5)."""
    p = linear_td.prompt(np.array([[[1.0], [2.0]]]), np.array([[[1.0], [0.0]]]), np.array([[1.0, 0.0]]),
                         np.array([[1.0]]), 0.5)
    ref = linear_td.reference_from_prompt(p.z, SimpleNamespace(gamma=0.5, alpha=1.0, n_layers=2), {})
    np.testing.assert_allclose(ref["values"][0, :, 0], [0.0, 0.5, -0.125], atol=TOL)
    np.testing.assert_allclose(ref["output"], [[-0.125]], atol=TOL)
    np.testing.assert_allclose(ref["td_errors"][0, :2], [[1.0, 0.0], [0.75, -1.0]], atol=TOL)
    three = linear_td.reference_from_prompt(p.z, SimpleNamespace(gamma=0.5, alpha=1.0, n_layers=3), {})
    np.testing.assert_allclose(three["output"], [[0.65625]], atol=TOL)
    half = linear_td.reference_from_prompt(p.z, SimpleNamespace(gamma=0.5, alpha=0.5, n_layers=1), {})
    np.testing.assert_allclose(half["output"], [[0.25]], atol=TOL)


def test_softmax_td_reference_runs_one_iteration_per_layer():
    x = np.eye(3)[[0, 1, 0]][None]  # S_0 = 0, S_1 = 1, S_2 = 0 (one-hot), rewards (1, 2)
    lay = softmax_td.layout(3)
    z = np.zeros((1, 3, lay.d_model))
    z[0, :, lay.slice("x")] = x[0]
    z[0, :2, lay.slice("reward")] = [[1.0], [2.0]]
    for L in (1, 2, 3):
        model = SimpleNamespace(gamma=0.5, alpha=0.5, n_layers=L)
        ref = softmax_td.reference_from_prompt(z, model, {"score_scale": 2.0})
        want = reference.weighted_softmax_td(x, np.array([[1.0, 2.0]]), 0.5, 0.5, L, A11=2.0 * np.eye(3))
        assert ref["values"].shape[1] == L + 1
        np.testing.assert_allclose(ref["output"], want.values[:, -1, -1:], atol=TOL)
    # one iteration by hand: v0 = 0, delta = r, each state's value moves by alpha sum_k softmax_k delta_k
    one = softmax_td.reference_from_prompt(z, SimpleNamespace(gamma=0.5, alpha=0.5, n_layers=1), {"score_scale": 2.0})
    K = reference.softmax_kernel(x, 2.0 * np.eye(3))[0]
    np.testing.assert_allclose(one["output"][0, 0], 0.5 * (K[0, 2] * 1.0 + K[1, 2] * 2.0), atol=TOL)


def test_sarsa_reference_is_one_step_from_the_prompts_w():
    """d = 1: w = 2, phi = (1, 1), phi' = (1, 0), r = (1, 0), gamma 0.5: delta = (1 + 1 - 2, 0 - 2) = (0, -2);
    w' = 2 + (alpha / 2)(0 - 2) = 1 at alpha 1."""
    lay = sarsa.layout(1)
    z = np.zeros((1, 3, lay.d_model))
    z[0, :2, lay.slice("phi")] = [[1.0], [1.0]]
    z[0, :2, lay.slice("gamma_phi_next")] = [[0.5], [0.0]]
    z[0, :2, lay.slice("reward")] = [[1.0], [0.0]]
    z[0, -1, lay.slice("w")] = [2.0]
    ref = sarsa.reference_from_prompt(z, SimpleNamespace(gamma=0.5, alpha=1.0), {})
    np.testing.assert_allclose(ref["td_errors"][0, 0], [0.0, -2.0], atol=TOL)
    np.testing.assert_allclose(ref["output"], [[1.0]], atol=TOL)
    np.testing.assert_allclose(ref["w"], [[2.0]], atol=TOL)


def test_transitions_check_the_policy_against_the_actions():
    opts = np.zeros((1, 2, 2, 1))  # two actions at each successor
    base = dict(phi=np.ones((1, 2, 1)), phi_next=np.ones((1, 2, 1)), rewards=np.zeros((1, 2)), gamma=0.5)
    C.Transitions(**base, next_options=opts, next_policy=np.full((1, 2, 2), 0.5))
    with pytest.raises(UserError, match="next_policy"):
        C.Transitions(**base, next_options=opts, next_policy=np.full((1, 2, 3), 1 / 3))
    with pytest.raises(UserError, match="both the policy scores and the starting lam"):
        C.Transitions(**base, scores=np.ones((1, 2, 1)))


def test_the_candidate_set_says_why_a_control_candidate_does_not_apply():
    """The set as `_linear_set` builds it (also at import): combined needs report the first missing part."""
    built = {c.name: c for c in C._linear_set()}
    assert list(built) == list(C.CANDIDATES)
    evaluation = tr()
    assert built["expected_sarsa"].needs(evaluation) == "not a control task (the output is a value)"
    control = C.Transitions(np.ones((1, 2, 1)), np.ones((1, 2, 1)), np.zeros((1, 2)), 0.5)
    assert built["expected_sarsa"].needs(control) == "no features of every action at the next state"
    assert built["actor_critic"].needs(control) == "no policy scores (not an actor-critic task)"
    assert built["td0"].needs(evaluation) is None and built["tabular_td"].needs(evaluation) == "not a softmax-kernel task"
