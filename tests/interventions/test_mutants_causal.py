"""Known answers for every statistic and decision of the causal test (causal.py) and of the verdict's causal
evidence (causal_verdict.py), each written so that a one-line mutant fails it: the bootstrap intervals'
quantiles (2.5 -> 5), the paired effect size's ddof, the rounding floor of `excess`, p_random's tie rule,
the random control's band (5 / 95), every branch and boundary of 'exceeds random init', the scale note's
factor, the reach note's floor, the default settings, and the causal evidence's excess, interval and top.

Expected numbers come from closed forms, np.percentile on resamples redrawn here from the same seed, or
loops over the tasks; never from the code under test.
"""
from __future__ import annotations

import inspect
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from icrl_interp.interventions import baseline, causal, statistics
from icrl_interp.verdicts import causal_evidence as causal_verdict
from icrl_interp.models import construct
from icrl_interp.verdicts import behaviour as VD
from icrl_interp.core.errors import UserError

EPS = np.finfo(np.float64).eps


def pct(samples, q):
    return float(np.percentile(np.asarray(samples, dtype=np.float64), q))


# ------------------------------------------------------------------ intervals and effect sizes
def test_ci_is_the_2_5_and_97_5_percentiles_of_95_percent_finite_samples():
    assert statistics.interval(np.arange(1001.0)) == [25.0, 975.0]  # exact: samples 25 and 975
    s = np.arange(100.0)
    s[:5] = np.nan
    assert statistics.interval(s) == [pct(s[5:], 2.5), pct(s[5:], 97.5)]  # 95 finite: enough
    s[5] = -np.inf
    assert statistics.interval(s) is None and statistics.interval(np.array([])) is None


def test_paired_d_is_the_mean_over_the_sd_with_ddof_1():
    diff = np.array([1.0, 2.0, 6.0])  # mean 3, sample variance (4 + 1 + 9) / 2 = 7
    assert statistics.paired_d(diff) == pytest.approx(3 / np.sqrt(7.0), rel=4 * EPS)
    rows = np.array([[1.0, 2.0, 6.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0], [-1.0, -2.0, -6.0]])
    got = statistics.paired_d(rows)  # along the last axis
    assert got[0] == pytest.approx(3 / np.sqrt(7.0), rel=4 * EPS) and got[1] == 0.0
    assert np.isnan(got[2]) and got[3] == pytest.approx(-3 / np.sqrt(7.0), rel=4 * EPS)
    assert statistics.paired_d(np.array([0.0])) == 0.0 and np.isnan(statistics.paired_d(np.array([0.5])))


def test_excess_is_td_minus_the_mean_draw_with_a_rounding_floor_of_the_largest_value():
    a = np.asarray
    np.testing.assert_array_equal(causal.excess(a([3.0, 1.0]), a([[1.0, 2.0], [1.0, 1.0]])), [1.5, 0.0])
    # floor 1e-10 of the largest |value| of td or rand: 1.5e-10 is kept, 0.5e-10 is rounding
    assert causal.excess(a([1.0 + 1.5e-10]), a([[1.0]]))[0] == pytest.approx(1.5e-10, rel=1e-5)
    assert causal.excess(a([1.0 + 0.5e-10]), a([[1.0]]))[0] == 0.0
    # the largest value may sit in rand (row 1) or in td (row 1): either raises the floor for row 0
    assert causal.excess(a([1e-9, 0.0]), a([[0.0, 0.0], [100.0, 100.0]]))[0] == 0.0
    assert causal.excess(a([1e-9, 100.0]), a([[0.0, 0.0], [0.0, 0.0]]))[0] == 0.0
    assert causal.excess(a([1e-9, 1.0]), a([[0.0, 0.0], [1.0, 1.0]]))[0] == pytest.approx(1e-9, rel=1e-12)


def test_compare_by_hand():
    """Every field of `compare` from the same bootstrap draws (a Generator of the same seed)."""
    g = np.random.default_rng(3)
    N, K, B = 12, 5, 400
    td = 1.0 + g.random(N)
    rand = 0.5 * g.random((N, K)) + 0.2
    res = causal.compare(td, rand, np.random.default_rng(11), B)
    idx = np.random.default_rng(11).integers(0, N, size=(B, N))
    rbar = rand.mean(1)
    diff = td - rbar
    d_b = diff[idx]
    sd = lambda a: a.std(-1, ddof=1)  # noqa: E731
    ci = lambda s: [pct(s, 2.5), pct(s, 97.5)]  # noqa: E731
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)  # noqa: E731
    close(res["td"]["mean"], td.mean())
    close(res["td"]["ci"], ci(td[idx].mean(1)))
    close(res["random"]["mean"], rbar.mean())
    close(res["random"]["ci"], ci(rbar[idx].mean(1)))
    close(res["random"]["draws"], rand.mean(0))
    close(res["random"]["sd_draws"], rand.mean(0).std(ddof=1))
    close(res["difference"]["mean"], diff.mean())
    close(res["difference"]["ci"], ci(d_b.mean(1)))
    close(res["cohen_d"]["value"], diff.mean() / sd(diff))
    close(res["cohen_d"]["ci"], ci(d_b.mean(1) / sd(d_b)))
    close(res["z_draws"], (td.mean() - rand.mean(0).mean()) / rand.mean(0).std(ddof=1))
    close(res["ratio"]["value"], td.mean() / rbar.mean())
    close(res["ratio"]["ci"], ci(td[idx].mean(1) / rbar[idx].mean(1)))
    assert res["p_random"] == 1 / (K + 1)  # exact: no draw reaches the TD mean
    no_ratio = causal.compare(td, rand, np.random.default_rng(11), B, ratio=False)
    assert "ratio" not in no_ratio and no_ratio["difference"] == res["difference"]


