"""Known answers for every statistic and decision gate of the algorithm verdict (analyzers/verdict.py), each
written so that a one-line mutant fails it: the bootstrap interval's quantiles (2.5 -> 5), the finite-sample
share it needs, the 'fits' gates (min R^2 inclusive, the interval's LOWER bound above 0 and above the input
baseline, the input-baseline gate itself), 'clear' (the margin interval's LOWER bound above 0), the default
step budget and min R^2, and the held-out R^2 with its bootstrap recomputed here from the task sums.

Expected numbers are computed independently: np.percentile / closed forms, or loops over the tasks with the
resample counts of `td_probe.resampled_sums` read off an identity matrix (the resamples themselves are the
only thing shared with the code under test).
"""
from __future__ import annotations

import inspect

import h5py
import numpy as np
import pytest
from analyzers import analyzer_data as D

from icrl_interp.verdicts import candidates as C
from icrl_interp.verdicts import causal_evidence as causal_verdict
from icrl_interp.analyzers import td_probe
from icrl_interp.verdicts import behaviour as VD
from icrl_interp.analyzers.readout import Ridge
from icrl_interp.commands import verdict as verdict_cmd
from icrl_interp.core.errors import UserError

EPS = np.finfo(np.float64).eps


# ------------------------------------------------------------------ interval
def test_interval_is_the_2_5_and_97_5_percentiles():
    """On 0..1000 the linear-interpolation percentiles are the samples 25 and 975 themselves (exact)."""
    assert VD.interval(np.arange(1001.0)) == [25.0, 975.0]
    s = np.random.default_rng(0).standard_normal(400)
    want = [np.quantile(s, 0.025), np.quantile(s, 0.975)]
    np.testing.assert_allclose(VD.interval(s), want, rtol=0, atol=16 * EPS)


def test_interval_needs_95_percent_finite_samples():
    s = np.arange(100.0)
    s[:5] = np.nan  # exactly 95 finite: enough
    assert VD.interval(s) == [float(np.percentile(s[5:], 2.5)), float(np.percentile(s[5:], 97.5))]
    s[5] = np.inf  # 94 finite: not enough
    assert VD.interval(s) is None
    assert VD.interval(np.array([])) is None
    assert VD.interval(np.full(10, np.nan)) is None


def test_num_is_none_for_none_and_non_finite():
    assert VD._num(None) is None and VD._num(np.nan) is None and VD._num(-np.inf) is None
    assert VD._num(np.float32(0.25)) == 0.25 and type(VD._num(np.int64(3))) is float


def test_summary_is_the_mean_context_column_then_the_last_column():
    z = np.arange(2 * 3 * 2, dtype=float).reshape(2, 3, 2)  # 2 prompts, 2 context columns + 1 last
    want = np.array([[1.0, 2.0, 4.0, 5.0], [7.0, 8.0, 10.0, 11.0]])  # exact: halves of even sums
    np.testing.assert_array_equal(VD._summary(z), want)


def test_task_sums_group_rows_by_sorted_task():
    values = np.array([[1.0, 10.0], [2.0, 20.0], [4.0, 40.0]])
    uniq, sums = VD._task_sums(values, np.array([7, 3, 7]))
    np.testing.assert_array_equal(uniq, [3, 7])
    np.testing.assert_array_equal(sums, [[2.0, 20.0], [5.0, 50.0]])  # exact: small integers


def test_grows_with_layer():
    assert VD._grows([1, 2, 3]) is True
    assert VD._grows([1, 2, 2]) is True  # non-decreasing and larger at the end
    assert VD._grows([2, 2]) is False  # never grows
    assert VD._grows([2, 1, 3]) is False  # falls once
    assert VD._grows([3, 4, 3]) is False
    assert VD._grows([None, 1, None, 2]) is True  # closed forms (None) are left out
    assert VD._grows([1]) is None and VD._grows([None, 4]) is None and VD._grows([]) is None


