"""The streaming ridge probe is scikit-learn's Ridge, splits by task, and scores known R^2 values."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from icrl_interp.analyzers import td_probe as T
from icrl_interp.core.errors import UserError


def _stats(X, y, chunks=1):
    st = T.RidgeStats(X.shape[1])
    assert st.n == 0
    st.set_origin(X[:50].mean(0), y[:50].mean())
    for part in np.array_split(np.arange(len(y)), chunks):
        st.update(X[part], y[part])
    return st


@pytest.mark.parametrize("alpha", [1e-8, 0.3, 50.0])
def test_streaming_ridge_equals_sklearn(alpha, rng):
    for _ in range(10):
        m, F = int(rng.integers(30, 200)), int(rng.integers(1, 8))
        X = rng.standard_normal((m, F)) * rng.uniform(0.1, 10, F) + rng.uniform(-50, 50, F)  # far from the origin
        y = X @ rng.standard_normal(F) + rng.standard_normal(m) + 20.0
        ref = Ridge(alpha=alpha, fit_intercept=True, solver="cholesky").fit(X, y)
        coef, b = _stats(X, y, chunks=int(rng.integers(1, 6))).fit(alpha)
        np.testing.assert_allclose(coef, ref.coef_, rtol=1e-9, atol=1e-10)
        assert b == pytest.approx(ref.intercept_, rel=1e-9, abs=1e-9)
        # scores on other data from the test statistics equal sklearn's r2 on predictions
        Xt = rng.standard_normal((80, F)) * 3 + 5
        yt = Xt @ rng.standard_normal(F) + rng.standard_normal(80)
        assert _stats(Xt, yt, chunks=3).r2(coef, b) == pytest.approx(r2_score(yt, ref.predict(Xt)), rel=1e-9, abs=1e-9)


def test_r2_has_the_predicted_value(rng):
    """y = X b + sigma eps with X ~ N(0, I): population R^2 = |b|^2 / (|b|^2 + sigma^2)."""
    F, sigma = 4, 0.8
    b = rng.standard_normal(F)
    want = b @ b / (b @ b + sigma**2)
    X = rng.standard_normal((40000, F))
    y = X @ b + sigma * rng.standard_normal(40000)
    coef, b0 = _stats(X[:20000], y[:20000]).fit(1e-6)
    got = _stats(X[20000:], y[20000:]).r2(coef, b0)
    assert got == pytest.approx(want, abs=0.01)


def test_task_folds_are_deterministic_chunk_free_and_go_by_task_id():
    idx = np.arange(100000)
    f = T.task_folds(idx, seed=3, test_fraction=0.25, k=5)
    np.testing.assert_array_equal(f[1234:5678], T.task_folds(idx[1234:5678], 3, 0.25, 5))
    assert np.mean(f == 5) == pytest.approx(0.25, abs=0.01)
    counts = np.bincount(f[f < 5], minlength=5)
    assert counts.min() > 0.9 * 0.75 * len(idx) / 5  # training folds are balanced
    assert not np.array_equal(f, T.task_folds(idx, seed=4, test_fraction=0.25, k=5))
    # 10 prompts per task, in any order: every prompt of a task lands in the task's fold
    task = np.random.default_rng(0).permutation(np.repeat(np.arange(5000), 10))
    g = T.task_folds(task, 3, 0.25, 5)
    np.testing.assert_array_equal(g, f[task])
    with pytest.raises(UserError, match="test fraction"):
        T.task_folds(idx, 0, 1.0, 5)


def _chain(task, use, chunks):
    """Partners (as row indices, -1: none) of a whole recording fed to a PartnerChain in chunks; the
    payload handed over is the row index itself."""
    chain, out = T.PartnerChain(), []
    for part in np.array_split(np.arange(task.size), chunks):
        mate, got = chain.link(use[part], task[part], part, part[:, None].astype(float))
        ok = mate >= 0
        assert np.array_equal(got[ok, 0], mate[ok]) and np.isnan(got[~ok]).all()
        out.append(mate)
    return np.concatenate(out)


def test_partner_is_the_latest_earlier_prompt_of_another_task():
    rng = np.random.default_rng(1)
    task = np.repeat(rng.permutation(150), rng.integers(1, 12, 150))  # runs of 1..11 prompts per task
    task[::7] = rng.integers(0, 150, task[::7].size)  # and some interleaving
    use = T.task_subset(task, 0, 0.7)  # only the prompts the probes use take part
    mate = _chain(task, use, 1)
    for i in range(task.size):  # brute force: the used prompt just before i's run of equal task ids
        seq = [j for j in range(i) if use[j]]
        while seq and task[seq[-1]] == task[i]:
            seq.pop()
        assert mate[i] == (seq[-1] if seq and use[i] else -1)
    ok = mate >= 0
    assert np.all(task[mate[ok]] != task[ok]) and np.all(use[mate[ok]])
    first = np.nonzero(use)[0]
    first = first[: np.argmax(task[first] != task[first[0]])]  # the first used task's leading run
    assert np.array_equal(ok, use & ~np.isin(np.arange(task.size), first))  # only it has no partner
    for chunks in (2, 7, 61, task.size):  # chunk-size free: the carry holds what is needed
        np.testing.assert_array_equal(_chain(task, use, chunks), mate)


def test_probe_accumulator_recovers_a_planted_direction_and_the_control_stays_near_zero(rng):
    """Each task has its own features; y is a fixed linear read-out of them. Shuffling targets
    across tasks destroys the relation, so the control's held-out R^2 is ~0 (slightly negative)."""
    N, n, F = 600, 10, 5
    direction = np.array([0.0, 1.0, 0.0, -1.0, 0.5])
    X = rng.standard_normal((N, n, F))
    y = (X @ direction + 0.01 * rng.standard_normal((N, n)))[..., None]
    acc = T.ProbeAccumulator(F, 2, k=4)
    chain = T.PartnerChain()
    for lo in range(0, N, 100):
        idx = np.arange(lo, lo + 100)
        fold = T.task_folds(idx, 0, 0.3, 4)
        mate, ys = chain.link(np.ones(100, bool), idx, idx, y[idx])
        acc.update(X[idx], [y[idx], ys], T.fold_grouping(fold, mate >= 0, 4))
    res = acc.result()
    assert res["r2"][0] > 0.999
    assert abs(res["r2"][1]) < 0.02
    coef = res["coef"][:, 0]
    assert coef @ direction / np.linalg.norm(coef) / np.linalg.norm(direction) > 0.9999
    assert res["n_test"] + res["n_train"] == (N - 1) * n  # the first prompt has no partner