def test_p_random_counts_draws_that_reach_the_td_mean():
    td = np.full(4, 2.0)
    rand = np.array([[2.0, 1.0, 3.0, 0.0]] * 4)  # draw means 2 (ties), 1, 3, 0
    res = causal.compare(td, rand, np.random.default_rng(0), 20)
    assert res["p_random"] == 3 / 5  # exact: 1 + the tie + the larger draw, over 1 + 4
    assert res["z_draws"] == pytest.approx((2.0 - 1.5) / np.std([2.0, 1, 3, 0], ddof=1), rel=4 * EPS)
    one = causal.compare(td, rand[:, :1], np.random.default_rng(0), 20)
    assert one["random"]["sd_draws"] == 0.0 and one["z_draws"] is None and one["p_random"] == 1.0
    # a draw within 1e-12 x max(1, |TD mean|) below the TD mean reaches it (rounding); one 1e-11 below does not
    near = lambda t, below: causal.compare(np.array([t]), np.array([[t - d for d in below]]),  # noqa: E731
                                           np.random.default_rng(0), 20)["p_random"]
    assert near(2.0, [1e-12, 1e-11]) == 2 / 3  # tolerance 2e-12 at a TD mean of 2
    assert near(4.0, [3e-12]) == 1.0 and near(0.5, [3e-12]) == 0.5  # at least 1e-12, scaled by |mean| above 1


def test_ratio_is_none_without_a_positive_random_effect():
    td = np.array([1.0, 2.0, 3.0])
    res = causal.compare(td, np.zeros((3, 2)), np.random.default_rng(0), 50)
    assert res["ratio"] == {"value": None, "ci": None}  # every resample divides by 0
    mixed = causal.compare(td, np.array([[1.0, -1.0]] * 3), np.random.default_rng(0), 50)
    assert mixed["ratio"]["value"] is None


# ------------------------------------------------------------------ trained against random init
def _stat(lo, hi, mean=None):
    return {"mean": (lo + hi) / 2 if mean is None else mean, "ci": [lo, hi]}


def _cmp(t, b, d=(0.0, 0.1)):
    return {"trained": _stat(*t), "random_init": _stat(*b), "difference": _stat(*d)}


@pytest.mark.parametrize("t, d, answer", [
    ((0.5, 0.9), (0.1, 0.4), "yes: the paired difference lies above 0"),
    ((0.5, 0.9), (0.0, 0.4), "no: the paired difference's interval includes 0"),  # touching 0: not above
    ((0.5, 0.9), (1e-9, 0.4), "yes: the paired difference lies above 0"),
    ((0.5, 0.9), (-0.4, -1e-9), "no: the random-init model's is larger"),
    ((0.5, 0.9), (-0.4, 0.0), "no: the paired difference's interval includes 0"),  # touching from below: not larger
    ((0.5, 0.9), (-0.1, 0.2), "no: the paired difference's interval includes 0"),  # the lower bound decides
    ((0.0, 0.3), (0.1, 0.4), "no: the paired difference lies above 0, but the trained model's reaches 0"),
    ((1e-9, 0.3), (0.1, 0.4), "yes: the paired difference lies above 0"),
])
def test_exceeds_random_init_decides_by_the_paired_interval(t, d, answer):
    """The issue's case: unpaired intervals that overlap, a paired difference above 0: the answer is yes (the
    random-init interval (0.4, 1.0) overlaps every trained one here, and never decides)."""
    text = causal.verdict(_cmp(t, (0.4, 1.0), d), "excess")
    assert text.startswith(answer), text
    assert "excess: trained " in text and "paired difference" in text


def test_exceeds_random_init_needs_both_intervals():
    v = _cmp((0.5, 0.9), (0.1, 0.4), (0.1, 0.4))
    v["difference"]["ci"] = None
    assert causal.verdict(v, "x").startswith("no: no interval to compare") and "(no interval)" in causal.verdict(v, "x")
    v = _cmp((0.5, 0.9), (0.1, 0.4), (0.1, 0.4))
    v["trained"]["ci"] = None
    assert causal.verdict(v, "x").startswith("no: no interval to compare")


def test_versus_statistics_on_given_resamples():
    a, b = np.array([1.0, 2.0, 4.0, 8.0]), np.array([0.5, 0.5, 1.0, 1.0])
    idx = np.random.default_rng(2).integers(0, 4, size=(300, 4))
    out = baseline.versus(a, b, idx)
    assert out["trained"]["mean"] == 3.75 and out["random_init"]["mean"] == 0.75  # exact: dyadic
    assert out["difference"]["mean"] == 3.0
    for key, v in (("trained", a), ("random_init", b), ("difference", a - b)):
        np.testing.assert_allclose(out[key]["ci"], [pct(v[idx].mean(1), 2.5), pct(v[idx].mean(1), 97.5)],
                                   rtol=1e-13)


def test_probe_versus_is_r2_from_pooled_task_sums():
    """Columns (sse, n, sum y, sum y^2) per task; R^2 = 1 - sse / (syy - sy^2 / n) over the (resampled) tasks."""
    g = np.random.default_rng(4)
    def sums(noise):
        y = g.standard_normal((6, 5))
        r = noise * g.standard_normal((6, 5))
        return np.stack([(r ** 2).sum(1), np.full(6, 5.0), y.sum(1), (y ** 2).sum(1)], 1)
    a, b = sums(0.3), sums(0.8)
    idx = g.integers(0, 6, size=(200, 6))
    r2 = lambda s: 1 - s[..., 0] / (s[..., 3] - s[..., 2] ** 2 / s[..., 1])  # noqa: E731
    out = baseline.probe_versus(a, b, idx)
    assert out["trained"]["mean"] == pytest.approx(r2(a.sum(0)), rel=1e-12)
    assert out["random_init"]["mean"] == pytest.approx(r2(b.sum(0)), rel=1e-12)
    assert out["difference"]["mean"] == pytest.approx(r2(a.sum(0)) - r2(b.sum(0)), rel=1e-12)
    ra, rb = r2(a[idx].sum(1)), r2(b[idx].sum(1))
    np.testing.assert_allclose(out["trained"]["ci"], [pct(ra, 2.5), pct(ra, 97.5)], rtol=1e-12)
    np.testing.assert_allclose(out["difference"]["ci"], [pct(ra - rb, 2.5), pct(ra - rb, 97.5)], rtol=1e-12)


