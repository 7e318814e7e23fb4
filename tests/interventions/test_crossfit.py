"""Cross-fitting of the selective test (`causal_test(..., crossfit=True)`, docs/causal.md "Cross-fitting"): the
second fold swaps the split, each fold is measured on its own held-out tasks with its own directions, and every
statistic is pooled over all tasks on one set of resamples. Expected values are recomputed here from each fold
measured alone (the single-fold path), never from the pooled code."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.core.errors import UserError
from icrl_interp.interventions import causal, selective

from .test_mutants_causal import linear, pct  # noqa: F401  (linear: the fixture, a linear model of the columns)


def test_fold_1_swaps_the_split(linear):
    model, cfg, roles = linear
    a = causal.prepare(model, cfg, 0, roles=roles, tasks=20, seed=3)
    b = causal.prepare(model, cfg, 0, roles=roles, tasks=20, seed=3, fold=1)
    np.testing.assert_array_equal(b.test_index, a.train_index)  # index sets: exact
    np.testing.assert_array_equal(b.train_index, a.test_index)
    with pytest.raises(UserError, match="fewer than the probe's 5"):
        causal.prepare(model, cfg, 0, roles=roles, tasks=8, test_fraction=0.25, fold=1)  # 2 held out -> train 2
    with pytest.raises(UserError, match="fold 2"):
        causal.prepare(model, cfg, 0, roles=roles, tasks=20, fold=2)


def test_pooled_statistics_are_each_fold_alone_concatenated(linear):
    """Pooled arrays are fold 0's then fold 1's, each from its own setup's output and directions (a fold measured
    through the first fold's setup, or not swapped, differs); the criteria are resampled over all 20 tasks."""
    model, cfg, roles = linear
    a = causal.prepare(model, cfg, 0, roles=roles, tasks=20, seed=3)
    b = causal.prepare(model, cfg, 0, roles=roles, tasks=20, seed=3, fold=1)
    G = causal.random_directions(4, 5, seed=3, layer=0)
    out, (s, i, r) = causal.measure_selective(a, "mean", G, seed=4, n_boot=200, others=(b,))
    _, (s0, i0, r0) = causal.measure_selective(a, "mean", G, seed=4, n_boot=200)
    _, (s1, i1, r1) = causal.measure_selective(b, "mean", G, seed=4, n_boot=200)
    assert not np.allclose(s0, s1[:s0.size])  # the folds' effects differ, so the concatenation is a real check
    np.testing.assert_allclose(s, np.concatenate([s0, s1]), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(i, np.concatenate([i0, i1]), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(r, np.concatenate([r0, r1]), rtol=1e-12, atol=1e-15)
    idx = np.random.default_rng([4, 0x5E1EC7]).integers(0, 20, size=(200, 20))
    e = out["erasure"]
    for key, v in (("excess_over_random", s - r.mean(1)), ("minus_input_explained", s - i),
                   ("against_input", s - 0.5 * i)):
        assert e[key]["mean"] == pytest.approx(v.mean(), rel=1e-9, abs=1e-15)
        np.testing.assert_allclose(e[key]["ci"], [pct(v[idx].mean(1), 2.5), pct(v[idx].mean(1), 97.5)], rtol=1e-8)
    sums = np.concatenate([a.selective.sums, b.selective.sums])
    want = selective.selectivity_of(sums[idx].sum(1))
    np.testing.assert_allclose(out["selectivity"]["ci"], [pct(want, 2.5), pct(want, 97.5)], rtol=1e-9)
    cf = out["crossfit"]
    assert cf["folds"] == 2 and cf["held_out_tasks"] == 20  # counts: exact
    assert [f["held_out_tasks"] for f in cf["per_fold"]] == [10, 10]
    assert cf["per_fold"][0]["cosine_selective_first_fold"] == pytest.approx(1.0, abs=1e-12)


def test_causal_test_crossfit_concludes_on_all_tasks_and_default_is_unchanged(linear, monkeypatch):
    """The conclusion reads the pooled criteria with all 20 tasks held out and test fraction 1 (every task is held
    out once, so `more_tasks` asks for that many tasks); without `crossfit` nothing changes."""
    from icrl_interp.interventions import conclusion

    model, cfg, roles = linear
    seen, decide = [], conclusion.decide
    monkeypatch.setattr(conclusion, "decide", lambda crit, n, frac, *a, **k: seen.append((n, frac)) or decide(
        crit, n, frac, *a, **k))
    kw = dict(roles=roles, tasks=20, seed=3, random_draws=4, bootstrap=50, steer=(), baseline="none", refits=0)
    plain = causal.causal_test(model, cfg, 0, **kw)
    cross = causal.causal_test(model, cfg, 0, crossfit=True, **kw)
    assert seen == [(10, 0.5), (20, 1.0)]  # exact: counts and the fractions passed
    assert "crossfit" not in plain["selective"] and cross["selective"]["crossfit"]["folds"] == 2
    crit = {c["name"]: c for c in cross["conclusion_detail"]["criteria"]}
    assert crit["against the input"]["mean"] == cross["selective"]["erasure"]["against_input"]["mean"]
    assert plain["direction"] == cross["direction"]  # the other fields are the split's (fold 0's)
