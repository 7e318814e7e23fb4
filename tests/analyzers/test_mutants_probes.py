"""Known answers for the probes' statistics and gates (analyzers/td_probe.py): the bootstrap interval's
tails, R^2 from sums and its sst floor, the resamples (counts of task draws), the split's gates, the
ridge statistics' sample-count gates and residual sums, each so that a one-line mutant fails a test.
Expected numbers are closed forms or loops written here."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.analyzers import td_probe as T
from icrl_interp.core.errors import UserError

EPS = np.finfo(np.float64).eps


def test_percentile_interval_tails():
    s = np.arange(1001.0)[:, None]
    # samples 25 and 975 (the tail (1 - 0.95) / 2 * 100 is 2.5 to a few ulps)
    np.testing.assert_allclose(T.percentile_interval(s), [[25.0], [975.0]], rtol=0, atol=1e-9)
    np.testing.assert_allclose(T.percentile_interval(s, level=0.9), [[50.0], [950.0]], rtol=0, atol=1e-9)
    two = np.column_stack([np.arange(1001.0), np.full(1001, np.nan)])
    two[:500, 0] = np.nan  # finite samples only: 500..1000
    out = T.percentile_interval(two)
    np.testing.assert_allclose(out[:, 0], [500 + 12.5, 500 + 487.5], rtol=0, atol=1e-9)
    assert np.isnan(out[:, 1]).all()
    assert T.LEVEL == 0.95 and T.BOOTSTRAP == 1000 and T.MIN_CI_TASKS == 5


def test_r2_of_sums_by_hand_and_its_floor():
    y = np.array([1.0, 2.0, 3.0, 6.0])  # n 4, sum 12, sum y^2 50: sst = 50 - 144 / 4 = 14
    assert T.r2_of_sums(7.0, 4.0, y.sum(), (y * y).sum()) == 0.5  # exact
    assert np.isnan(T.r2_of_sums(1.0, 4.0, 8.0, 16.0))  # constant targets: sst 0
    assert np.isnan(T.r2_of_sums(0.0, 0.0, 0.0, 0.0))  # no samples
    got = T.r2_of_sums(np.array([7.0, 14.0]), np.array([4.0, 4.0]), np.array([12.0, 12.0]), np.array([50.0, 50.0]))
    np.testing.assert_array_equal(got, [0.5, 0.0])


def test_resampled_sums_are_task_draw_counts():
    """Every resample draws `tasks` tasks with replacement: M = I gives the counts, which sum to `tasks`;
    the same seed gives the same resamples, blocks of them chained in one stream."""
    tasks = 7
    W = np.concatenate(list(T.resampled_sums(np.eye(tasks), seed=3, resamples=50)))
    assert W.shape == (50, tasks) and np.all(W.sum(1) == tasks) and np.all(W == np.round(W))
    rng = np.random.default_rng([3, 0xB007])
    want = np.stack([np.bincount(rng.integers(0, tasks, size=tasks), minlength=tasks) for _ in range(50)])
    np.testing.assert_array_equal(W, want)
    M = np.arange(2.0 * tasks).reshape(tasks, 2)
    np.testing.assert_array_equal(np.concatenate(list(T.resampled_sums(M, 3, 50))), W @ M)
    big = np.concatenate(list(T.resampled_sums(np.eye(5000)[:, :3], seed=0, resamples=20)))
    assert big.shape == (20, 3)  # blocks of (1 << 15) // 5000 = 6 resamples, the last one of 2
    first = np.random.default_rng([0, 0xB007]).integers(0, 5000, size=(20, 5000))
    np.testing.assert_array_equal(big, np.stack([np.bincount(r, minlength=5000)[:3] for r in first]))


@pytest.mark.parametrize("cores", [1, 2])
def test_resampled_sums_side_by_side_are_the_blocks_drawn_one_by_one(monkeypatch, cores):
    """Blocks of resamples multiplied side by side (`threads.spread`, SPREAD_BLOCKS at a time) are, bit for bit, the
    blocks drawn in order from one stream and multiplied one by one: over several batches of blocks, the last one
    short; with 2 cores the products ran in the spread threads."""
    import threading

    from icrl_interp.core import threads

    monkeypatch.setattr(threads, "allowed_cores", lambda: cores)
    monkeypatch.delenv(threads.ENV, raising=False)
    from threadpoolctl import threadpool_limits

    tasks, resamples = 3000, 500  # blocks of 10 resamples: 50 blocks, SPREAD_BLOCKS at a time
    M = np.random.default_rng(1).standard_normal((tasks, 37))
    rng, want = np.random.default_rng([4, 0xB007]), []
    for lo in range(0, resamples, 10):
        draw = rng.integers(0, tasks, size=(10, tasks)) + (np.arange(10) * tasks)[:, None]
        with threadpool_limits(1):  # as in the spread threads (OpenBLAS's bits depend on its thread count)
            want.append(np.bincount(draw.ravel(), minlength=10 * tasks).reshape(10, tasks).astype(np.float64) @ M)
    assert len(want) > 2 * T.SPREAD_BLOCKS
    where = []

    class Spy(np.ndarray):  # records the thread each block's product runs in
        def __matmul__(self, other):
            where.append(threading.current_thread().name)
            return np.asarray(self) @ other

    real = np.bincount
    monkeypatch.setattr(T.np, "bincount", lambda *a, **k: real(*a, **k).view(Spy))
    with threadpool_limits(1):  # one core: inline, in the pools the analysis gives it (`threads.limited`)
        got = list(T.resampled_sums(M, seed=4, resamples=resamples))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)
    assert len(where) == len(want) and all(n.startswith("icrl-interp-spread") == (cores > 1) for n in where)


def test_task_fold_gates_and_the_held_out_share():
    ids = np.arange(20000)
    for bad in (0.0, 1.0):
        with pytest.raises(UserError, match="test fraction must lie in"):
            T.task_folds(ids, 0, bad, 5)
    with pytest.raises(UserError, match="at least 2 folds"):
        T.task_folds(ids, 0, 0.3, 1)
    f = T.task_folds(ids, 0, 0.3, 2)  # two folds are enough
    assert set(np.unique(f)) == {0, 1, 2}
    u = T._task_uniform(ids, 0)
    np.testing.assert_array_equal(f == 2, u < 0.3)
    np.testing.assert_array_equal(f[u >= 0.3], ((u[u >= 0.3] - 0.3) / 0.7 * 2).astype(int))
    assert abs(np.mean(u < 0.5) - 0.5) < 0.02 and u.min() >= 0.0 and u.max() < 1.0


def test_task_subset_fraction():
    ids = np.arange(20000)
    assert T.task_subset(ids, 0, 1.0).all() and T.task_subset(ids, 0, 2.0).all()
    half = T.task_subset(ids, 0, 0.5)
    assert abs(half.mean() - 0.5) < 0.02
    np.testing.assert_array_equal(half, T._task_uniform(ids, 0x5EED) < 0.5)


def test_fold_grouping_orders_by_fold_and_drops_what_is_not_kept():
    fold = np.array([2, 0, 1, 0, 2, 1])
    keep = np.array([True, True, False, True, True, True])
    order, bounds = T.fold_grouping(fold, keep, 2)
    np.testing.assert_array_equal(order[: bounds[-1]], [1, 3, 5, 0, 4])
    np.testing.assert_array_equal(bounds, [0, 2, 3, 5])


def test_ridge_stats_gates_and_residuals():
    st = T.RidgeStats(1)
    st.update(np.array([[1.0]]), np.array([2.0]))
    with pytest.raises(UserError, match="too few training samples"):
        st.fit(1.0)
    st.update(np.array([[3.0]]), np.array([6.0]))  # two samples: y = 2 x exactly
    coef, b = st.fit(0.0)
    assert coef[0] == pytest.approx(2.0, rel=8 * EPS) and b == pytest.approx(0.0, abs=16 * EPS)
    assert st.sse(np.array([1.0]), 1.0) == pytest.approx((2 - 2) ** 2 + (6 - 4) ** 2, rel=8 * EPS)
    assert st.sst() == pytest.approx(8.0, rel=8 * EPS) and st.r2(np.array([1.0]), 1.0) == pytest.approx(0.5)
    flat = T.RidgeStats(1)
    flat.update(np.array([[1.0], [2.0]]), np.array([3.0, 3.0]))
    assert np.isnan(flat.r2(np.array([0.0]), 3.0))  # constant targets: no R^2
    with pytest.raises(UserError, match="too few training tasks"):
        T.select_alpha([T.RidgeStats(1), T.RidgeStats(1)])


def test_residual_sums_by_hand():
    X = np.array([[[1.0], [2.0]], [[0.0], [1.0]]])  # 2 prompts, 2 columns, 1 feature
    Y = np.array([[[3.0], [5.0]], [[1.0], [0.0]]])
    got = T.residual_sums(X, Y, np.array([[2.0]]), np.array([1.0]))  # predictions 2x + 1
    np.testing.assert_array_equal(got, [[0.0], [0.0 + 9.0]])  # exact


def test_residual_sums_of_target_parts_are_those_of_the_joined_targets_bit_for_bit():
    """Targets given as parts side by side (a probe's own and its partners': no joined copy) give the sums of the
    joined array, and both the sums of the plain expression, bit for bit (float32 features, an intercept: a
    residual formed as X coef - Y or without the intercept squares to other numbers); the inputs stay as given."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((5, 3, 4)).astype(np.float32)
    Y1, Y2 = rng.standard_normal((5, 3, 2)), rng.standard_normal((5, 3, 3))
    coef, b = rng.standard_normal((4, 5)), rng.standard_normal(5)
    before = [a.copy() for a in (X, Y1, Y2)]
    joined = np.concatenate([Y1, Y2], -1)
    r = joined - (X.reshape(-1, 4) @ coef).reshape(5, 3, 5) - b
    want = (r * r).sum(1)
    np.testing.assert_array_equal(T.residual_sums(X, [Y1, Y2], coef, b), want)
    np.testing.assert_array_equal(T.residual_sums(X, joined, coef, b), want)
    for a, was in zip((X, Y1, Y2), before):
        np.testing.assert_array_equal(a, was)