def test_scale_note_at_a_factor_of_ten():
    note = lambda t, b: causal.scale_note({"scale": {"trained": t, "random_init": b, "target": 1.0}})  # noqa: E731
    assert note(10.0, 1.0) is None and note(1.0, 10.0) is None  # exactly 10x: still comparable
    assert note(10.5, 1.0) is not None and note(1.0, 10.5) is not None
    assert note(0.0, 1.0) is not None and note(1.0, 0.0) is not None
    assert "differ in scale by more than 10x" in note(20.0, 1.0)
    assert causal.scale_note({"scale": {"trained": 3.0, "random_init": 1.0, "target": 1.0}}, factor=2.0)


def test_rms_is_the_root_mean_square_of_the_output_norms():
    assert baseline.rms(np.array([[3.0, 4.0], [0.0, 0.0]])) == pytest.approx(np.sqrt(12.5), rel=4 * EPS)


def test_rounding_floor_is_64_eps_of_the_largest_output():
    base = np.array([[3.0], [0.0]])
    floor = causal.rounding_floor(torch.float64, base)
    assert floor == 64 * EPS * 3.0  # exact: the same three factors multiplied in the same order
    assert causal.rounding_floor(torch.float32, base) == 64 * float(torch.finfo(torch.float32).eps) * 3.0
    assert causal.rounding_floor(torch.float64, -base) == floor  # by the absolute value
    out = base + np.array([[0.0], [floor]])  # row 1 moved by exactly the floor (0 + floor - 0 is exact)
    np.testing.assert_array_equal(causal.unchanged_within_rounding(out, base, torch.float64), base)
    above = base + np.array([[0.0], [1.5 * floor]])
    np.testing.assert_array_equal(causal.unchanged_within_rounding(above, base, torch.float64), above)
    wide = np.array([[0.0, 0.0], [1.0, 1.0]])  # the floor (64 eps here) is on the row's Euclidean norm
    floor = causal.rounding_floor(torch.float64, wide)
    moved = wide + np.array([[0.6, 0.6], [0.0, 0.0]]) * floor  # norm 0.85 floor: unchanged
    np.testing.assert_array_equal(causal.unchanged_within_rounding(moved, wide, torch.float64), wide)
    moved[0] = [0.75 * floor, 0.75 * floor]  # each entry below the floor, the norm (1.06 floor) above it
    np.testing.assert_array_equal(causal.unchanged_within_rounding(moved, wide, torch.float64), moved)


def test_reach_note_only_when_nothing_moved(linear):
    model, cfg, roles = linear
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=8)

    def setup(layer, n_layers):
        return replace(st, site=replace(st.site, layer=layer, n_layers=n_layers))

    assert causal.reach_note(setup(0, 2), 1e-300) is None
    last = causal.reach_note(setup(1, 2), 0.0)
    assert last.startswith("layer 1 is the last of 2") and "no later layer reads them" in last
    other = causal.reach_note(setup(0, 2), 0.0)
    assert other.startswith("no edit, along the TD direction or a random one") and "last of" not in other


# ------------------------------------------------------------------ edits
def test_projection_and_leace_edits_by_hand():
    u = np.array([3.0, 4.0])
    e = causal.projection_edit(u, 2.0)
    np.testing.assert_allclose(e.c, [0.6, 0.8], rtol=4 * EPS)
    x = np.array([[1.0, 1.0]])  # u.x = 1.4 -> set to 2: x + 0.6 u
    np.testing.assert_allclose(e.apply(x), [[1.36, 1.48]], rtol=8 * EPS)
    np.testing.assert_allclose(causal.Edit(v=np.array([1.0, -1.0])).apply(x), [[2.0, 0.0]], rtol=0)
    S = np.diag([4.0, 1.0])
    c = np.array([2.0, 1.0])
    le = causal.leace_edit(S, c, np.array([1.0, 1.0]))
    q = np.array([0.5, 1.0])  # S^-1 c
    np.testing.assert_allclose(le.b, q / (c @ q), rtol=4 * EPS)
    assert le.m == pytest.approx(float(q.sum() / (c @ q)), rel=4 * EPS)
    assert causal.erased_variance(S, le) == pytest.approx((c @ c) * (le.b @ S @ le.b), rel=4 * EPS)
    assert causal.erased_variance(S, le) == pytest.approx(c @ c / (c @ q), rel=8 * EPS)
    with pytest.raises(UserError, match="no covariance"):
        causal.leace_edit(S, np.zeros(2), np.zeros(2))
    with pytest.raises(UserError, match="zero or not finite"):
        causal.projection_edit(np.zeros(3))


def test_pinv_psd_drops_eigenvalues_below_the_relative_tolerance():
    S = np.diag([1.0, 2e-10, 5e-11])
    np.testing.assert_allclose(causal.pinv_psd(S), np.diag([1.0, 5e9, 0.0]), rtol=1e-9)
    np.testing.assert_allclose(causal.pinv_psd(S, rtol=1e-9), np.diag([1.0, 0.0, 0.0]), rtol=1e-12)


def test_probe_iteration_of_each_hook():
    assert causal.probe_iteration("resid_post", 2) == 3
    assert causal.probe_iteration("resid_pre", 2) == 2 and causal.probe_iteration("attn_scores", 0) == 0