def test_multi_target_accumulator_equals_one_ridge_per_target(rng):
    """Alpha by CV, coefficients, intercept and held-out R^2 of every target equal select_alpha + fit
    on that target alone (the accumulator skips Y_s^T Y_t, s != t, which no single fit needs)."""
    N, n, F, k = 300, 6, 4, 3
    X = rng.standard_normal((N, n, F)) * [1, 5, 0.2, 3] + 7
    Y = np.stack([X @ rng.standard_normal(F) + s * rng.standard_normal((N, n)) for s in (0.01, 1.0, 30.0)], -1)
    fold = T.task_folds(np.arange(N), 2, 0.25, k)
    acc = T.ProbeAccumulator(F, 3, k=k)
    for part in np.array_split(np.arange(N), 4):
        acc.update(X[part], [Y[part, :, :2], Y[part, :, 2:]], T.fold_grouping(fold[part], np.ones(part.size, bool), k))
    res = acc.result()
    for t in range(3):
        folds = []
        for f in range(k + 1):
            st = T.RidgeStats(F)
            st.set_origin(acc.x0, acc.y0[t])
            st.update(X[fold == f].reshape(-1, F), Y[fold == f][..., t].ravel())
            folds.append(st)
        alpha, train = T.select_alpha(folds[:k])
        coef, b = train.fit(alpha)
        assert res["alpha"][t] == pytest.approx(alpha, rel=1e-12), t
        np.testing.assert_allclose(res["coef"][:, t], coef, rtol=1e-8, atol=1e-12)
        assert res["intercept"][t] == pytest.approx(b, rel=1e-8, abs=1e-10)
        assert res["r2"][t] == pytest.approx(folds[k].r2(coef, b), rel=1e-9, abs=1e-12)
        # and the per-prompt residual sums add up to the same held-out sse
        sse = T.residual_sums(X[fold == k], Y[fold == k][..., t : t + 1], res["coef"][:, t : t + 1],
                              res["intercept"][t : t + 1]).sum()
        assert sse == pytest.approx(res["sse"][t], rel=1e-9)


