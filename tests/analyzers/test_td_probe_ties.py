"""The TD probes' penalty choice does not depend on how the prompts were cut into chunks
(icrl_interp/analyzers/td_probe.py, `tied_choice`): the smallest penalty whose CV error is within
TIE_EPS eps64 of the least, relative to the constant prediction's CV error. A live analysis reads in
smaller chunks than its recording is analyzed in (analyze.CHUNK_MIB), and both must choose the same.

Mutants killed: the strict argmin back (the chunkings below choose differently: asserted as the
precondition), the largest tied penalty instead of the smallest, a tolerance of 0 or one not scaled by
the constant prediction's error, the live chunk default back to the file's (one chunk each: the
comparison would not compare chunkings; asserted)."""
from __future__ import annotations

import importlib

import json

import numpy as np
import pytest

from icrl_interp import cli
from icrl_interp.analyzers import td_probe as T
from icrl_interp.analyzers.analyze import CHUNK_MIB, DEFAULT_CHUNK_MIB

K = 4  # training folds; fold K is the held-out one


def test_the_smallest_penalty_within_rounding_of_the_least_is_chosen():
    tol = T.TIE_EPS * T.EPS64  # relative to a scale of 1
    cv = np.array([[1.0 + 0.5 * tol, 5.0, 2.0 + 2 * tol],  # tied with the least (column 0); column 2: see below
                   [1.0 + 3.0 * tol, 4.0, 9.0],  # not tied (column 0)
                   [1.0, 3.0 + 0.5 * tol, 2.0],  # the least (columns 0, 2); tied with row 3 (column 1)
                   [1.0 + 0.9 * tol, 3.0, 9.0]])  # tied (column 0); the least (column 1)
    assert T.tied_choice(cv, np.array([1.0, 1.0, 1.0])).tolist() == [0, 2, 2]
    assert T.tied_choice(cv, np.array([1.0, 1.0, 4.0])).tolist() == [0, 2, 0]  # column 2 within 4 x its scale
    assert np.argmin(cv, axis=0).tolist() == [2, 3, 2]  # what the strict rule would pick


def _feed(X, Y, fold, step):
    """A ProbeAccumulator fed the prompts in chunks of `step` (its shift x0 is the first chunk's mean)."""
    acc = T.ProbeAccumulator(X.shape[-1], Y.shape[-1], k=K)
    for lo in range(0, len(X), step):
        s = slice(lo, lo + step)
        acc.update(X[s], [Y[s]], T.fold_grouping(fold[s], np.ones(len(X[s]), dtype=bool), K))
    return acc


@pytest.fixture
def choices(monkeypatch):
    """Every `tied_choice` made: (the strict argmin of its CV errors, the choice)."""
    seen, choose = [], T.tied_choice

    def spy(cv, scale):
        out = choose(cv, scale)
        seen.append((np.argmin(cv, axis=0), out))
        return out
    monkeypatch.setattr(T, "tied_choice", spy)
    return seen


def test_a_flat_cv_curve_gives_the_same_penalty_in_any_chunks(choices):
    """Targets that are exact linear functions of the features: every small penalty fits them to
    rounding, so the CV curve is flat there and its strict argmin is decided by the rounding of the sums,
    which the chunking changes. The tie rule chooses the same penalty in one chunk and in chunks of 7."""
    rng = np.random.default_rng(0)
    B, n = 120, 4
    X = rng.standard_normal((B, n, 3)) * [1.0, 3.0, 0.5] + [2.0, -1.0, 5.0]
    Y = X @ rng.standard_normal((3, 4)) + rng.standard_normal(4)
    fold = T.task_folds(np.arange(B), 0, 0.25, K)
    one, many = _feed(X, Y, fold, B).result(), _feed(X, Y, fold, 7).result()
    (strict_one, chosen_one), (strict_many, chosen_many) = choices
    assert not np.array_equal(strict_one, strict_many)  # the case is real: the strict rule flips here
    assert np.array_equal(chosen_one, chosen_many)
    assert (chosen_one == 0).all()  # exact targets: every small penalty ties, the smallest is chosen
    np.testing.assert_allclose(one["alpha"], many["alpha"], rtol=1e-12)  # the same grid point (10x apart)
    np.testing.assert_allclose(many["r2"], one["r2"], rtol=0, atol=64 * T.EPS64)  # R^2 ~ 1: the scale is 1


def _floats(a, b, path=""):
    """Pairs (path, x, y) of the floats of two JSON trees of the same structure (structure asserted)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        return [p for k in a for p in _floats(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list):
        assert len(a) == len(b), path
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in _floats(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [(path, a, b)]
    assert a == b or path in (".source", ".kind"), (path, a, b)
    return []


def test_record_also_analyze_and_analyze_of_its_file_choose_the_same_penalties(tmp_path, monkeypatch, choices):
    """`record --also-analyze` (the live analysis, in the live chunk default, here shrunk to many chunks)
    and `analyze` of the file it wrote (one chunk) choose the same penalty for every probe target, and
    agree within float64 rounding as tests/golden/make_golden.py compares: 1e-9 relative plus 64 eps64 at
    the analysis' scale (its largest float), for numbers that are ~0 in exact arithmetic (a selectivity of
    an exact probe). The sums are the same in another order and about another shift x0. (linear-td theta*:
    its probes hold the TD errors exactly, so their CV curves are flat; the strict argmin flips here.)"""
    assert CHUNK_MIB["live"] < DEFAULT_CHUNK_MIB  # a live analysis reads smaller chunks than a file's
    monkeypatch.setitem(CHUNK_MIB, "live", 0.1)  # many chunks of this small run, one for the file
    monkeypatch.setattr(importlib.import_module("icrl_interp.analyzers.analyze"), "LIVE_BATCH_MIB", 0.0)  # not whole batches
    ck, rec = tmp_path / "ck", tmp_path / "r.h5"
    assert cli.main(["construct", "linear-td", "--out", str(ck)]) == 0
    assert cli.main(["record", str(ck), "--tasks", "64", "--batch-size", "16", "--baseline", "none", "--no-progress",
                     "--out", str(rec),
                     "--also-analyze", "--json", str(tmp_path / "live.json")]) == 0
    live = list(choices)
    choices.clear()
    assert cli.main(["analyze", str(rec), "--json", str(tmp_path / "file.json")]) == 0
    assert len(choices) == len(live) > 0
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(live, choices))  # the strict rule would differ
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(live, choices))
    live_json, file_json = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("live", "file"))
    assert live_json.pop("live")["prompts"] == 64  # the live run's own record, not in a file's analysis
    pairs = _floats(live_json, file_json)
    assert len(pairs) > 100
    scale = max(abs(x) for _, x, _ in pairs)
    bad = [(p, x, y) for p, x, y in pairs if abs(x - y) > 1e-9 * max(abs(x), abs(y)) + 64 * T.EPS64 * scale]
    assert not bad, bad[:5]