# ------------------------------------------------------------------ defaults and argument gates
def test_defaults_of_the_causal_test():
    p = inspect.signature(causal.causal_test).parameters
    want = {"method": "leace", "direction": "probe", "tasks": 256, "test_fraction": 0.5, "seed": 0,
            "random_draws": 32, "steer": (-2.0, -1.0, 1.0, 2.0), "bootstrap": 1000, "baseline": "random-init",
            "refits": 8, "crossfit": False}
    assert {k: p[k].default for k in want} == want
    assert causal.MIN_TASKS == 8 and causal.FOLDS == 5
    cv = inspect.signature(causal_verdict.causation).parameters
    assert (cv["draws"].default, cv["max_tasks"].default, cv["resamples"].default) == (16, 64, 1000)
    api = inspect.signature(causal_verdict.verdict).parameters
    want = {"tasks": 512, "prompt_seed": 0, "candidates": None, "steps": None, "test_fraction": 0.3, "seed": 0,
            "bootstrap": 1000, "min_r2": 0.5, "max_prompts": 1024, "causal_draws": 16, "causal_tasks": 64,
            "causal": True, "baseline": "random-init", "batch_size": 128}
    assert {k: api[k].default for k in want} == want


class Linear(nn.Module):
    """h = z @ E at every position (layer0); out = h_query[0] + mean_k h_k . a: an erasure x -> x - c (b.x - m)
    of the context columns moves the output by -(a.c) mean_k (b.x_k - m), exactly."""

    def __init__(self, E, a):
        super().__init__()
        self.E = nn.Parameter(torch.as_tensor(np.asarray(E, dtype=np.float64)), requires_grad=False)
        self.a = nn.Parameter(torch.as_tensor(np.asarray(a, dtype=np.float64)), requires_grad=False)
        self.layer0 = nn.Identity()

    def forward(self, z):
        h = self.layer0(z @ self.E)
        return h[:, -1, :1] + h[:, :-1].mean(1) @ self.a[:, None]


@pytest.fixture(scope="module")
def linear():
    g = np.random.default_rng(8)
    E = g.standard_normal((9, 4)) * np.array([5.0, 1.0, 1.0, 0.2])
    cfg = construct.task_config("linear-td", {"layers": 2, "n": 8})
    return Linear(E, g.standard_normal(4)), cfg, {"resid_post": "layer{layer}"}


@pytest.mark.parametrize("tasks, fraction, n_test", [(8, 0.5, 3), (10, 0.1, 2), (20, 0.5, 10), (12, 0.25, 3)])
def test_held_out_tasks_at_least_two_and_at_most_tasks_minus_folds(linear, tasks, fraction, n_test):
    model, cfg, roles = linear
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=tasks, test_fraction=fraction)
    assert st.test_index.size == n_test and st.train_index.size == tasks - n_test
    assert np.intersect1d(st.test_index, st.train_index).size == 0


def test_argument_gates(linear):
    model, cfg, roles = linear
    with pytest.raises(UserError, match="--tasks must be an integer >= 8"):
        causal.prepare(model, cfg, 0, roles=roles, tasks=7)
    for bad in (0.0, 1.0):
        with pytest.raises(UserError, match="test fraction must lie in"):
            causal.prepare(model, cfg, 0, roles=roles, tasks=8, test_fraction=bad)
    kw = dict(roles=roles, tasks=8, steer=(), baseline="none", refits=0)
    with pytest.raises(UserError, match="--random-draws must be an integer >= 2"):
        causal.causal_test(model, cfg, 0, random_draws=1, bootstrap=10, **kw)
    with pytest.raises(UserError, match="--bootstrap must be an integer >= 10"):
        causal.causal_test(model, cfg, 0, random_draws=2, bootstrap=9, **kw)
    with pytest.raises(UserError, match="steering scales must be finite"):
        causal.causal_test(model, cfg, 0, random_draws=2, bootstrap=10, roles=roles, tasks=8, steer=(np.inf,),
                           baseline="none")
    res = causal.causal_test(model, cfg, 0, random_draws=2, bootstrap=10, **kw)  # the smallest allowed
    assert res["random_draws"] == 2 and res["bootstrap"] == 10


