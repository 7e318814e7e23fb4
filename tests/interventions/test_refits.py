"""Refitted intervals of the selective test (`measure_selective(..., refits=R)`, docs/causal.md "Refitting"): the
directions are fitted again on resamples of the training tasks, and bootstrap resample b reads refit 1 + (b mod R)
on its resample of the held-out tasks. Expected values are recomputed here from each refit measured alone (the
fixed-direction path), never from the nested code; refits=0 is the fixed-direction bootstrap, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.interventions import causal, experiment, selective
from icrl_interp.interventions.statistics import interval

from .test_mutants_causal import linear  # noqa: F401  (the fixture: a linear model of the columns)

KEYS = ("excess_over_random", "minus_input_explained")


def _per_fit(st, G, seed, R):
    """(s - r.mean, s - i, sums) per fit: fit 0 the setup's, then each refit measured alone without refits."""
    fits = [st] + [causal.refit(st, d) for d in causal.training_resamples(st, R, seed)]
    rows = []
    for f in fits:
        _, (s, i, r) = causal.measure_selective(f, "mean", G, seed=seed, n_boot=10, refits=0)
        rows.append((causal.excess(s, r), s - i, f.selective.sums))
    return rows


def test_no_refits_is_the_fixed_direction_bootstrap_bit_for_bit(linear):
    """refits=0: every interval is the percentile interval of the held-out resamples of the one fit (exact
    equality: the same numbers as before refits existed); the values (means) do not depend on the refits."""
    model, cfg, roles = linear
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=24, seed=2)
    G = causal.random_directions(4, 5, seed=2, layer=0)
    out, (s, i, r) = causal.measure_selective(st, "mean", G, seed=2, n_boot=200, refits=0)
    idx = np.random.default_rng([2, 0x5E1EC7]).integers(0, s.size, size=(200, s.size))
    e = out["erasure"]
    assert out["refits"] == 0 and "se" not in e["minus_input_explained"] and "se" not in out["selectivity"]
    for key, v in zip(KEYS, (causal.excess(s, r), s - i)):
        assert e[key] == {"mean": float(v.mean()), "ci": interval(v[idx].mean(1))}  # exact
    assert out["selectivity"]["ci"] == interval(selective.selectivity_of(st.selective.sums[idx].sum(1)))
    refitted, _ = causal.measure_selective(st, "mean", G, seed=2, n_boot=200, refits=1)
    for key in KEYS:
        assert refitted["erasure"][key]["mean"] == e[key]["mean"]  # the values are fit 0's: exact
    assert refitted["selectivity"]["mean"] == out["selectivity"]["mean"] and refitted["refits"] == 1
    assert refitted["erasure"]["minus_input_explained"]["refit_sd"] is None  # one refit: no SD


def test_refitted_intervals_hold_each_refit_and_are_wider_when_the_fit_is_noisy(linear):
    """Few training tasks (8): resample b reads refit 1 + (b mod R) on held-out resample b; the refits' own values
    vary, so the intervals are wider than the fixed-direction ones, and `se`, `refit_mean`, `refit_sd` are the
    samples' and the refits' spread. Kills dropping the refits, reading fit 0 (or one refit) everywhere, and a
    refit/resample pairing other than b mod R."""
    model, cfg, roles = linear
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=20, seed=2, test_fraction=0.6)
    assert st.train_index.size == 8 and st.test_index.size == 12  # counts: exact
    G = causal.random_directions(4, 5, seed=2, layer=0)
    R, B, N = 4, 300, 12
    fixed, _ = causal.measure_selective(st, "mean", G, seed=7, n_boot=B, refits=0)
    out, _ = causal.measure_selective(st, "mean", G, seed=7, n_boot=B, refits=R)
    rows = _per_fit(st, G, 7, R)
    idx = np.random.default_rng([7, 0x5E1EC7]).integers(0, N, size=(B, N))
    which = 1 + np.arange(B) % R
    for k, key in enumerate(KEYS):
        per = np.stack([row[k] for row in rows])  # [1 + R, N]
        samples = per[which[:, None], idx].mean(1)
        got = out["erasure"][key]
        np.testing.assert_allclose(got["ci"], interval(samples), rtol=1e-10, atol=1e-15)
        assert got["se"] == pytest.approx(samples.std(ddof=1), rel=1e-9)
        assert got["refit_mean"] == pytest.approx(per[1:].mean(), rel=1e-9, abs=1e-15)
        assert got["refit_sd"] == pytest.approx(per[1:].mean(1).std(ddof=1), rel=1e-9)
        assert got["refit_sd"] > 0.0
        width = lambda ci: ci[1] - ci[0]  # noqa: E731
        assert width(got["ci"]) > 1.5 * width(fixed["erasure"][key]["ci"])  # measured: 6.8x and 1.9x
    sums = np.stack([row[2] for row in rows])
    want = selective.selectivity_of(sums[which[:, None], idx].sum(1))
    np.testing.assert_allclose(out["selectivity"]["ci"], interval(want), rtol=1e-10)
    assert out["selectivity"]["refit_sd"] > 0.0