# ------------------------------------------------------------------ decide: the gates
def _boot(*cols) -> np.ndarray:
    return np.stack([np.asarray(c, dtype=np.float64) for c in cols], 1)


def _spread(lo: float, hi: float, n: int = 1001) -> np.ndarray:
    """Samples whose [2.5, 97.5] percentile interval is [lo + 0.025 (hi - lo), lo + 0.975 (hi - lo)]."""
    return np.linspace(lo, hi, n)


FLAT = np.full(1001, 0.9)


def decide(r2, boot, baseline=np.nan, min_r2=0.5, names=("a", "b")):
    return VD.decide(list(names), np.asarray(r2, dtype=float), boot, baseline, np.zeros(boot.shape[0]), min_r2)


def test_decide_best_runner_up_and_margin():
    b = _boot(_spread(0.0, 1.0), _spread(0.0, 0.5), FLAT)
    out = decide([0.7, np.nan, 0.9], b, names=("a", "b", "c"))
    assert out["best"] == "c" and out["runner_up"] == "a"  # NaN never ranks
    assert out["best_r2"] == 0.9 and out["margin"] == pytest.approx(0.2, abs=4 * EPS)
    assert out["best_r2_ci"] == [0.9, 0.9]
    np.testing.assert_allclose(out["margin_ci"], VD.interval(FLAT - _spread(0.0, 1.0)), rtol=0, atol=0)
    tie = decide([0.8, 0.8, 0.7], _boot(FLAT, FLAT, FLAT - 0.1), names=("a", "b", "c"))
    # b scores as a on every resample: the same predictions, an equivalent, not a runner-up (stable: a first)
    assert tie["best"] == "a" and tie["equivalent"] == ["b"] and tie["runner_up"] == "c"
    assert tie["margin"] == pytest.approx(0.1, abs=4 * EPS)
    near = decide([0.8, 0.8], _boot(FLAT, FLAT + 1e-12))  # equal points, different resamples: a runner-up
    assert near["equivalent"] == [] and near["runner_up"] == "b" and near["margin"] == 0.0
    one = VD.decide(["a"], np.array([0.9]), _boot(FLAT), np.nan, np.zeros(1001), 0.5)
    assert one["runner_up"] is None and one["margin"] is None and one["margin_ci"] is None
    assert one["fits"] and not one["clear"] and one["text"] == "a"


def test_fits_needs_r2_at_least_min_r2():
    b = _boot(FLAT, np.zeros(1001))
    assert decide([0.5, 0.0], b, min_r2=0.5)["fits"]  # exactly min_r2 fits (>=)
    assert not decide([0.5 - 1e-9, 0.0], b, min_r2=0.5)["fits"]
    assert not decide([0.5, 0.0], b, min_r2=0.5 + 1e-9)["fits"]


def test_fits_needs_the_lower_bound_above_zero():
    # lower bound 0.025 * 2 - 1 = -0.95: below 0, while the upper bound (0.95) is above it
    out = decide([0.9, 0.0], _boot(_spread(-1.0, 1.0), np.zeros(1001)))
    assert out["best_r2_ci"][0] < 0 < out["best_r2_ci"][1] and not out["fits"]
    assert out["text"].startswith("none fits: ") and "(a) has held-out R^2 0.9 " in out["text"]
    assert not decide([0.9, 0.0], _boot(np.zeros(1001), np.zeros(1001)))["fits"]  # lower bound exactly 0
    assert decide([0.9, 0.0], _boot(np.full(1001, 1e-12), np.zeros(1001)))["fits"]