def test_setup_statistics_by_hand(linear):
    """mean / std / Cov(x) / Cov(x, delta) over the training columns (ddof 0), the probe's held-out sums."""
    model, cfg, roles = linear
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=16)
    X = st.features[st.train_index].reshape(-1, 4)
    y = st.targets[st.train_index].ravel()
    proj = X @ st.direction
    assert st.mean == pytest.approx(proj.mean(), rel=1e-12) and st.std == pytest.approx(proj.std(ddof=0), rel=1e-12)
    Xc = X - X.mean(0)
    np.testing.assert_allclose(st.cov_x, Xc.T @ Xc / X.shape[0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(st.cov_xz, Xc.T @ (y - y.mean()) / X.shape[0], rtol=1e-12, atol=1e-14)
    Xt, yt = st.features[st.test_index], st.targets[st.test_index]
    resid = yt - (Xt @ st.probe["coef"] + st.probe["intercept"])
    n = yt.shape[1]
    want = np.stack([(resid ** 2).sum(1), np.full(yt.shape[0], float(n)), yt.sum(1), (yt ** 2).sum(1)], 1)
    np.testing.assert_allclose(st.probe_sums, want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(st.base, model(torch.as_tensor(st.z_test)).detach().numpy(), rtol=1e-12)
    assert st.probe["target_iteration"] == 1  # resid_post of layer 0 carries delta^(1)
    assert st.probe["n_test"] == st.test_index.size * n and st.probe["n_train"] == st.train_index.size * n


def test_measure_by_hand(linear):
    """On the linear model every output change is |a.c| |mean_k (b.x_k - m)| (steering: |a.v|); the
    statistics are those of `compare` with the rng of the seed, the band the 5th / 95th percentiles."""
    model, cfg, roles = linear
    a = model.a.detach().numpy()
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=24, seed=2)
    X = st.features[st.test_index]
    G = causal.random_directions(4, 6, seed=2, layer=0)
    m = causal.measure(st, "mean", G, [1.5], seed=2, n_boot=200)
    erase = lambda e: np.abs(a @ e.c) * np.abs((X @ e.b - e.m).mean(1))  # noqa: E731
    td = erase(st.erase("mean"))
    rand = np.stack([erase(st.erase_random("mean", g)) for g in G], 1)
    np.testing.assert_allclose(m.per_task["output"][0], td, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(m.per_task["output"][1], rand, rtol=1e-9, atol=1e-12)
    want = causal.compare(td, rand, np.random.default_rng([2, 0xB007]), 200)
    got = m.erasure["output_change"]
    np.testing.assert_allclose(got["difference"]["ci"], want["difference"]["ci"], rtol=1e-8)
    np.testing.assert_allclose(got["cohen_d"]["value"], want["cohen_d"]["value"], rtol=1e-8)
    assert m.erasure["erased_variance"]["td"] == pytest.approx(st.std ** 2, rel=1e-10)
    point = m.steering[0]
    assert point["scale"] == 1.5 and point["shift"] == pytest.approx(1.5 * st.std, rel=4 * EPS)
    steer_td = np.abs(a @ (1.5 * st.std * st.direction))
    assert point["td"]["change"] == pytest.approx(steer_td, rel=1e-9)
    draws = np.array([abs(a @ (1.5 * st.std * g)) for g in G])
    np.testing.assert_allclose(point["random"]["band"], [pct(draws, 5), pct(draws, 95)], rtol=1e-9)
    assert point["random"]["change"] == pytest.approx(draws.mean(), rel=1e-9)
    sel = max(float(v.max()) for v in m.per_task["selective"])  # the selective test's edits count too
    assert m.largest == pytest.approx(max(td.max(), rand.max(), steer_td, draws.max(), sel), rel=1e-9)


def test_selective_measure_by_hand(linear):
    """On the linear model each erasure moves the output by |a.c| |mean_k (b.x_k - m)|: the selective direction's,
    the input-explained one's shrunk to the selective erasure's variance (and at full size), the random draws'
    matched to the selective one; the paired statistics use one set of resamples of the seed."""
    model, cfg, roles = linear
    a = model.a.detach().numpy()
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=24, seed=2)
    X = st.features[st.test_index]
    G = causal.random_directions(4, 6, seed=2, layer=0)
    out, (s, i, r) = causal.measure_selective(st, "mean", G, seed=2, n_boot=200)
    erase = lambda e: np.abs(a @ e.c) * np.abs((X @ e.b - e.m).mean(1))  # noqa: E731
    sel, full = st.erase("mean", "selective"), st.erase("mean", "input")
    size, full_size = causal.erased_variance(st.cov_x, sel), causal.erased_variance(st.cov_x, full)
    assert size == pytest.approx(st.selective.selective.std ** 2, rel=1e-10)
    t = np.sqrt(size / full_size)
    np.testing.assert_allclose(s, erase(sel), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(i, t * erase(full), rtol=1e-9, atol=1e-12)  # shrinking c by t scales the change
    np.testing.assert_allclose(r, np.stack([erase(st.erase_random("mean", g, "selective")) for g in G], 1),
                               rtol=1e-9, atol=1e-12)
    e = out["erasure"]
    assert e["input_explained_shrink"] == pytest.approx(t, rel=1e-12)
    assert e["erased_variance"]["input_explained"] == pytest.approx(size, rel=1e-9)
    assert e["erased_variance"]["random"] == pytest.approx(size, rel=1e-8)
    assert e["erased_variance"]["input_explained_full"] == pytest.approx(full_size, rel=1e-12)
    assert e["input_explained_full"]["mean"] == pytest.approx(erase(full).mean(), rel=1e-9)
    idx = np.random.default_rng([2, 0x5E1EC7]).integers(0, s.size, size=(200, s.size))
    for key, v in (("excess_over_random", s - r.mean(1)), ("minus_input_explained", s - i),
                   ("against_input", s - 0.5 * i)):  # the conclusion's input share, frozen at 1/2
        assert e[key]["mean"] == pytest.approx(v.mean(), rel=1e-9, abs=1e-15)
        np.testing.assert_allclose(e[key]["ci"], [pct(v[idx].mean(1), 2.5), pct(v[idx].mean(1), 97.5)], rtol=1e-8)


def test_the_residual_is_what_the_inputs_do_not_explain():
    """selective.fit: the residual target is y minus the ridge prediction from the explaining inputs; a feature
    that is exactly the residual gives the selective probe R^2 about 1 and the inputs' own R^2 on it about 0; a
    feature that is exactly the inputs' prediction is the input-explained direction."""
    from icrl_interp.interventions import experiment, selective

    g = np.random.default_rng(3)
    N, n = 60, 6
    Z = g.standard_normal((N, n, 3))
    extra = g.standard_normal((N, n))  # what the inputs cannot explain
    y = Z @ np.array([1.0, -2.0, 0.5]) + extra
    train, test = np.arange(40), np.arange(40, 60)
    X = np.stack([extra, Z[..., 0] - 2 * Z[..., 1] + 0.5 * Z[..., 2], g.standard_normal((N, n))], -1)
    fit = selective.fit(experiment._probe, X, Z, y, train, test)
    assert fit.probe["r2_test"] > 0.99 and abs(fit.probe["input_r2_test"]) < 0.05
    assert abs(fit.selective.u[0]) > 0.99  # the residual's direction is the feature that holds it
    assert abs(fit.input.u[1]) > 0.99
    sel = selective.selectivity_of(fit.sums.sum(0))
    assert sel == pytest.approx(fit.probe["r2_test"] - max(fit.probe["input_r2_test"], 0.0), abs=1e-9)


# ------------------------------------------------------------------ the verdict's causal evidence
class _FakeRunner:
    """Stands in for causal.Runner: the output of prompt i under an erasure along c is OUT[key(c)][i]."""

    table: dict = {}
    dtype = torch.float64

    def __init__(self, model, site, pos, width, batch_size):
        self.n = pos - 1

    def run(self, z, edit=None, features=False):
        base = np.full((z.shape[0], 1), 5.0)  # not 0: a change is out - base, never out + base
        feats = np.zeros((z.shape[0], self.n, 3)) if features else None
        if edit is None:
            return base, feats
        return base + self.table[int(np.argmax(np.abs(edit.c)))][: z.shape[0], None], feats


def test_causal_evidence_excess_interval_and_top(monkeypatch):
    """Candidates 'a' (direction e0) and 'b' (e1) against random draws; outputs are set per direction, so the
    per-task excess, its bootstrap interval (same resamples, redrawn here) and the top are known."""
    N, tasks = 12, 6
    task = np.repeat(np.arange(tasks), 2)
    test = np.ones(N, bool)
    test[:2] = False  # task 0 trains
    g = np.random.default_rng(0)
    a_change = 1.0 + g.random(N)  # candidate a moves the output a lot
    b_change = 0.3 + 0.05 * g.random(N)  # b about as much as the random directions
    r_change = 0.3 + 0.05 * g.random(N)
    monkeypatch.setattr(causal, "site_of", lambda *a, **k: SimpleNamespace(canonical="blocks.0.hook_resid_post",
                                                                           point="layer0"))
    monkeypatch.setattr(causal, "Runner", _FakeRunner)
    monkeypatch.setattr(causal, "random_directions", lambda w, d, s, l: np.tile([0.0, 0.0, 1.0], (d, 1)))
    idx = np.nonzero(test)[0]
    _FakeRunner.table = {0: a_change[idx], 1: b_change[idx], 2: r_change[idx]}
    lay = construct.task_config("linear-td", {"d": 1, "n": 3}).model.layout
    data = VD.VerdictData(z=np.zeros((N, 4, lay.d_model)), layout=lay, gamma=0.9, task_id=task, hints=None,
                          readouts={}, output=np.zeros((N, 1)), readout_kind="layout",
                          acts={0: g.standard_normal((N, 3, 3))})
    measure = causal_verdict.causation(None, draws=4, seed=5, resamples=300)
    out = measure(data, 0, {"a": np.array([1.0, 0, 0]), "b": np.array([0, 1.0, 0])}, test)
    per_task = lambda v: np.array([v[task[idx] == t].mean() for t in range(1, tasks)])  # noqa: E731
    ex = {"a": per_task(a_change[idx]) - per_task(r_change[idx]), "b": per_task(b_change[idx]) - per_task(r_change[idx])}
    draw = np.random.default_rng([5, 0, 0xC0A5]).integers(0, tasks - 1, size=(300, tasks - 1))
    for c in ("a", "b"):
        got = out["candidates"][c]
        assert got["excess"] == pytest.approx(ex[c].mean(), rel=1e-12)
        assert got["output_change"] == pytest.approx(per_task({"a": a_change, "b": b_change}[c][idx]).mean(), rel=1e-12)
        np.testing.assert_allclose(got["excess_ci"], [pct(ex[c][draw].mean(1), 2.5), pct(ex[c][draw].mean(1), 97.5)],
                                   rtol=1e-12)
        assert got["exceeds_random"] == (got["excess_ci"][0] > 0)
    assert out["candidates"]["a"]["exceeds_random"] and out["candidates"]["b"]["excess_ci"][0] < 0
    assert out["top"] == "a" and out["n_tasks"] == tasks - 1 and out["n_prompts"] == N - 2
    assert out["random_output_change"] == pytest.approx(per_task(r_change[idx]).mean(), rel=1e-12)
    assert out["top_margin"] == pytest.approx(ex["a"].mean() - ex["b"].mean(), rel=1e-12)
    m = ex["a"][draw].mean(1) - ex["b"][draw].mean(1)
    np.testing.assert_allclose(out["top_margin_ci"], [pct(m, 2.5), pct(m, 97.5)], rtol=1e-12)
    # max_tasks keeps the first held-out tasks only
    few = causal_verdict.causation(None, draws=4, seed=5, resamples=300, max_tasks=3)(
        data, 0, {"a": np.array([1.0, 0, 0])}, test)
    assert few["n_tasks"] == 3 and few["n_prompts"] == 6 and "top_margin" not in few
    # no candidate beats the random directions: no top
    _FakeRunner.table = {0: r_change[idx] - 0.2, 1: b_change[idx], 2: r_change[idx]}
    none = measure(data, 0, {"a": np.array([1.0, 0, 0])}, test)
    assert none["top"] is None and not none["candidates"]["a"]["exceeds_random"]


def test_truth_is_the_true_value_of_the_query_state(linear):
    model, cfg, roles = linear
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=12)
    s = np.asarray(st.batch.prompt.states)[st.test_index, -1]
    values = np.asarray(st.batch.tasks["values"])[st.test_index]
    assert st.truth_kind == "true value"
    np.testing.assert_array_equal(st.truth[:, 0], values[np.arange(s.size), s])
    np.testing.assert_allclose(st.value_error(st.base), np.abs(st.base - st.truth)[:, 0], rtol=4 * EPS, atol=0)


def test_random_erasures_keep_the_methods_set_point(linear):
    model, cfg, roles = linear
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=12)
    g = causal.random_directions(4, 1, seed=0)[0]
    mean, zero = st.erase_random("mean", g), st.erase_random("zero", g)
    np.testing.assert_allclose(mean.c, zero.c, rtol=0, atol=0)
    assert zero.m == 0.0 and mean.m == pytest.approx(float(st.mean_x @ mean.c), rel=1e-12)
    assert st.erase("zero").m == 0.0 and st.erase("mean").m == st.mean
    steer = st.steer(2.0, g)
    np.testing.assert_allclose(steer.v, 2.0 * st.std * g / np.linalg.norm(g), rtol=1e-12)


def test_compare_models_by_hand(linear):
    """The trained-vs-random-init section from per-task arrays: the excess (TD minus the mean draw) of each
    model, their paired difference, on the task resamples of rng([seed, 0xB007])."""
    model, cfg, roles = linear
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=16)
    N = st.z_test.shape[0]
    g = np.random.default_rng(1)
    arr = lambda: (1.0 + g.random(N), 0.5 * g.random((N, 3)))  # noqa: E731
    tm = causal.Measured({"output_change": {"ratio": {"value": 2.0}}}, [{"scale": 1.0}],
                         {"output": arr(), "value_error": arr(), "steer": [arr()]}, 1.0)
    bm = causal.Measured({"output_change": {"ratio": {"value": 1.0}}}, [{"scale": 1.0}],
                         {"output": arr(), "value_error": arr(), "steer": [arr()]}, 1.0)
    bst = replace(st, base=3 * st.base, probe_sums=st.probe_sums * np.array([2.0, 1.0, 1.0, 1.0]))
    out = causal.compare_models(tm, bm, st, bst, seed=4, n_boot=300)
    idx = np.random.default_rng([4, 0xB007]).integers(0, N, size=(300, N))
    ex = lambda pair: pair[0] - pair[1].mean(1)  # noqa: E731
    a, b = ex(tm.per_task["output"]), ex(bm.per_task["output"])
    got = out["erasure"]["output_change"]
    assert got["trained"]["mean"] == pytest.approx(a.mean(), rel=1e-12)
    assert got["random_init"]["mean"] == pytest.approx(b.mean(), rel=1e-12)
    d = (a - b)[idx].mean(1)
    np.testing.assert_allclose(got["difference"]["ci"], [pct(d, 2.5), pct(d, 97.5)], rtol=1e-12)
    rnd = out["erasure"]["random_output_change"]
    assert rnd["trained"]["mean"] == pytest.approx(tm.per_task["output"][1].mean(), rel=1e-12)
    assert out["erasure"]["td_output_change"]["random_init"]["mean"] == pytest.approx(bm.per_task["output"][0].mean())
    ve = out["erasure"]["value_error_change"]["difference"]["mean"]
    assert ve == pytest.approx((ex(tm.per_task["value_error"]) - ex(bm.per_task["value_error"])).mean(), rel=1e-12)
    st_pt = out["steering"][0]
    assert st_pt["scale"] == 1.0 and st_pt["difference"]["mean"] == pytest.approx(
        (ex(tm.per_task["steer"][0]) - ex(bm.per_task["steer"][0])).mean(), rel=1e-12)
    assert st_pt["exceeds_random_init"] == causal.verdict(st_pt, "excess output change, steering s=1")
    assert out["exceeds_random_init"] == causal.verdict(got, "excess output change")
    assert out["probe_exceeds_random_init"] == causal.verdict(out["probe_r2_test"], "held-out probe R²")
    assert out["ratio"] == {"trained": {"value": 2.0}, "random_init": {"value": 1.0}}
    assert out["scale"]["random_init"] == pytest.approx(3 * out["scale"]["trained"], rel=1e-12)
    assert out["scale"]["trained"] == pytest.approx(np.sqrt(np.mean(np.sum(st.base ** 2, -1))), rel=1e-12)
    assert out["scale"]["target"] == pytest.approx(np.sqrt(np.mean(np.sum(st.truth ** 2, -1))), rel=1e-12)
    pr = out["probe_r2_test"]  # the random-init copy's residuals are twice the model's: a lower R^2
    assert pr["difference"]["mean"] > 0 and pr["difference"]["mean"] == pytest.approx(
        pr["trained"]["mean"] - pr["random_init"]["mean"], rel=1e-12)


