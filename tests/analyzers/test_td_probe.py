"""The streaming ridge probe is scikit-learn's Ridge, splits by task, and scores known R^2 values."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from icrl_interp.analyzers import td_probe as T
from icrl_interp.errors import UserError


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


def test_task_folds_are_deterministic_chunk_free_and_pair_partners():
    idx = np.arange(100000)
    f = T.task_folds(idx, seed=3, test_fraction=0.25, k=5)
    np.testing.assert_array_equal(f[1234:5678], T.task_folds(idx[1234:5678], 3, 0.25, 5))
    assert np.all(f[0::2] == f[1::2])  # partners share a fold
    assert np.mean(f == 5) == pytest.approx(0.25, abs=0.01)
    counts = np.bincount(f[f < 5], minlength=5)
    assert counts.min() > 0.9 * 0.75 * len(idx) / 5  # training folds are balanced
    assert not np.array_equal(f, T.task_folds(idx, seed=4, test_fraction=0.25, k=5))
    np.testing.assert_array_equal(T.partner(np.array([0, 1, 6, 7])), [1, 0, 7, 6])
    with pytest.raises(UserError, match="test fraction"):
        T.task_folds(idx, 0, 1.0, 5)


def test_probe_accumulator_recovers_a_planted_direction_and_the_control_stays_near_zero(rng):
    """Each task has its own features; y is a fixed linear read-out of them. Shuffling targets
    across tasks destroys the relation, so the control's held-out R^2 is ~0 (slightly negative)."""
    N, n, F = 600, 10, 5
    direction = np.array([0.0, 1.0, 0.0, -1.0, 0.5])
    X = rng.standard_normal((N, n, F))
    y = X @ direction + 0.01 * rng.standard_normal((N, n))
    acc = T.ProbeAccumulator(F, k=4)
    for lo in range(0, N, 100):
        idx = np.arange(lo, lo + 100)
        ys = y[T.partner(idx)]
        acc.update(X[idx], y[idx], ys, T.task_folds(idx, 0, 0.3, 4))
    res = acc.result()
    assert res["r2"] > 0.999
    assert abs(res["r2_shuffled"]) < 0.02
    cos = res["coef"] @ direction / np.linalg.norm(res["coef"]) / np.linalg.norm(direction)
    assert cos > 0.9999
    assert res["n_test"] + res["n_train"] == N * n


def test_prompts_without_a_partner_are_left_out(rng):
    X = rng.standard_normal((5, 3, 2))
    y = X @ np.array([1.0, -1.0])
    ys = y[[1, 0, 3, 2, 0]].copy()
    ys[4] = np.nan  # an odd last prompt
    acc = T.ProbeAccumulator(2, k=2)
    acc.update(X, y, ys, np.array([0, 0, 1, 1, 2]))
    assert acc.G[2, -1, -1] == 0 and acc.G[0, -1, -1] == 6 and acc.G[1, -1, -1] == 6


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
    acc = T.ProbeAccumulator(2, k=3)
    X = np.ones((4, 3, 2))
    acc.update(X, np.ones((4, 3)), np.ones((4, 3)), np.zeros(4, dtype=np.int64))
    with pytest.raises(UserError, match="held-out"):
        acc.result()


def test_task_subset_keeps_whole_pairs_and_the_requested_fraction():
    idx = np.arange(200000)
    keep = T.task_subset(idx, seed=1, fraction=0.1)
    assert np.all(keep[0::2] == keep[1::2])
    assert keep.mean() == pytest.approx(0.1, abs=0.005)
    np.testing.assert_array_equal(keep[500:900], T.task_subset(idx[500:900], 1, 0.1))
    assert T.task_subset(idx[:10], 1, 1.0).all()
    # independent of the fold assignment: the test share among kept prompts stays ~25%
    assert np.mean(T.task_folds(idx, 1, 0.25, 5)[keep] == 5) == pytest.approx(0.25, abs=0.01)
