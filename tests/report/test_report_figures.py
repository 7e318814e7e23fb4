"""Report figures: what gets drawn from which fields, the θ* reference values, and robustness."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import report_fake as F
from matplotlib.image import imread

from icrl_interp.tasks import layouts
from icrl_interp.report import batch, figures, headline
from icrl_interp.report.fields import kernel_mins, label_of
from icrl_interp.families import softmax_td

FAKE = "report_fake:analyze"


def analyzed(paths, out):
    return batch.run_batch(batch.collect_inputs(paths), out, analyzer=FAKE, progress=False)


@pytest.fixture
def drawn(built):
    return built.results, built.figures, built.out_dir


def test_expected_figures_and_files(drawn):
    results, infos, out = drawn
    keys = {i.key.rsplit("-", 1)[0] if "attention" in i.key else i.key for i in infos}
    assert keys == {
        "sarsa-training", "sarsa-block-norms", "sarsa-value-error-depth", "sarsa-td-probe",
        "softmax-td-block-norms", "softmax-td-value-error-depth", "softmax-td-value-error-context",
        "softmax-td-td-probe", "softmax-td-attention-000", "softmax-td-attention-001",
    }
    assert not any(i.error for i in infos)
    for info in infos:
        assert info.files == [f"figures/{info.key}.png"] and info.title and info.caption
        img = imread(out / info.files[0])
        assert img.shape[0] > 200 and img.shape[1] > 300 and img[..., :3].std() > 0.02


def test_svg_and_stale_figures_removed(drawn, tmp_path):
    results, _, _ = drawn
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "old-figure.png").write_bytes(b"stale")
    theta = [r for r in results if r.input.path.name == "theta"]
    infos = figures.make_figures(theta, tmp_path, svg=True)
    assert {i.key for i in infos} == {"sarsa-value-error-depth", "sarsa-td-probe", "sarsa-block-norms"}
    assert not (tmp_path / "figures" / "old-figure.png").exists()
    assert all(len(i.files) == 2 and i.files[1].endswith(".svg") for i in infos)
    assert (tmp_path / infos[0].files[1]).read_text().lstrip().startswith("<?xml")


def test_series_group_seeds_by_run_and_step(drawn):
    results, _, _ = drawn
    series = figures._series([r for r in results if r.family == "sarsa"])
    assert list(series) == ["checkpoints"]
    runs = series["checkpoints"]
    assert sorted(runs) == ["s0", "s1"] and all(sorted(steps) == [10, 20, 30] for steps in runs.values())


def test_band_is_mean_and_std_across_seeds(drawn):
    results, _, _ = drawn
    runs = figures._series([r for r in results if r.family == "sarsa"])["checkpoints"]
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    value = lambda r: r.analysis["weights"]["manifold"]["gauge_cosine"]  # noqa: E731
    assert figures._band(ax, runs, value, "tab:blue", "x", log=False)
    mean_line = [l for l in ax.get_lines() if l.get_label().startswith("x (mean of 2 seeds)")][0]
    steps, means = mean_line.get_data()
    expect = [np.mean([value(runs[s][k]) for s in runs]) for k in (10, 20, 30)]
    np.testing.assert_allclose(means, expect, rtol=0, atol=1e-15)
    band = ax.collections[0].get_paths()[0].vertices
    spread = np.std([value(runs[s][30]) for s in runs])
    assert spread > 0 and np.isclose(band[:, 1].max(), expect[-1] + spread, atol=1e-12)


def test_theta_star_block_norms_rebuilt_from_the_recording(tmp_path):
    d = 4
    lay = softmax_td.layout(d)
    analysis = F.make_analysis("softmax-td", "trained", 0.5)
    learned = {r: {c: 0.5 for c in lay.names} for r in lay.names}
    analysis["weights"]["block_sparsity"]["block_norms"] = {"blocks.0.attn.A": learned}
    rec = F.write_recording(tmp_path / "r.h5", analysis, n_states=d)
    (r,) = analyzed([rec], tmp_path / "out")
    ref = figures._theta_block_norms(r, [])
    rows, cols, mat = ref["blocks.0.attn.A"]
    assert rows == cols == lay.names
    expect = np.zeros((4, 4))
    expect[0, 0] = math.sqrt(d)  # A* = diag(I_d, 0, 0, 0)
    np.testing.assert_allclose(mat, expect, atol=1e-15)


def test_block_matrix_forms():  # exact: block_matrix copies the numbers it is given
    rows, cols, m = figures.block_matrix({"a": {"x": 1.0, "y": 2.0}, "b": {"x": 3.0}})
    assert (rows, cols) == (["a", "b"], ["x", "y"])
    np.testing.assert_array_equal(m, [[1.0, 2.0], [3.0, np.nan]])
    rows, cols, m = figures.block_matrix({"rows": ["r"], "cols": ["c", "d"], "norms": [[4, 5]]})
    assert (rows, cols, m.tolist()) == (["r"], ["c", "d"], [[4.0, 5.0]])
    assert figures.block_matrix([[1, 2], [3, 4]])[2].tolist() == [[1, 2], [3, 4]]
    for bad in ("x", 3, {"rows": ["r"], "cols": ["c"], "norms": [[1, 2]]}, [], {"a": 1}):
        assert figures.block_matrix(bad) is None


def test_kernel_fields_and_headline_known_answers(drawn):
    results, _, _ = drawn
    rec = next(r for r in results if r.input.path.name == "rec8.h5")
    mins = kernel_mins(rec)
    q = 0.6
    assert sorted(mins) == [0, 1, 2]
    assert mins[2][0] == pytest.approx(0.5 + 0.49 * q - 0.02) and mins[2][1] == pytest.approx(0.95)
    h = headline.headline(rec)
    assert h["kernel_min"] == pytest.approx(0.5 + 0.49 * q - 0.02)  # worst layer
    assert h["kernel_margin"] == pytest.approx(0.5 + 0.49 * q - 0.02 - 0.95)
    assert h["td_probe_r2"] == pytest.approx(0.2 + 0.79 * q)
    assert h["value_error"] == pytest.approx(0.9 * (1.05 - q) * 0.36)  # last layer
    assert h["manifold_rel_err"] == pytest.approx(1 - q) and h["sign_pattern"] == "+,+,-"
    theta = next(r for r in results if r.input.path.name == "theta")
    assert label_of(theta) == "θ* (theta)" and headline.headline(theta)["source"] == "theta_star"
    # a checkpoint without activations falls back to the population kernel
    pop = copy.deepcopy(theta)
    pop.analysis["activations"] = None
    pop.analysis["weights"]["population_kernel"] = [{"layer": 0, "min": 0.97, "margin": 0.02, "threshold": 0.95}]
    assert kernel_mins(pop) == {0: (0.97, 0.95)}  # exact: copies


def test_missing_and_malformed_fields_never_crash(drawn, tmp_path):
    results, full, _ = drawn
    odd = []
    for i, r in enumerate(r for r in results if r.status == "ok"):
        r = copy.deepcopy(r)
        if i % 3 == 0:
            r.analysis["activations"] = None
            r.analysis["weights"] = None
        elif i % 3 == 1:
            r.analysis["weights"]["block_sparsity"]["block_norms"] = "garbage"
            r.analysis["weights"]["manifold"] = {"rel_err": "x", "gauge_cosine": "y"}
            r.analysis["activations"]["layers"] = ["x", {"layer": "a"}, {"layer": 1, "kernel_diagonality": 5,
                                                                     "td_probe_r2": None, "value_error": -1.0}]
        else:
            r.analysis = {"schema": batch.ANALYSIS_SCHEMA}
        odd.append(r)
    infos = figures.make_figures(odd, tmp_path)
    assert not any(i.error for i in infos)
    assert {i.key for i in infos} <= {i.key for i in full}
    for r in odd:
        headline.formatted(r)  # the table copes as well


def test_training_view_follows_wang_metrics_from_live_or_recorded_activations():
    """The metrics-over-training panels read Wang's SS / VD where analyze puts them (activations.wang_metrics),
    so a linear-td run's snapshots, analyzed live, show the emergence; absent metrics give no point."""
    from types import SimpleNamespace

    specs = {spec[0]: spec for spec in figures.TREND_METRICS}
    ss = next(v for k, v in specs.items() if "SS" in k)
    vd = next(v for k, v in specs.items() if "VD" in k)
    r = SimpleNamespace(analysis={"activations": {"wang_metrics": {"SS": 0.93, "VD": 0.012, "IWS": 0.5}}})
    assert ss[2](r) == 0.93 and ss[3] == 1.0 and not ss[4]  # exact: copies
    assert vd[2](r) == 0.012 and vd[4]  # log scale: VD falls over orders of magnitude
    assert ss[2](SimpleNamespace(analysis={"activations": None})) is None