def test_verdict_api_sources(tmp_path):
    """A recording is read (its path, or the label, names the source); a model without a recording is recorded
    on its task first; neither, or a model without its task, is a one-line error."""
    from analyzers import analyzer_data as D
    from icrl_interp.models import theta_star_model

    path = D.write_recording(tmp_path / "r.h5", "linear-td", n_prompts=40, batch=40)
    v = causal_verdict.verdict(path, bootstrap=20, candidates=["td0", "lstd"], steps=5, progress=False)
    assert v["source"] == str(path) and v["settings"]["n_prompts"] == 40 and v["verdict"]["best"] == "td0"
    named = causal_verdict.verdict(path, bootstrap=20, candidates=["td0"], steps=5, label="mine", progress=False,
                                   max_prompts=20)
    assert named["source"] == "mine" and named["settings"]["n_prompts"] == 20
    with pytest.raises(UserError, match="give a recording, or a model with its task"):
        causal_verdict.verdict()
    plan = construct.options("linear-td", {"d": 2, "n": 6, "layers": 2}).plan()
    model = theta_star_model("linear-td", **plan.model, **plan.constants)
    with pytest.raises(UserError, match="needs its task"):
        causal_verdict.verdict(model=model)
    cfg = construct.task_config("linear-td", {"d": 2, "n": 6, "layers": 2})
    w = causal_verdict.verdict(model=model, task=cfg, tasks=24, bootstrap=20, causal=False, candidates=["td0"],
                               steps=3, progress=False, baseline="none")
    assert w["source"].endswith("on linear-td") and w["settings"]["n_prompts"] == 24
    assert w["layers"][0]["causation"]["available"] is False