def test_fits_needs_the_lower_bound_above_the_input_baseline():
    b = _boot(_spread(0.5, 1.5), np.zeros(1001))  # interval [0.525, 1.475]
    lo = b[:, 0].min() + 0.025 * (b[:, 0].max() - b[:, 0].min())
    assert decide([0.9, 0.0], b, baseline=lo - 1e-9)["fits"]
    assert not decide([0.9, 0.0], b, baseline=lo + 1e-9)["fits"]  # between the bounds: not above the interval
    assert not decide([0.9, 0.0], b, baseline=VD.interval(b[:, 0])[0])["fits"]  # equal to the lower bound
    assert not decide([0.9, 0.0], b, baseline=2.0)["fits"]  # the baseline gate is there at all
    assert decide([0.9, 0.0], b, baseline=np.nan)["fits"]  # no baseline: no gate
    out = decide([0.9, 0.0], b, baseline=1.0)
    assert "above the input baseline 1" in out["text"] and "needs >= 0.5" in out["text"]


def test_clear_needs_the_margin_interval_lower_bound_above_zero():
    best = FLAT + 0.05
    # margin samples best - other: other spread so that the margin interval straddles 0
    straddle = decide([0.95, 0.9], _boot(best, _spread(0.85, 1.05)))
    assert straddle["margin_ci"][0] < 0 < straddle["margin_ci"][1]
    assert straddle["fits"] and not straddle["clear"]
    assert straddle["text"].startswith("a, not separated from b (margin 0.05, adjusted interval [")
    assert "includes 0" in straddle["text"]
    zero = decide([0.95, 0.9], _boot(best, best))  # margin interval [0, 0]
    assert zero["margin_ci"] == [0.0, 0.0] and not zero["clear"]
    above = decide([0.95, 0.9], _boot(best, FLAT - 1e-9))
    assert above["clear"] and above["text"] == "a (margin over b: 0.05, interval above 0)"
    assert above["checks"]["runner_up"]["ci_adjusted"] == pytest.approx([0.05 + 1e-9] * 2, abs=4 * EPS)
    # a clear margin on a candidate that does not fit is not clear
    low = decide([0.45, 0.1], _boot(FLAT - 0.45, FLAT - 0.8))
    assert not low["fits"] and not low["clear"] and low["text"].startswith("none fits")


def test_decide_interval_uses_the_2_5_percentile():
    """lower bound at the 2.5th percentile 0.025 fits against a baseline 0.03 only if the 5th is used."""
    b = _boot(_spread(0.0, 1.0), np.zeros(1001))
    out = decide([0.9, 0.0], b, baseline=0.03)
    assert out["best_r2_ci"] == pytest.approx([0.025, 0.975], abs=4 * EPS) and not out["fits"]


# ------------------------------------------------------------------ behaviour: held-out R^2 and bootstrap
def _transitions(B=40, n=6, d=2, seed=0):
    g = np.random.default_rng(seed)
    return C.Transitions(g.standard_normal((B, n, d)), g.standard_normal((B, n, d)), g.standard_normal((B, n)), 0.8,
                         phi_query=g.standard_normal((B, d)))


