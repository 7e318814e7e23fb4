"""Known answers for the science analyzers' splits, scores and gates (readout.py, td_step.py, convergence.py),
each written so that a one-line mutant fails a test: the task-id hashes of the tuned lens's split and of the
TD step's calibration half (pinned against big-integer SplitMix64 written here), the lens scores' pooled
R^2 and its gates, the ridge's GCV penalty, and the TD step's root selection.
"""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.analyzers import convergence, readout, td_step


def splitmix(x: int) -> int:
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def uniform(task: int, key: int) -> float:
    return (splitmix(task ^ key) >> 11) / 2.0 ** 53


def test_tuned_lens_split_is_the_salted_task_hash():
    tasks = np.arange(40)
    key = splitmix(3 + 0x7E11)
    want = np.array([uniform(int(t), key) < 0.3 for t in tasks])
    np.testing.assert_array_equal(readout.held_out(tasks, 3, 0.3), want)
    assert 0 < want.sum() < 40


def test_calibration_half_is_the_hash_of_seed_0x57e9_below_one_half():
    tasks = np.arange(60)
    want = np.array([uniform(int(t), splitmix(0x57E9)) < 0.5 for t in tasks])
    np.testing.assert_array_equal(td_step.calibration_tasks(tasks), want)
    assert td_step.EVAL_MAX_PROMPTS == 1 << 16


def test_score_pools_r2_over_prompts_and_needs_two():
    s = readout.Score(per_task_max=0, width=1)
    out = np.array([[1.0], [2.0], [4.0]])  # sst about the mean 7/3: 14/3
    y = out + np.array([[0.5], [-0.5], [1.0]])  # sse 1.5
    s.update(np.array([1.0, 2.0, np.nan]), np.array([0, 1, 2]), y, out)
    assert s.value_error == 1.5  # the mean of the finite errors (exact)
    assert s.r2() == pytest.approx(1 - 1.5 / (14 / 3), rel=1e-14)
    gap = (0.5 + 0.5 + 1.0) / 3
    assert s.entry(with_r2=True) == {"value_error": 1.5, "output_gap": pytest.approx(gap, rel=1e-14),
                                     "r2": pytest.approx(1 - 1.5 / (14 / 3), rel=1e-14)}
    one = readout.Score(0, 1)
    one.update(np.array([1.0]), np.array([0]), np.array([[1.0]]), np.array([[2.0]]))
    assert one.r2() is None  # one prompt: no R^2
    flat = readout.Score(0, 1)
    flat.update(np.array([1.0, 1.0]), np.array([0, 1]), np.array([[1.0], [3.0]]), np.array([[2.0], [2.0]]))
    assert flat.r2() is None  # a constant output: no R^2
    empty = readout.Score(0, 1)
    assert empty.value_error is None and empty.entry() == {"value_error": None, "output_gap": None}


def test_target_errors_by_hand():
    value = readout.Target("value", 1)
    data = {"prompts/state": np.array([[0, 2], [1, -1]]), "tasks/values": np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])}
    got = value.errors(np.array([[2.5], [0.0]]), data)
    assert got[0] == 0.5 and np.isnan(got[1])  # query state 2 of task 0: |2.5 - 3|; an unknown state: NaN
    teacher = readout.Target("teacher", 2)
    got = teacher.errors(np.array([[3.0, 4.0]]), {"reference/output": np.array([[0.0, 0.0]])})
    assert got[0] == 5.0


def test_ridge_gcv_picks_the_smallest_penalty_among_ties_and_needs_two_prompts():
    fit = readout.Ridge(2, 1)
    fit.update(np.array([[1.0, 0.0]]), np.array([[1.0]]))
    with pytest.raises(ValueError, match="fewer than 2"):
        fit.solve()
    exact = readout.Ridge(2, 1)
    X = np.random.default_rng(0).standard_normal((30, 2))
    exact.update(X, X @ np.array([[2.0], [-1.0]]))
    coef, icpt, alpha = exact.solve()
    unit = np.trace(np.cov(X.T, bias=True)) * 30 / 2
    assert alpha == pytest.approx(unit * readout.ALPHA_GRID[0], rel=1e-9)  # an exact fit: the first penalty
    np.testing.assert_allclose(coef[:, 0], [2.0, -1.0], atol=1e-8)