def test_alpha_selection_matches_brute_force_cross_validation(rng):
    F = 3
    folds = []
    for _ in range(4):
        X = rng.standard_normal((40, F))
        folds.append(_stats(X, X @ np.array([1.0, 0.0, -2.0]) + rng.standard_normal(40)))
    alpha, train = T.select_alpha(folds)
    unit = np.trace(train.centred()[0]) / F
    def cv(a):
        total = 0.0
        for i, held in enumerate(folds):
            rest = None
            for j, st in enumerate(folds):
                if j != i:
                    rest = st if rest is None else rest + st
            total += held.sse(*rest.fit(a))
        return total
    errs = [cv(unit * r) for r in T.ALPHA_GRID]
    assert alpha == pytest.approx(unit * T.ALPHA_GRID[int(np.argmin(errs))], rel=1e-12)


def test_probe_needs_held_out_tasks():
    acc = T.ProbeAccumulator(2, 1, k=3)
    X = np.ones((4, 3, 2))
    acc.update(X, [np.ones((4, 3, 1))], T.fold_grouping(np.zeros(4, dtype=np.int64), np.ones(4, bool), 3))
    with pytest.raises(UserError, match="held-out"):
        acc.result()


def test_task_subset_keeps_whole_tasks_and_the_requested_fraction():
    idx = np.arange(200000)
    keep = T.task_subset(idx, seed=1, fraction=0.1)
    assert keep.mean() == pytest.approx(0.1, abs=0.005)
    np.testing.assert_array_equal(keep[500:900], T.task_subset(idx[500:900], 1, 0.1))
    task = np.repeat(np.arange(1000), 10)
    np.testing.assert_array_equal(T.task_subset(task, 1, 0.1), keep[task])
    assert T.task_subset(idx[:10], 1, 1.0).all()
    # independent of the fold assignment: the test share among kept prompts stays ~25%
    assert np.mean(T.task_folds(idx, 1, 0.25, 5)[keep] == 5) == pytest.approx(0.25, abs=0.01)


def test_constant_features_give_a_mean_probe_not_an_error():
    """A random-init model whose output is constant (e.g. a LayerNorm gain of 0) has features that never
    vary: the ridge system is singular, and the probe must predict the mean (R^2 = 0), not raise."""
    from icrl_interp.analyzers.td_probe import RidgeStats

    rng = np.random.default_rng(0)
    st = RidgeStats(3)
    y = rng.normal(size=50)
    st.update(np.ones((50, 3)), y)
    coef, b = st.fit(0.0)
    np.testing.assert_allclose(coef, 0.0, atol=1e-12)
    assert b == pytest.approx(y.mean())
    assert st.r2(coef, b) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("shape", [(3, 5), (4, 2, 3, 5)])
def test_max_baseline_is_the_largest_baseline_ignoring_nan(rng, shape):
    """Along axis -2 (the baselines), the largest R^2 that is not NaN; NaN where every baseline is NaN (a probe
    with none). Exact: a maximum of the same numbers. Mutants: the smallest, NaN propagated (np.maximum), the
    wrong axis, -inf left where all are NaN."""
    base = rng.standard_normal(shape)
    flat = base.reshape(-1, shape[-2], shape[-1])  # a view: [..., baselines, targets]
    flat[:, 0, 1] = np.nan  # one baseline missing
    flat[:, :, 2] = np.nan  # all missing
    flat[0, 1:, 3] = np.nan  # only the first left
    got = T.max_baseline(base).reshape(-1, shape[-1])
    for i, block in enumerate(flat):
        for t in range(shape[-1]):
            vals = block[:, t][~np.isnan(block[:, t])]
            want = vals.max() if vals.size else np.nan
            np.testing.assert_array_equal(got[i, t], want)  # exact: the same numbers' maximum