def test_behaviour_r2_and_bootstrap_by_hand():
    """Two prompts per task; lstd (closed form) and td0 (fitted); held-out R^2 = 1 - SSE / SST with SST about
    the held-out mean, summed per task; the bootstrap redraws tasks (counts W from resampled_sums)."""
    tr = _transitions()
    B = tr.shape[0]
    g = np.random.default_rng(1)
    task = np.repeat(np.arange(B // 2), 2)
    test = np.isin(task, [1, 4, 5, 8, 11, 12, 15, 17])
    y = C.lstd(tr, {}, 0).outputs[:, 0] + 0.3 * g.standard_normal((B, 1))  # lstd plus noise
    z = g.standard_normal((B, 4, 3))
    cands = [C.CANDIDATES["lstd"], C.CANDIDATES["td0"]]
    K, seed, R = 3, 7, 200
    keys, fits, r2, boot, n_tasks, decoys, sums = VD.behaviour(tr, cands, {0: y, "output": 2 * y}, z, task, test, K,
                                                               seed, R)
    nd = len(decoys)
    assert keys == [0, "output"] and n_tasks == 8 and r2.shape == (2, 3 + nd) and boot.shape == (R, 2, 3 + nd)
    assert decoys == list(VD.D.NAMES) and sums.shape == (8, 2 * (4 + nd))
    tt = np.unique(task[test])
    W = np.concatenate(list(td_probe.resampled_sums(np.eye(tt.size), seed, R)))  # [R, tasks] draw counts
    tr_train, tr_test = tr.take(~test), tr.take(test)
    for li, scale in enumerate((1.0, 2.0)):
        Y = scale * y
        fit = C.fit(cands[1], tr_train, Y[None, ~test], K)[0]
        assert fits["td0"][li].hyper == fit.hyper and fits["td0"][li].step == fit.step
        assert fits["lstd"][li].step is None
        assert fits["lstd"][li].hyper == C.fit(cands[0], tr_train, Y[None, ~test], K)[0].hyper
        pred = {"lstd": C.lstd(tr_test.with_gamma(fits["lstd"][li].hyper["gamma"]), {}, K).outputs[:, 0],
                "td0": C.td_lambda(tr_test.with_gamma(fit.hyper["gamma"]), fit.hyper["alpha"], fit.step).outputs[:, -1]}
        S = np.concatenate([z[:, :-1].mean(1), z[:, -1]], -1)
        ridge = Ridge(S.shape[1], 1)
        ridge.update(S[~test], Y[~test])
        coef, icpt, _ = ridge.solve()
        pred["input"] = S[test] @ coef + icpt
        Yt = Y[test]
        per_task = lambda v: np.array([v[task[test] == t].sum() for t in tt])  # noqa: E731
        sst = per_task(((Yt - Yt.mean(0)) ** 2).sum(-1))
        for col, key in enumerate(("input", "lstd", "td0")):
            sse = per_task(((Yt - pred[key]) ** 2).sum(-1))
            assert r2[li, col] == pytest.approx(1 - sse.sum() / sst.sum(), rel=1e-9, abs=1e-12), key
            np.testing.assert_allclose(boot[:, li, col], 1 - (W @ sse) / (W @ sst), rtol=1e-9, atol=1e-12)
    assert r2[0, 1] > 0.5


def test_behaviour_measures_the_update_from_the_starting_output():
    """With a starting w0 the scores are of the update y - y_0 (y_0 = w0 . phi_query, the output before any
    update): the exact candidate scores 1 and the input baseline's R^2 is that of y - y_0, by hand."""
    tr = _transitions(B=30)
    g = np.random.default_rng(2)
    w0 = g.standard_normal((30, 2))
    tr = C.Transitions(tr.phi, tr.phi_next, tr.rewards, tr.gamma, w0=w0, phi_query=tr.phi_query)
    y0 = (w0 * tr.phi_query).sum(-1, keepdims=True)
    y = C.td_lambda(tr, 1.0, 2).outputs[:, 2]  # 1.0 is on the step grid
    task = np.arange(30)
    test = task % 3 == 0
    z = g.standard_normal((30, 3, 2))
    keys, fits, r2, boot, *_ = VD.behaviour(tr, [C.CANDIDATES["td0"]], {0: y}, z, task, test, 3, 0, 50)
    assert fits["td0"][0].hyper["alpha"] == 1.0 and fits["td0"][0].step == 2 and fits["td0"][0].hyper["gamma"] == 0.8
    assert r2[0, 1] == pytest.approx(1.0, abs=1e-12)
    Y = y - y0
    S = np.concatenate([z[:, :-1].mean(1), z[:, -1]], -1)
    ridge = Ridge(S.shape[1], 1)
    ridge.update(S[~test], Y[~test])
    coef, icpt, _ = ridge.solve()
    Yt = Y[test]
    want = 1 - np.sum((Yt - S[test] @ coef - icpt) ** 2) / np.sum((Yt - Yt.mean()) ** 2)
    assert r2[0, 0] == pytest.approx(want, rel=1e-9, abs=1e-12)


# ------------------------------------------------------------------ run: defaults and the split gate
def _data(tasks=60, layers=1, seed=0):
    """VerdictData of random transitions in the linear-td layout whose layer readouts are td0 outputs."""
    from icrl_interp.tasks import envs
    from icrl_interp.families import registry
    from icrl_interp.families import linear_td

    rng = np.random.default_rng(seed)
    mrp = envs.sample_boyan_chains(tasks, 6, 3, 0.9, rng, "random", 1.0, "uniform")
    p = linear_td.prompt_from_mrp(mrp, mrp.sample(10, rng), rng.integers(0, 6, size=tasks))
    data = VD.VerdictData(z=p.z, layout=p.layout, gamma=0.9, task_id=np.arange(tasks),
                          hints=registry.get("linear-td").hints, readouts={}, output=np.zeros((tasks, 1)),
                          readout_kind="layout", states=p.states, task_family="linear-td")
    tr = VD.transitions(data)
    data.readouts = {l: C.td_lambda(tr, 0.7, l + 1).outputs[:, l + 1] for l in range(layers)}
    data.output = data.readouts[layers - 1]
    return data


@pytest.mark.parametrize("layers, K", [(1, 4), (3, 8)])
def test_default_step_budget_is_two_per_layer_plus_two_at_first(layers, K):
    v = VD.run(_data(layers=layers), candidates=["td0", "lstd"], resamples=20)
    assert v["settings"]["max_steps"] == K
    assert v["output"]["layer"] == "output" and [s["layer"] for s in v["layers"]] == list(range(layers))
    assert v["settings"]["min_r2"] == 0.5 and v["settings"]["bootstrap"] == 20
    assert v["settings"]["test_fraction"] == 0.3 and v["settings"]["split_seed"] == 0
    assert VD.run(_data(), candidates=["td0"], resamples=20, steps=2)["settings"]["max_steps"] == 2


def test_defaults_of_the_api_and_the_command():
    run = inspect.signature(VD.run).parameters
    assert run["min_r2"].default == 0.5 and run["test_fraction"].default == 0.3 and run["resamples"].default == 1000
    api = inspect.signature(causal_verdict.verdict).parameters
    assert api["min_r2"].default == 0.5 and api["bootstrap"].default == 1000 and api["causal_draws"].default == 16
    assert api["causal_tasks"].default == 64 and api["max_prompts"].default == 1024
    import argparse

    p = argparse.ArgumentParser()
    verdict_cmd.add_arguments(p)
    from icrl_interp.core.cli_fields import parsed

    o = parsed(p.parse_args(["rec.h5"]), verdict_cmd.VerdictOptions)
    assert (o.min_r2, o.test_fraction, o.bootstrap, o.split_seed, o.direction_seed) == (0.5, 0.3, 1000, 0, 0)
    assert (o.random_draws, o.causal_tasks, o.max_prompts, o.max_step) == (16, 64, 1024, None)


def test_run_verdict_names_a_best_only_when_it_fits():
    data = _data(tasks=60, layers=2)
    v = VD.run(data, candidates=["td0", "mc_regression"], resamples=50, steps=3)
    assert v["verdict"]["fits"] and v["verdict"]["best"] == "td0" and v["verdict"]["label"] == "td0"
    one = VD.run(_data(tasks=60), candidates=["td0", "mc_regression"], resamples=50, steps=3)
    # one TD step from w_0 = 0 reads only rewards: every gamma' fits it exactly, so it is reward regression
    assert one["verdict"]["best"] == "reward_regression" and one["verdict"]["candidate"] == "td0"
    assert one["verdict"]["params"]["gamma"]["ci"] == [0.0, 0.9]
    none = VD.run(data, candidates=["td0", "mc_regression"], resamples=50, steps=3, min_r2=1.5)
    assert not none["verdict"]["fits"] and none["verdict"]["best"] is None
    assert none["output"]["verdict"]["best"] == "td0"  # the layer entry still ranks them


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1])
def test_test_fraction_must_lie_strictly_inside(fraction):
    with pytest.raises(UserError, match="test fraction must lie in"):
        VD.run(_data(tasks=20), test_fraction=fraction)