def test_alpha_fit_takes_the_least_vd_of_zero_and_the_positive_stationary_points():
    fit = td_step.AlphaFit(1)
    with pytest.raises(Exception, match="no calibration task"):
        fit.alpha()
    # one task, one state, phi = 1, w_1(alpha) = 2 alpha (c_0 = 0, c_1 = 2), v_tf = 3: VD = (3 - 2 alpha)^2
    coef = np.array([[[0.0], [2.0]]])
    fit.update(np.array([[3.0]]), coef, np.array([[[1.0]]]), np.array([[1.0]]))
    np.testing.assert_allclose(fit.poly, [9.0, -12.0, 4.0], rtol=1e-14)
    assert fit.alpha() == pytest.approx(1.5, rel=1e-12) and fit.mean_vd(1.5) == pytest.approx(0.0, abs=1e-12)
    neg = td_step.AlphaFit(1)  # v_tf = -3: the minimum at alpha = -1.5 is not allowed, 0 is the best step
    neg.update(np.array([[-3.0]]), coef, np.array([[[1.0]]]), np.array([[1.0]]))
    assert neg.alpha() == 0.0
    flat = td_step.AlphaFit(1)  # VD does not depend on alpha
    flat.update(np.array([[0.0]]), np.zeros((1, 2, 1)), np.array([[[1.0]]]), np.array([[1.0]]))
    assert flat.alpha() == 0.0


def test_depth_summary_counts_falls_and_rates():
    s = convergence.depth_summary([0, 1, 2, 3], [4.0, 2.0, 2.0, 1.0])
    assert s["decreasing"] == 2 / 3 and s["ratio"] == 0.25 and s["first"] == 4.0 and s["last"] == 1.0
    x = np.array([0.0, 1.0, 2.0, 3.0])
    y = np.log([4.0, 2.0, 2.0, 1.0])
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    assert s["rate"] == pytest.approx(np.exp(slope), rel=1e-12)
    z = convergence.depth_summary([0, 1, 2], [0.0, 1.0, 0.5], [None, 2.0, 1.0])
    assert z["ratio"] is None and z["rate"] == pytest.approx(0.5)  # the zero error is left out of the rate
    assert z["reference_rate"] == pytest.approx(0.5) and z["last_over_reference"] == 0.5
    assert convergence.depth_summary([0, 1], [1.0, 2.0], [0.0, None])["last_over_reference"] is None


def test_diagonality_accumulator_by_hand():
    """gamma 0.5: threshold 0.75. Task 0: diagonal (0.8, 0.9), contracts; task 1: (0.75, 1.0), at the threshold:
    does not; task 2: state 1 never seen (NaN row), diagonal min 0.6; a task with no state at all is skipped."""
    from icrl_interp.analyzers import kernel

    nan = np.nan
    M = np.array([[[0.8, 0.2], [0.1, 0.9]], [[0.75, 0.25], [0.0, 1.0]], [[0.6, 0.4], [nan, nan]],
                  [[nan, nan], [nan, nan]]])
    acc = kernel.DiagonalityAccumulator(gamma=0.5, n_states=2)
    acc.update(M[:2])
    acc.update(M[2:])
    r = acc.result()
    assert r["n_tasks"] == 3 and r["threshold"] == 0.75 and r["frac_tasks_contracting"] == 1 / 3
    assert r["mean"] == pytest.approx((0.85 + 0.875 + 0.6) / 3, rel=1e-14)
    assert r["min"] == pytest.approx((0.8 + 0.75 + 0.6) / 3, rel=1e-14)
    assert r["margin"] == pytest.approx(r["min"] - 0.75, rel=1e-14) and r["worst_task_min"] == 0.6
    np.testing.assert_allclose(r["M_hat"], [[(0.8 + 0.75 + 0.6) / 3, (0.2 + 0.25 + 0.4) / 3], [0.05, 0.95]],
                               rtol=1e-14)
    assert kernel.DiagonalityAccumulator(0.5, 2).result() is None
    assert "M_hat" not in acc.result(with_matrix=False)