def test_a_refit_resamples_the_training_tasks_with_copies_in_one_fold(linear, monkeypatch):
    """The identity resample refits exactly the setup's directions; a resample's copies of one task share a CV
    fold (`_probe`'s groups: the task's rank among the distinct tasks drawn), and the held-out tasks are the
    setup's; the draws are a pure function of (seed, fold)."""
    model, cfg, roles = linear
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=24, seed=2)
    m = st.train_index.size
    same = causal.refit(st, np.arange(m))
    for which in ("selective", "input"):
        a, b = getattr(same.selective, which), getattr(st.selective, which)
        np.testing.assert_allclose(a.u, b.u, rtol=1e-10, atol=1e-13)
        assert a.mean == pytest.approx(b.mean, rel=1e-10, abs=1e-13)
    np.testing.assert_allclose(same.selective.sums, st.selective.sums, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(same.cov_x, st.cov_x, rtol=1e-10, atol=1e-13)
    seen = []
    probe = experiment._probe
    monkeypatch.setattr(experiment, "_probe", lambda X, y, tr, te, shuffled=True, groups=None: seen.append(
        (tr, te, groups)) or probe(X, y, tr, te, shuffled, groups))
    draw = np.array([3, 0, 3, 3, 7, 0, 1, 2, 9, 9, 5, 4])
    assert draw.size == m
    causal.refit(st, draw)
    tasks = st.train_index[np.sort(draw)]
    rank = {t: j for j, t in enumerate(np.unique(tasks))}
    for tr, te, groups in seen:
        np.testing.assert_array_equal(tr, np.arange(m))
        np.testing.assert_array_equal(te, np.arange(m, m + st.test_index.size))
        np.testing.assert_array_equal(groups, [rank[t] for t in tasks])  # exact: copies share a group
    d = causal.training_resamples(st, 3, seed=4)
    np.testing.assert_array_equal(d, causal.training_resamples(st, 3, seed=4))
    assert d.shape == (3, m) and not np.array_equal(d, causal.training_resamples(st, 3, seed=4, fold=1))


def test_a_negative_refit_count_is_refused_before_any_work(linear):
    from icrl_interp.core.errors import UserError

    model, cfg, roles = linear
    with pytest.raises(UserError, match="--refits"):
        causal.causal_test(model, cfg, 0, roles=roles, refits=-1)


def test_cross_fitted_refit_r_pools_every_folds_refit_r(linear):
    """Cross-fitted, each fold draws its own training resamples (fold-seeded), and refit r pools fold 0's refit r
    with fold 1's; the values are the cross-fitted ones without refits."""
    model, cfg, roles = linear
    a = causal.prepare(model, cfg, 0, roles=roles, tasks=20, seed=3)
    b = causal.prepare(model, cfg, 0, roles=roles, tasks=20, seed=3, fold=1)
    G = causal.random_directions(4, 3, seed=3, layer=0)
    R, B = 2, 100
    out, _ = causal.measure_selective(a, "mean", G, seed=4, n_boot=B, others=(b,), refits=R)
    plain, _ = causal.measure_selective(a, "mean", G, seed=4, n_boot=B, others=(b,))
    per = []
    for r in range(R):
        fa = causal.refit(a, causal.training_resamples(a, R, 4, 0)[r])
        fb = causal.refit(b, causal.training_resamples(b, R, 4, 1)[r])
        _, (s, i, _) = causal.measure_selective(fa, "mean", G, seed=4, n_boot=10, others=(fb,))
        per.append(s - i)
    per = np.stack(per)
    idx = np.random.default_rng([4, 0x5E1EC7]).integers(0, 20, size=(B, 20))
    got = out["erasure"]["minus_input_explained"]
    np.testing.assert_allclose(got["ci"], interval(per[(np.arange(B) % R)[:, None], idx].mean(1)), rtol=1e-10)
    assert got["mean"] == plain["erasure"]["minus_input_explained"]["mean"]  # exact: fit 0's
    assert out["crossfit"] == plain["crossfit"] and out["refits"] == R