def test_a_split_needs_two_tasks_on_each_side():
    """The gate is at exactly 2 held-out and 2 training tasks (test fractions between the tasks' hashes)."""
    data = _data(tasks=12)
    u = np.sort(td_probe._task_uniform(data.task_id, 0))
    mid = lambda k: float((u[k - 1] + u[k]) / 2)  # noqa: E731  a fraction holding out exactly k tasks
    for k, ok in ((1, False), (2, True), (10, True), (11, False)):
        if ok:
            assert VD.run(data, candidates=["td0"], test_fraction=mid(k), resamples=10, steps=2)[
                "settings"]["n_test_prompts"] == k
        else:
            with pytest.raises(UserError, match="too few tasks for a held-out split"):
                VD.run(data, candidates=["td0"], test_fraction=mid(k), resamples=10, steps=2)


# ------------------------------------------------------------------ representation: selectivity
def _rep_inputs(N=80, n=5, seed=0):
    g = np.random.default_rng(seed)
    t = 3.0 * g.standard_normal((N, n))  # variance 9: an R^2 of counts (n / sst) would be 1 - 1/9, not ~0
    noise = lambda k: g.standard_normal((N, n, k))  # noqa: E731
    return g, t, noise


def _held_out_r2(X, y, coef, icpt, rows):
    pred = X[rows].reshape(-1, X.shape[-1]) @ coef + icpt
    yt = y[rows].ravel()
    return 1 - np.sum((yt - pred) ** 2) / np.sum((yt - yt.mean()) ** 2)