def test_probe_accumulator_gates():
    acc = T.ProbeAccumulator(1, 1, k=2)
    X = np.arange(8.0).reshape(4, 2, 1)
    Y = 2 * X
    everything_train = (np.array([0, 1, 2, 3]), np.array([0, 2, 4, 4, 4]))  # folds 0, 1 hold 2 prompts each
    acc.update(X, [Y], everything_train)
    with pytest.raises(UserError, match="no held-out tasks"):
        acc.result()
    test_only = T.ProbeAccumulator(1, 1, k=2)
    test_only.update(X, [Y], (np.array([0, 1, 2, 3]), np.array([0, 0, 0, 4, 4])))
    with pytest.raises(UserError, match="too few training tasks"):
        test_only.result()
    ok = T.ProbeAccumulator(1, 1, k=2)
    ok.update(X, [Y], (np.array([0, 1, 2, 3]), np.array([0, 1, 2, 4, 4])))  # one prompt in each training fold
    res = ok.result()
    assert res["n_train"] == 4 and res["n_test"] == 4
    assert res["r2"][0] == pytest.approx(1.0, abs=1e-9)


def test_constant_features_give_the_mean_probe_for_many_targets_at_once():
    """Features that never vary (a dead layer) with several targets (a probe and its shuffled control): every
    coefficient is 0 and each target is predicted by its training mean. Regression: the smallest penalty was
    denormal (1e-300 x 1e-10), the multi-target solve overflowed its reciprocal and returned NaN coefficients,
    so the verdict handed NaN probe directions to the causal evidence."""
    g = np.random.default_rng(0)
    task = np.arange(60)
    Y = [g.standard_normal((60, 10, 1)), 3.0 + g.standard_normal((60, 10, 1))]
    fold = T.task_folds(task, 0, 0.3, 5)
    acc = T.ProbeAccumulator(2, 2, 5)
    acc.update(np.ones((60, 10, 2)), Y, T.fold_grouping(fold, task >= 0, 5))
    res = acc.result()
    np.testing.assert_array_equal(res["coef"], 0.0)
    train = fold < 5
    np.testing.assert_allclose(res["intercept"], [Y[0][train].mean(), Y[1][train].mean()], rtol=1e-12)
    assert np.all(res["r2"] <= 0) and np.all(res["r2"] > -0.2) and np.all(res["alpha"] > 0)


def test_splitmix64_is_the_published_generator():
    """The split hashes task ids with SplitMix64 (Steele et al. 2014): seeded with 0 its first two outputs are
    0xE220A8397B1DCDAF and 0x6E789E6AA1B965F4; any other id against big-integer arithmetic written here."""
    from .test_mutants_stats import splitmix as ref

    first = T.splitmix64(np.array([0, 0x9E3779B97F4A7C15], dtype=np.uint64))
    assert [int(v) for v in first] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]
    assert [ref(0), ref(0x9E3779B97F4A7C15)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]  # the reference too
    ids = [1, 12345, 2**40 + 7]
    assert [int(v) for v in T.splitmix64(np.array(ids))] == [ref(i) for i in ids]
    # a task's uniform: the top 53 bits of splitmix64(id ^ splitmix64(seed)) over 2^53
    u = T._task_uniform(np.array([5]), 3)[0]
    assert u == (ref(5 ^ ref(3)) >> 11) / 2.0 ** 53
