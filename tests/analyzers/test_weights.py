"""Known answers for the weight analyzers: theta* scores perfectly, c is recovered, noise and
random matrices give the predicted numbers, TL heads convert exactly."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from icrl_interp.families import registry
from icrl_interp.analyzers import weights as W
from icrl_interp.core.errors import UserError
from icrl_interp.families import actor_critic, linear_td, sarsa, softmax_td

from helpers import float_tol

from . import analyzer_data as D


def _sarsa(d=3, alpha=0.7, c=1.0):
    lay = sarsa.layout(d)
    m = sarsa.theta_star(d, alpha, c)
    return lay, {"blocks.0.attn.P": m["P"], "blocks.0.attn.V": m["V"]}


def _theta_inputs(family, tied=True):
    if family == "sarsa":
        lay, p = _sarsa()
        return lay, p
    if family == "linear-td":
        lay = linear_td.layout(3)
        if tied:
            m = linear_td.theta_star(3, 0.4)
            return lay, {"blocks.0.attn.P": m["P"], "blocks.0.attn.Q": m["Q"]}
        out = {}
        for l, a in enumerate([0.3, 0.5, 0.9]):  # per-layer steps, as in an untied model
            m = linear_td.theta_star(3, a)
            out.update({f"blocks.{l}.attn.P": m["P"], f"blocks.{l}.attn.Q": m["Q"]})
        return lay, out
    lay = softmax_td.layout(4)
    m = softmax_td.theta_star(4, 0.8, 0.9, 6.0)
    p = {"blocks.0.attn.A": m["A"], "blocks.0.attn.V": m["V"]}
    if not tied:  # dual-head form has the target head too
        p["blocks.0.attn.V_target"] = m["V_target"]
    return lay, p


@pytest.mark.parametrize("family,tied", [("linear-td", True), ("linear-td", False), ("softmax-td", True),
                                         ("softmax-td", False), ("sarsa", True)])
def test_theta_star_scores_perfectly(family, tied):
    lay, p = _theta_inputs(family, tied)
    out = W.analyze_weights(family, p, p, lay)
    bs, mf = out["block_sparsity"], out["manifold"]
    assert bs["in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
    assert all(v == pytest.approx(0.0, abs=float_tol()) for v in mf["rel_err"].values())
    assert mf["gauge_cosine"] == pytest.approx(1.0, abs=1e-14)
    for layer in mf["per_layer"]:
        assert all(v == pytest.approx(0.0, abs=1e-14) for v in layer["rel_err"].values())
    if family == "sarsa":
        # exact: theta*'s lazy blocks are literal zeros, and the norm of zeros is 0
        assert bs["lazy_drift"] == 0.0 and bs["lazy_blocks"] == {"P22": 0.0, "V22": 0.0}
        assert mf["scale"] == pytest.approx(1.0, rel=1e-12)
    else:
        assert bs["lazy_drift"] is None
    if family == "softmax-td":
        assert out["sign_pattern"] == "+,+,-"
        assert mf["scale"] == pytest.approx(6.0, rel=1e-14)  # A* = 6 diag(I, 0, 0, 0)
        assert mf["value_row_cosine"] == pytest.approx(1.0, abs=1e-14)
    else:
        assert out["sign_pattern"] is None


def test_support_is_derived_from_theta_star():
    lay, p = _sarsa(d=2)
    out = W.analyze_weights("sarsa", p, p, lay)["block_sparsity"]["support"]
    assert sorted(map(tuple, out["blocks.0.attn.P"])) == sorted(
        [("phi", "w"), ("gamma_phi_next", "w"), ("reward", "param_one")])
    assert out["blocks.0.attn.V"] == [["w", "phi"]]
    lay, p = _theta_inputs("linear-td")
    out = W.analyze_weights("linear-td", p, p, lay)["block_sparsity"]["support"]
    assert out["blocks.0.attn.P"] == [["reward", "reward"]]
    assert out["blocks.0.attn.Q"] == [["phi", "phi"], ["phi", "gamma_phi_next"]]


@pytest.mark.parametrize("c", [-2.5, 0.3, 7.0, -0.01, 1e3])
def test_rescaled_theta_star_recovers_c(c):
    lay, star = _sarsa(c=1.0)
    _, learned = _sarsa(c=c)
    mf = W.analyze_weights("sarsa", learned, star, lay)["manifold"]
    assert mf["scale"] == pytest.approx(c, rel=1e-10)
    assert max(mf["rel_err"].values()) < 1e-10
    assert mf["gauge_cosine"] == pytest.approx(1.0, abs=1e-12)
    m = linear_td.theta_star(3, 0.5)
    learned = {"blocks.0.attn.P": c * m["P"], "blocks.0.attn.Q": m["Q"] / c}
    mf = W.analyze_weights("linear-td", learned, {"blocks.0.attn.P": m["P"], "blocks.0.attn.Q": m["Q"]},
                           linear_td.layout(3))["manifold"]
    assert mf["scale"] == pytest.approx(c, rel=1e-10)
    assert mf["gauge_cosine"] == pytest.approx(1.0, abs=1e-12)


def test_best_scale_is_the_global_minimum_on_random_instances(rng):
    for _ in range(60):
        shape_x, shape_y = tuple(rng.integers(1, 6, 2)), tuple(rng.integers(1, 6, 2))
        X, Xs = rng.standard_normal(shape_x), rng.standard_normal(shape_x)
        Y, Ys = rng.standard_normal(shape_y), rng.standard_normal(shape_y)
        c = W.best_scale(X, Xs, Y, Ys)
        f = lambda t: W._manifold_loss(t, X, Xs, Y, Ys)  # noqa: E731
        brute = min((minimize_scalar(lambda u, s=s: f(s * math.exp(u)), bounds=(-12, 12), method="bounded")
                     for s in (1, -1)), key=lambda r: r.fun)
        assert f(c) <= brute.fun + 1e-10 * (1 + brute.fun)
        # stationarity of the quartic root
        g = (f(c * (1 + 1e-6)) - f(c * (1 - 1e-6))) / (2e-6 * c)
        assert abs(g) < 1e-5 * (1 + abs(f(c)))


@pytest.mark.parametrize("eps", [1e-3, 0.05, 0.4])
def test_noise_of_known_size_gives_the_predicted_relative_error(eps, rng):
    """Noise orthogonal to theta* keeps c = 1 exactly, so rel_err = ||noise|| / ||theta*||."""
    lay, star = _sarsa(d=4)
    tr, par = W.lsa_blocks(lay)
    P, V = star["blocks.0.attn.P"].copy(), star["blocks.0.attn.V"].copy()
    P12s, V21s = P[tr, par], V[par, tr]
    E, F = rng.standard_normal(P12s.shape), rng.standard_normal(V21s.shape)
    F[0] = 0.0  # V21's param_one row is not identifiable and not in rel_err (next test)
    E -= (E * P12s).sum() / (P12s * P12s).sum() * P12s
    F -= (F * V21s).sum() / (V21s * V21s).sum() * V21s
    E *= eps * np.linalg.norm(P12s) / np.linalg.norm(E)
    F *= 2 * eps * np.linalg.norm(V21s) / np.linalg.norm(F)
    P[tr, par] += E
    V[par, tr] += F
    mf = W.analyze_weights("sarsa", {"blocks.0.attn.P": P, "blocks.0.attn.V": V}, star, lay)["manifold"]
    assert mf["scale"] == pytest.approx(1.0, abs=1e-12)
    assert mf["rel_err"]["P12"] == pytest.approx(eps, rel=1e-10)
    assert mf["rel_err"]["V21"] == pytest.approx(2 * eps, rel=1e-10)
    assert mf["gauge_cosine"] == pytest.approx(1 / math.sqrt((1 + eps**2) * (1 + 4 * eps**2)), rel=1e-10)


def test_random_matrices_give_cosines_near_zero(rng):
    d = 12
    lay, star = _sarsa(d=d)
    tr, par = W.lsa_blocks(lay)
    size = (2 * d + 1) * (d + 1)
    cos, vrow = [], []
    for _ in range(20):
        learned = {k: rng.standard_normal(v.shape) for k, v in star.items()}
        cos.append(W.analyze_weights("sarsa", learned, star, lay)["manifold"]["gauge_cosine"])
    assert np.mean(np.abs(cos)) < 3 / size  # a product of two ~N(0, 1/size) cosines
    lay = softmax_td.layout(d)
    s = softmax_td.theta_star(d)
    star = {"blocks.0.attn.A": s["A"], "blocks.0.attn.V": s["V"]}
    for _ in range(20):
        p = {k: rng.standard_normal(v.shape) for k, v in star.items()}
        vrow.append(W.analyze_weights("softmax-td", p, star, lay)["manifold"]["gauge_cosine"])
    assert np.mean(np.abs(vrow)) < 3 / lay.d_model  # cos(V, V*) ~ N(0, 1/D^2)


def test_in_support_energy_and_lazy_drift_known_values():
    lay, star = _sarsa(d=2)
    P = star["blocks.0.attn.P"].copy()
    V = star["blocks.0.attn.V"].copy()
    _, par = W.lsa_blocks(lay)
    P[par, par] = 0.0
    P[par.start, par.start] = 0.3  # P22 drift
    V[par.start + 1, par.start + 2] = -0.4  # V22 drift
    total = (star["blocks.0.attn.P"] ** 2).sum() + (star["blocks.0.attn.V"] ** 2).sum()
    out = W.analyze_weights("sarsa", {"blocks.0.attn.P": P, "blocks.0.attn.V": V}, star, lay)["block_sparsity"]
    assert out["in_support_energy"] == pytest.approx(total / (total + 0.09 + 0.16), rel=1e-14)
    assert out["lazy_blocks"] == {"P22": pytest.approx(0.3), "V22": pytest.approx(0.4)}
    assert out["lazy_drift"] == pytest.approx(0.5, rel=1e-14)
    norms = out["block_norms"]["blocks.0.attn.P"]
    assert norms["param_one"]["param_one"] == pytest.approx(0.3)
    assert norms["phi"]["w"] == pytest.approx(math.sqrt(2))


def test_sign_pattern():
    assert W.sign_pattern([0.5, 0.7, -0.3]) == "+,+,-"
    assert W.sign_pattern([1.0, 1e-5, -1.0]) == "+,0,-"
    assert W.sign_pattern([0.0, 0.0, 0.0]) == "0,0,0"
    with pytest.raises(UserError, match="NaN"):
        W.sign_pattern([1.0, np.nan])


def test_pq_summary_is_sign_aligned():
    lay = linear_td.layout(3)
    m = linear_td.theta_star(3, 0.5)
    s = W.pq_summary(m["P"], m["Q"], lay)
    # exact: theta*'s entries are dyadic (0.5, +-1), and sums and traces of a few of them do not round
    assert s == {"sign": 1.0, "P_last": 0.5, "P_others_mean_abs": 0.0, "Q_tl_trace": -3.0, "Q_tr_trace": 3.0}
    flipped = W.pq_summary(-2 * m["P"], m["Q"] / -2, lay)
    assert flipped["sign"] == -1.0
    assert flipped["P_last"] == 1.0 and flipped["Q_tl_trace"] == -1.5 and flipped["Q_tr_trace"] == 1.5


def test_tl_head_matrices_reproduce_a_transformerlens_head(rng):
    d_model, d_head, pos = 7, 3, 5
    W_Q, W_K, W_V = (rng.standard_normal((d_model, d_head)) for _ in range(3))
    W_O = rng.standard_normal((d_head, d_model))
    x = rng.standard_normal((pos, d_model))  # TL rows: one position per row
    A, V = W.tl_head_matrices(W_Q, W_K, W_V, W_O)
    tl_scores = (x @ W_Q) @ (x @ W_K).T  # [query = target, key = source]
    np.testing.assert_allclose(tl_scores.T, x @ A @ x.T, atol=1e-12)  # papers: [source, target] = z_i^T A z_j
    np.testing.assert_allclose(x @ W_V @ W_O, (V @ x.T).T, atol=1e-12)


def test_tl_weights_of_theta_star_score_perfectly():
    d = 3
    lay = softmax_td.layout(d)
    s = softmax_td.theta_star(d, 1.0, 0.9, 2.0)
    D_ = lay.d_model
    W_Q = np.zeros((2, D_, d))
    W_K = np.zeros((2, D_, d))
    W_Q[1, :d] = 2.0 * np.eye(d)
    W_K[1, :d] = np.eye(d)
    W_V = np.zeros((2, D_, D_))
    W_V[1] = s["V"].T
    W_O = np.broadcast_to(np.eye(D_), (2, D_, D_)).copy()
    tensors = {"blocks.0.attn.W_Q": W_Q, "blocks.0.attn.W_K": W_K, "blocks.0.attn.W_V": W_V, "blocks.0.attn.W_O": W_O}
    params = W.tl_to_family(tensors, "softmax-td", head=1)
    np.testing.assert_allclose(params["blocks.0.attn.A"], s["A"], atol=1e-15)
    np.testing.assert_allclose(params["blocks.0.attn.V"], s["V"], atol=1e-15)
    out = W.analyze_weights("softmax-td", params, {"blocks.0.attn.A": s["A"], "blocks.0.attn.V": s["V"]}, lay)
    assert out["sign_pattern"] == "+,+,-" and out["manifold"]["scale"] == pytest.approx(2.0)
    with pytest.raises(UserError, match="head 2 does not exist"):
        W.tl_to_family(tensors, "softmax-td", head=2)
    with pytest.raises(UserError, match="lack blocks.0.attn.W_O"):
        W.tl_to_family({k: v for k, v in tensors.items() if not k.endswith("W_O")}, "softmax-td")


def test_bad_weights_get_clear_errors():
    lay, star = _sarsa(d=2)
    wrong = {k: np.zeros((5, 5)) for k in star}
    with pytest.raises(UserError, match="layout does not fit"):
        W.analyze_weights("sarsa", wrong, star, lay)
    _, other = _sarsa(d=3)
    with pytest.raises(UserError, match="layout does not fit"):
        W.analyze_weights("sarsa", other, star, lay)
    with pytest.raises(UserError, match="mismatched theta"):
        W.analyze_weights("sarsa", star, {**star, "blocks.0.attn.X": star["blocks.0.attn.P"]}, lay)
    with pytest.raises(UserError, match="mismatched theta"):
        W.analyze_weights("sarsa", star, {"blocks.0.attn.P": np.zeros((3, 3))}, lay)
    nan = {k: v.copy() for k, v in star.items()}
    nan["blocks.0.attn.P"][0, 0] = np.nan
    with pytest.raises(UserError, match="NaN"):
        W.analyze_weights("sarsa", nan, star, lay)
    with pytest.raises(UserError, match="all-zero"):
        W.best_scale(np.ones(2), np.zeros(2), np.ones(2), np.ones(2))


def test_fixture_configs_match_the_layouts():
    for fam in D.CONFIGS:
        cfg = D.config_for(fam)
        for name, m in D.theta_params(cfg).items():
            W.check_fits(name, m, D.layout_of(cfg))


def test_without_theta_star_only_norms_and_lazy_drift():
    d, m = 2, 1
    lay = actor_critic.layout(d, m)
    P = np.zeros((lay.d_model, lay.d_model))
    V = np.zeros_like(P)
    _, par = W.lsa_blocks(lay)
    P[par.start + 1, par.start + 2] = 0.6
    V[0, par.start] = 5.0  # outside the lazy blocks
    out = W.analyze_weights("actor-critic", {"blocks.0.attn.P": P, "blocks.0.attn.V": V}, {}, lay)
    assert out["manifold"] is None and out["sign_pattern"] is None
    assert out["block_sparsity"]["in_support_energy"] is None
    assert out["block_sparsity"]["lazy_drift"] == pytest.approx(0.6)
    # exact: the block holds one nonzero entry, and sqrt(5.0 ** 2) = 5.0
    assert out["block_sparsity"]["block_norms"]["blocks.0.attn.V"]["phi"]["param_one"] == 5.0


@pytest.mark.parametrize("family", ["sarsa", "actor-critic"])
def test_the_unread_row_of_V21_is_reported_apart_not_in_rel_err(family, rng):
    """theta* (at c = -1.7) except on V21's param_one row, which writes the never-read constant entry of
    w~ = [1; w]: the headline errors are 0 and c is exact; the row is reported with its norm and the
    error it would have added."""
    lay = sarsa.layout(3) if family == "sarsa" else actor_critic.layout(3, 2)
    make = (lambda c: sarsa.theta_star(3, 0.7, c)) if family == "sarsa" else (
        lambda c: actor_critic.theta_star(3, 2, 0.7, 0.2, c=c))
    star = {f"blocks.0.attn.{k}": v for k, v in make(1.0).items()}
    learned = {f"blocks.0.attn.{k}": v.copy() for k, v in make(-1.7).items()}
    tr, par = W.lsa_blocks(lay)
    row = lay.slice("param_one").start
    junk = rng.standard_normal(tr.stop)
    learned["blocks.0.attn.V"][row, tr] = junk
    mf = W.analyze_weights(family, learned, star, lay)["manifold"]
    assert mf["scale"] == pytest.approx(-1.7, rel=1e-12)
    assert max(mf["rel_err"].values()) < 1e-12 and mf["gauge_cosine"] == pytest.approx(1.0, abs=1e-12)
    un = mf["unidentifiable"]["V21"]
    assert un["row_blocks"] == ["param_one"] and "no readout" in un["reason"]
    assert un["norm"] == pytest.approx(np.linalg.norm(junk), rel=1e-12)
    V21s = star["blocks.0.attn.V"][par, tr] / -1.7
    assert un["rel_err_all_rows"] == pytest.approx(np.linalg.norm(junk) / np.linalg.norm(V21s), rel=1e-10)
    assert mf["per_layer"][0]["unidentifiable"] == mf["unidentifiable"]


def test_actor_critic_theta_star_from_a_config_recovers_c():
    from icrl_interp.analyzers.analyze import theta_for_config

    cfg = {"format_version": 2, "model": {"family": "actor-critic", "d": 4, "m": 2, "n_layers": 1, "gamma": 0.5,
                                          "alpha": 0.3, "tied": True, "dtype": "float64"},
           "task": {"kind": "mdp", "n": 8, "n_states": 2, "n_actions": 2}, "origin": {"kind": "theta_star", "beta": 0.7}}
    star = theta_for_config(cfg, ["blocks.0.attn.P", "blocks.0.attn.V"])
    learned = {f"blocks.0.attn.{k}": v for k, v in actor_critic.theta_star(4, 2, 0.3, 0.7, c=-2.5).items()}
    out = W.analyze_weights("actor-critic", learned, star, actor_critic.layout(4, 2))
    assert out["manifold"]["scale"] == pytest.approx(-2.5, rel=1e-12)
    assert max(out["manifold"]["rel_err"].values()) < 1e-12
    assert out["block_sparsity"]["in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
    assert out["block_sparsity"]["lazy_drift"] == 0.0  # exact: theta*'s lazy blocks are literal zeros


def test_block_ranges_are_relative_to_layout_blocks():
    lay = sarsa.layout(2)  # phi 0:2, gamma_phi_next 2:4, reward 4:5, param_one 5:6, w 6:8
    assert W.block_range(":", lay) == slice(0, 8)
    assert W.block_range(":param_one", lay) == slice(0, 5)
    assert W.block_range("param_one:", lay) == slice(5, 8)
    assert W.block_range("w", lay) == slice(6, 8)
    assert W.lsa_blocks(lay) == (slice(0, 5), slice(5, 8))


def test_weight_fits_come_from_the_hints_not_the_name():
    """A family registered under another name with sarsa's hints is fitted like sarsa; with the hints
    of no fit, only the support statistics are reported."""
    lay, star = _sarsa(c=1.0)
    _, learned = _sarsa(c=-3.0)
    base = registry.get("sarsa")
    copy = registry.Family(**{**base.__dict__, "name": "test-lsa-copy"})
    registry.register(copy)
    try:
        mf = W.analyze_weights("test-lsa-copy", learned, star, lay)["manifold"]
        assert mf["scale"] == pytest.approx(-3.0, rel=1e-10) and set(mf["rel_err"]) == {"P12", "V21"}
        bare = registry.Hints(output="parameters", output_blocks=("w",))
        out = W.analyze_weights(bare, learned, star, lay)
        assert out["manifold"] is None
        assert out["block_sparsity"]["in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
        assert out["block_sparsity"]["lazy_drift"] is None
    finally:
        registry.unregister("test-lsa-copy")