@pytest.mark.parametrize("largest", ["input", "random_init"])
def test_selectivity_is_r2_minus_the_largest_baseline(largest):
    g, t, noise = _rep_inputs()
    X = np.concatenate([t[..., None], noise(2)], -1)  # the model holds the target exactly
    half = np.concatenate([(t + 1.8 * g.standard_normal(t.shape))[..., None], noise(1)], -1)
    far = np.concatenate([(t + 6.0 * g.standard_normal(t.shape))[..., None], noise(1)], -1)
    Xin, Xb = (half, far) if largest == "input" else (far, half)
    task = np.arange(t.shape[0])
    # 2000 resamples of ~24 held-out tasks come in two blocks (of (1 << 15) // tasks), stacked along resamples
    out = VD.representation(X, Xin, Xb, {"t": t}, task, 0, 0.3, 2000)["t"]
    base = {"input": out["r2_input"], "random_init": out["r2_random_init"], "shuffled": out["r2_shuffled"]}
    assert max(base, key=base.get) == largest
    assert abs(base["shuffled"]) < 0.1  # features of one task, targets of another: nothing to read
    assert out["r2"] == pytest.approx(1.0, abs=1e-6)
    assert out["selectivity"] == pytest.approx(out["r2"] - base[largest], abs=1e-12)
    assert 0.3 < base["input" if largest == "input" else "random_init"] < 0.95
    fold = td_probe.task_folds(task, 0, 0.3, VD.FOLDS)
    test = (fold == VD.FOLDS) & (task > 0)  # the first task has no partner for the shuffled control
    assert out["r2"] == pytest.approx(_held_out_r2(X, t, out["coef"], out["intercept"], test), abs=1e-9)
    lo, hi = out["selectivity_ci"]
    assert lo <= out["selectivity"] <= hi and hi - lo < 0.5


def test_selectivity_interval_needs_five_held_out_tasks():
    g, t, noise = _rep_inputs(N=40)
    X = np.concatenate([t[..., None], noise(2)], -1)
    task = np.arange(40)
    u = np.sort(td_probe._task_uniform(task[1:], 0))  # task 0 has no partner: never scored
    for k, has_ci in ((4, False), (5, True)):
        frac = float((u[k - 1] + u[k]) / 2)
        out = VD.representation(X, noise(3), None, {"t": t}, task, 0, frac, 100)["t"]
        assert (out["selectivity_ci"] is not None) == has_ci, k
        assert out["r2_random_init"] is None and out["selectivity"] == pytest.approx(
            out["r2"] - max(out["r2_input"], out["r2_shuffled"]), abs=1e-12)