def test_measure_signed_change_value_error_and_leace_by_hand(linear):
    """Signed output change -(a.c) mean_k (b.x_k - m) with its interval on the third draw of rng([seed, 0xB007])
    (after the output and value-error comparisons); value-error change |out - truth| - |base - truth|; the
    LEACE eraser's cosine with the TD direction."""
    model, cfg, roles = linear
    a = model.a.detach().numpy()
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=24, seed=2)
    X = st.features[st.test_index]
    N = X.shape[0]
    G = causal.random_directions(4, 3, seed=2, layer=0)
    m = causal.measure(st, "leace", G, [], seed=2, n_boot=100)
    td = st.erase("leace")
    signed = -(a @ td.c) * (X @ td.b - td.m).mean(1)
    got = m.erasure["output_change"]["td"]["signed"]
    assert got["mean"] == pytest.approx(signed.mean(), rel=1e-9)
    rng = np.random.default_rng([2, 0xB007])
    rng.integers(0, N, size=(100, N)), rng.integers(0, N, size=(100, N))  # the two comparisons before it
    idx = rng.integers(0, N, size=(100, N))
    np.testing.assert_allclose(got["ci"], [pct(signed[idx].mean(1), 2.5), pct(signed[idx].mean(1), 97.5)], rtol=1e-9)
    out = st.base + signed[:, None]
    ve = np.abs(out - st.truth)[:, 0] - np.abs(st.base - st.truth)[:, 0]
    np.testing.assert_allclose(m.per_task["value_error"][0], ve, rtol=1e-9, atol=1e-12)
    assert m.erasure["value_error_change"]["td"]["mean"] == pytest.approx(ve.mean(), rel=1e-9)
    assert "ratio" not in m.erasure["value_error_change"]
    assert m.erasure["leace_cosine"] == pytest.approx(td.c @ st.direction / np.linalg.norm(td.c), rel=1e-12)
    sizes = [causal.erased_variance(st.cov_x, st.erase_random("leace", g)) for g in G]
    assert m.erasure["erased_variance"]["random"] == pytest.approx(np.mean(sizes), rel=1e-12)
    assert m.erasure["r2_after"]["before"] == st.probe["r2_test"]
    assert m.erasure["r2_after"]["td"] == st.r2_after(td)
    assert m.erasure["r2_after"]["random"] == pytest.approx(np.mean([st.r2_after(st.erase_random("leace", g))
                                                                     for g in G]), rel=1e-12)
    assert m.steering == [] and "leace_cosine" not in causal.measure(st, "mean", G, [], 2, 20).erasure