def test_positions_attribute_forms():
    from icrl_interp.analyzers import inputs
    from icrl_interp.core.errors import UserError

    for raw in ("", ":", "None", "null", b":"):
        np.testing.assert_array_equal(inputs.positions({"positions": raw}, (2, 5), 1, 5, "h"), np.arange(5))
    np.testing.assert_array_equal(inputs.positions({}, (2, 5), 1, 5, "h"), np.arange(5))  # no attribute: all
    np.testing.assert_array_equal(inputs.positions({"pos_slice": "1:4"}, (2, 3), 1, 5, "h"), [1, 2, 3])
    np.testing.assert_array_equal(inputs.positions({"positions": "0:5:2"}, (3, 7), 0, 5, "h"), [0, 2, 4])
    with pytest.raises(UserError, match="cannot parse"):
        inputs.positions({"positions": "a:b"}, (2, 5), 1, 5, "h")
    with pytest.raises(UserError, match="axis 1 has 4 positions"):
        inputs.positions({"positions": ":"}, (2, 4), 1, 5, "h")


def test_json_schema_size_gate(tmp_path, monkeypatch):
    from icrl_interp.analyzers import inputs

    assert inputs.CAUSAL_MAX_BYTES == 64 << 20  # a causal JSON is a few kB; larger .json files are not read
    p = tmp_path / "c.json"
    p.write_text('{"schema": "icrl_interp.causal/2"}')
    size = p.stat().st_size
    monkeypatch.setattr(inputs, "CAUSAL_MAX_BYTES", size)
    assert inputs.json_schema(p) == "icrl_interp.causal/2" and inputs.is_causal_json(p)  # at the limit: read
    monkeypatch.setattr(inputs, "CAUSAL_MAX_BYTES", size - 1)
    assert inputs.json_schema(p) is None


def test_chunked_reading_reports_the_prompts_read(monkeypatch, tmp_path):
    """The progress bar advances by the prompts of each chunk and ends at the recording's size."""
    import tqdm.auto

    from analyzers import analyzer_data as D
    from icrl_interp.analyzers import inputs
    from icrl_interp.recording.format import Recording

    steps = []

    class Bar:
        def __init__(self, total, **kw):
            steps.append(total)

        def update(self, k):
            steps.append(k)

        def close(self):
            pass

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    path = D.write_recording(tmp_path / "r.h5", "linear-td", n_prompts=10, batch=10)
    with Recording(path) as rec:
        got = [(a, b) for a, b, _ in inputs.iter_chunks(rec, ["prompts/z"], rows=4)]
    assert got == [(0, 4), (4, 8), (8, 10)] and steps == [10, 4, 4, 2]


def test_family_dims_searches_every_width_up_to_d_model(monkeypatch):
    """A family whose layout is phi (d rows) and one value row has d = d_model - 1: the search reaches it."""
    from types import SimpleNamespace

    from icrl_interp.tasks import layouts
    from icrl_interp.analyzers import inputs

    lay = lambda d, m=None: layouts.build_layout("one-row", [("phi", d), ("value", 1)], "value")  # noqa: E731
    monkeypatch.setattr(inputs.registry, "get", lambda name: SimpleNamespace(layout=lay, needs_m=False))
    assert inputs.family_dims("one-row", lay(4)) == (4, None)
    only = lambda d, m=None: layouts.build_layout("phi-only", [("phi", d)], "phi")  # noqa: E731
    monkeypatch.setattr(inputs.registry, "get", lambda name: SimpleNamespace(layout=only, needs_m=False))
    assert inputs.family_dims("phi-only", only(3)) == (3, None)  # d = d_model


def test_scales_with_unit_norm_targets():
    """theta* blocks of norm 1 are ordinary (only an all-zero block has no scale)."""
    from icrl_interp.analyzers import weights
    from icrl_interp.core.errors import UserError

    Xs, Ys = np.array([1.0, 0.0]), np.array([0.0, 1.0])  # ||X*||^2 = ||Y*||^2 = 1
    assert weights.best_scale(2 * Xs, Xs, Ys / 2, Ys) == pytest.approx(2.0, rel=1e-12)
    assert weights.best_scale(-3 * Xs, Xs, -Ys / 3, Ys) == pytest.approx(-3.0, rel=1e-12)
    assert weights.ls_scale(np.array([2.0, 1.0]), Xs) == 2.0
    with pytest.raises(UserError, match="all-zero block"):
        weights.best_scale(Xs, Xs, Ys, 0 * Ys)
    with pytest.raises(UserError, match="all zero"):
        weights.ls_scale(Xs, 0 * Xs)