# ------------------------------------------------------------------ load: what is read from a recording
def _recording(tmp_path, name="r.h5", **kw):
    return D.write_recording(tmp_path / name, "linear-td", **kw)


def test_load_reads_the_layout_readout_of_every_layer(tmp_path):
    path = _recording(tmp_path, n_prompts=40, batch=20)
    data = VD.load(path, max_prompts=30)
    with h5py.File(path, "r") as f:
        z = f["prompts/z"][:30]
        post = {l: f[f"acts/blocks.{l}.hook_resid_post"][:30] for l in range(4)}
        gamma = float(f.attrs["gamma"])
    assert data.readout_kind == "layout" and sorted(data.readouts) == [0, 1, 2, 3] and gamma == 0.9
    assert data.z.shape[0] == 30 and data.gamma == 0.9 and data.task_family == "linear-td"
    np.testing.assert_array_equal(data.task_id, np.arange(30))  # no prompts/task_id: the prompt index
    lay = data.layout
    for l in range(4):  # the layout's readout block (sign -1) at the last column
        np.testing.assert_array_equal(data.readouts[l], -post[l][:, -1, lay.slice("reward")])
        np.testing.assert_array_equal(data.acts[l], post[l][:, :-1])  # every context column, not the query
        np.testing.assert_array_equal(data.resid_last[l], post[l][:, -1])
    np.testing.assert_array_equal(data.output, data.readouts[3])  # no outputs/model: the last layer's readout
    np.testing.assert_array_equal(data.z, z)
    assert data.notes == [] and data.baseline_acts == {}


def test_load_gates(tmp_path):
    few = _recording(tmp_path, "few.h5", n_prompts=9, batch=9)
    with pytest.raises(UserError, match="9 prompts; the verdict needs at least 10"):
        VD.load(few)
    ten = _recording(tmp_path, "ten.h5", n_prompts=12, batch=12)
    assert VD.load(ten, max_prompts=10).z.shape[0] == 10  # exactly 2 x FOLDS is enough
    with pytest.raises(UserError, match="needs at least 10"):
        VD.load(ten, max_prompts=9)
    ctx = _recording(tmp_path, "ctx.h5", n_prompts=12, batch=12, positions=":-1")  # no last column
    with pytest.raises(UserError, match="no model output"):
        VD.load(ctx)
    late = _recording(tmp_path, "late.h5", n_prompts=12, batch=12, positions="3:")
    data = VD.load(late)
    assert data.acts == {} and len(data.notes) == 4 and "not every context column" in data.notes[0]
    assert sorted(data.resid_last) == [0, 1, 2, 3]


# ------------------------------------------------------------------ the causal evidence's inputs
def test_causation_gets_each_candidates_probe_direction_and_the_held_out_mask():
    """Features (delta of td0, a constant 0, noise): every candidate with a non-zero probe has a direction,
    even one with an exact 0 entry; the callable gets the held-out mask of the split; without directions
    (constant features) it is not called."""
    data = _data(tasks=60)
    tr = VD.transitions(data)
    g = np.random.default_rng(3)
    delta = C.td_lambda(tr, 0.7, 1).internals["td_error"][:, 1]
    data.acts = {0: np.stack([delta, np.zeros_like(delta), g.standard_normal(delta.shape)], -1)}
    seen = []

    def causation(d, layer, directions, test):
        seen.append((layer, directions, test))
        return {"available": True, "top": None}

    v = VD.run(data, candidates=["td0", "mc_regression"], resamples=20, steps=3, causation=causation)
    assert len(seen) == 1 and seen[0][0] == 0 and v["layers"][0]["causation"] == {"available": True, "top": None}
    layer, directions, test = seen[0]
    assert sorted(directions) == ["mc_regression", "td0"]
    for coef in directions.values():
        assert coef.shape == (3,) and coef[1] == 0.0 and np.any(coef)
    np.testing.assert_array_equal(test, td_probe.task_folds(data.task_id, 0, 0.3, VD.FOLDS) == VD.FOLDS)
    data.acts = {0: np.ones((60, 10, 2))}  # constant features: every probe coefficient is 0
    seen.clear()
    w = VD.run(data, candidates=["td0"], resamples=20, steps=3, causation=causation)
    assert seen == [] and w["layers"][0]["causation"] == {"available": False,
                                                          "reason": "no probe directions at this layer"}