def test_causal_test_section_fields(linear):
    model, cfg, roles = linear
    res = causal.causal_test(model, cfg, 0, roles=roles, tasks=16, random_draws=3, bootstrap=20, steer=(1.0,),
                             baseline="none", seed=1, refits=0)
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=16, seed=1)
    assert res["tasks"] == {"train": st.train_index.size, "test": st.test_index.size, "prompt_seed": 1,
                            "split_seed": 1}
    assert res["value_error"]["base"] == pytest.approx(float(np.abs(st.base - st.truth).mean()), rel=1e-12)
    assert res["value_error"]["target"] == "true value"
    assert res["task"] == {"family": "linear-td", "n": 8, "output": "query", "output_width": 1}
    assert res["direction"]["mean"] == st.mean and res["direction"]["std"] == st.std
    assert res["direction"]["width"] == 4 and res["direction"]["source"] == "probe"
    assert "coef" not in res["direction"] and res["direction"]["r2_test"] == st.probe["r2_test"]
    assert (res["layer"], res["n_layers"], res["random_draws"], res["bootstrap"]) == (0, 1, 3, 20)
    assert res["method"] == "leace" and res["hook"] == "blocks.0.hook_resid_post" and res["module"] == "layer0"


def test_given_roles_win_over_the_probe_specs(linear, tmp_path):
    model, cfg, roles = linear
    spec = tmp_path / "spec.toml"
    spec.write_text('[roles]\nresid_post = "nothing{layer}"\n')
    kw = dict(tasks=8, random_draws=2, bootstrap=10, steer=(), baseline="none", refits=0)
    res = causal.causal_test(model, cfg, 0, roles=roles, probe=spec, **kw)  # the spec's roles are not read
    assert res["module"] == "layer0"
    with pytest.raises(UserError):
        causal.causal_test(model, cfg, 0, probe=spec, **kw)


def test_batches_do_not_change_the_outputs(linear):
    """16 prompts of 9 positions in batches of 3: every prompt runs once, with the outputs of one batch."""
    model, cfg, roles = linear
    one = causal.prepare(model, cfg, 0, roles=roles, tasks=16)
    small = causal.prepare(model, cfg, 0, roles=roles, tasks=16, batch_size=3)
    assert small.z_test.shape[1] < 16 and small.base.shape == one.base.shape
    np.testing.assert_allclose(small.base, one.base, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(small.features, one.features, rtol=1e-12, atol=1e-14)
    edit = one.erase("mean")
    np.testing.assert_allclose(small.output(edit), one.output(edit), rtol=1e-12, atol=1e-14)


def test_explained_by_is_the_column_and_the_no_bootstrap_error_at_the_step():
    """selective.explained_by: the prompt's context columns, then reward regression's error r - w_k.phi (batch TD
    at discount 0, written out here) at reference step k, the last step where k is beyond the reference's."""
    from icrl_interp.interventions import selective

    cfg = construct.task_config("linear-td", {"n_layers": 2, "n": 8})
    z = np.asarray(cfg.sample(5, np.random.default_rng(0)).prompt.z)
    n, lay = 8, cfg.model.layout
    phi, r = z[:, :n, lay.slice("phi")], z[:, :n, lay.slice("reward")][..., 0]
    w, eps = np.zeros((5, phi.shape[-1])), []
    for _ in range(3):  # steps 0, 1, 2 of reward regression from w = 0
        e = r - np.einsum("bnd,bd->bn", phi, w)
        eps.append(e)
        w = w + (cfg.model.alpha / n) * np.einsum("bn,bnd->bd", e, phi)
    for step, want in ((1, eps[1]), (2, eps[2]), (7, eps[2])):
        got = selective.explained_by(cfg, z, step, n)
        np.testing.assert_array_equal(got[..., :-1], z[:, :n])  # exact: a copy
        np.testing.assert_allclose(got[..., -1], want, rtol=0, atol=1e-12)