def test_load_needs_a_layout_and_prefers_the_recorded_output(tmp_path):
    def add_output(batch):
        batch["outputs/model"] = 7.0 + batch["prompts/z"][:, -1, :1]  # differs from every layer's readout

    path = _recording(tmp_path, "out.h5", n_prompts=12, batch=12, transform=add_output)
    data = VD.load(path)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(data.output, f["outputs/model"][()])
    bare = _recording(tmp_path, "bare.h5", n_prompts=12, batch=12)
    with h5py.File(bare, "r+") as f:
        del f.attrs["layout"]
    with pytest.raises(UserError, match="needs prompts in a known layout"):
        VD.load(bare)


def test_softmax_transitions_keep_state_labels_from_zero():
    from icrl_interp.tasks import envs
    from icrl_interp.families import registry
    from icrl_interp.families import softmax_td

    rng = np.random.default_rng(0)
    mrp = envs.sample_boyan_chains(6, 4, 4, 0.9, rng, "onehot", 1.0, "uniform")
    p = softmax_td.prompt_from_mrp(mrp, mrp.sample(5, rng))
    assert (p.states == 0).any() and (p.states >= 0).all()
    data = VD.VerdictData(z=p.z, layout=p.layout, gamma=0.9, task_id=np.arange(6), hints=registry.get("softmax-td").hints,
                          readouts={}, output=np.zeros((6, 1)), readout_kind="layout", states=p.states)
    tr = VD.transitions(data)
    np.testing.assert_array_equal(tr.states, p.states)
    np.testing.assert_array_equal(tr.x, p.z[..., p.layout.slice("x")])
    np.testing.assert_array_equal(tr.rewards, p.z[:, :-1, p.layout.slice("reward")][..., 0])
    data.states = np.where(p.states == 0, -1, p.states)  # an unknown state: no labels at all
    assert VD.transitions(data).states is None


def test_the_direction_is_the_most_selective_quantitys_probe():
    """Features hold td0's values (not its errors): the direction handed to the causal evidence is the probe of
    the quantity with the larger selectivity, 'value', whatever the order of the quantities."""
    data = _data(tasks=60)
    tr = VD.transitions(data)
    g = np.random.default_rng(4)
    seen = {}

    def causation(d, layer, directions, test):
        seen.update(directions)
        return {"available": True, "top": None}

    v = VD.run(data, candidates=["td0"], resamples=20, steps=3, causation=lambda *a: {"available": False})
    f = v["layers"][0]["behaviour"]["td0"]
    trace = C.td_lambda(tr, f["hyperparameters"]["alpha"], f["step"])
    value = trace.internals["value"][:, -1]
    data.acts = {0: np.stack([value, g.standard_normal(value.shape), g.standard_normal(value.shape)], -1)}
    v = VD.run(data, candidates=["td0"], resamples=20, steps=3, causation=causation)
    qs = v["layers"][0]["representation"]["candidates"]["td0"]
    assert qs["best_quantity"] == "value" and list(qs["quantities"])[0] == "td_error"
    rep = VD.representation(data.acts[0], data.z[:, :10], None, {"e": trace.internals["td_error"][:, -1],
                                                                 "v": value}, data.task_id, 0, 0.3, 20)
    assert rep["v"]["selectivity"] > rep["e"]["selectivity"]
    np.testing.assert_allclose(seen["td0"], rep["v"]["coef"], rtol=1e-9, atol=1e-12)
