"""In-context control inside the report: θ* sarsa checkpoints get a closed-loop evaluation in their
analysis (transformer == teacher exactly), a `<family>-control` figure, `control.*` summary columns
(no curves) and a table in the page; it is cached with the analysis under its settings, disabled by
--control-mdps 0, never run on recordings, and its failures never fail the analysis."""
from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import report_fake as F
import torch

from icrl_interp.models import checkpoint
from icrl_interp.cli import main
from icrl_interp.models import theta_star_model
from icrl_interp.report import ReportConfig, batch, build_report, control_eval, figures
from icrl_interp.report.headline import text_table

FAKE = "report_fake:analyze"
TASK = {"kind": "mdp", "n": 16, "n_states": 3, "n_actions": 2}


@pytest.fixture(scope="module")
def theta(tmp_path_factory):
    """θ* sarsa with 3 states and 2 actions, written by `icrl-interp construct`."""
    path = tmp_path_factory.mktemp("control") / "theta"
    assert main(["construct", "sarsa", "--n-states", "3", "--n-actions", "2", "--n", "16", "--out", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def report(theta, tmp_path_factory):
    """A report over θ* with the default control settings (20 MDPs, 200 updates), real analyzer."""
    out = tmp_path_factory.mktemp("control-report") / "out"
    outcome = build_report([theta], out, ReportConfig(workers=1, progress=False))
    return outcome, out, (out / "summary.json").read_bytes()


def _row(out):
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert len(rows) == 1
    return rows[0]


def test_theta_star_report_has_control_columns_with_transformer_equal_to_teacher(report):
    outcome, out, _ = report
    row = _row(out)
    assert (row["status"], row["family"], row["source"]) == ("ok", "sarsa", "theta_star")
    assert row["control.error"] is None and row["control.diverged_mdps"] == 0
    assert (row["control.settings.mdps"], row["control.settings.iterations"], row["control.settings.seed"]) == (20, 200, 0)
    assert (row["control.settings.n_states"], row["control.settings.n_actions"], row["control.settings.n"]) == (3, 2, 16)
    tf, teacher = row["control.returns.transformer.mean"], row["control.returns.teacher.mean"]
    assert tf == pytest.approx(teacher, abs=1e-12)
    assert row["control.returns.transformer.std"] == pytest.approx(row["control.returns.teacher.std"], abs=1e-12)
    assert abs(row["control.transformer_minus_teacher.mean"]) < 1e-12
    # exact: shares of counts (ties between actions are judged with the package's own tolerance)
    assert row["control.tracking.greedy_agreement"] == 1.0 and row["control.tracking.greedy_agreement_min"] == 1.0
    assert row["control.tracking.rel_param_distance_max"] < 1e-12
    # the oracle is the ceiling; SARSA learns: well above the random policy
    assert row["control.returns.oracle.mean"] >= teacher - 1e-12
    assert teacher > row["control.returns.random.mean"] + 0.1
    # scalars only: the curves stay in the analysis (cache, figure)
    assert not [k for k in row if k.startswith("control.curves")]
    table = list(csv.DictReader(io.StringIO((out / "summary.csv").read_text())))
    assert float(table[0]["control.returns.transformer.mean"]) == tf  # exact: a copy (repr reads back exactly)
    assert f"{tf:.3f}/{teacher:.3f}" in text_table(outcome.results)


def test_curves_are_subsampled_and_identical_for_theta_star(report):
    outcome, _, _ = report
    curves = outcome.results[0].analysis["control"]["curves"]
    it = curves["iteration"]
    assert len(it) == 100 and it[0] == 0 and it[-1] == 200 and all(a < b for a, b in zip(it, it[1:]))
    np.testing.assert_allclose(curves["transformer"]["mean"], curves["teacher"]["mean"], atol=1e-12)
    assert len(curves["teacher"]["std"]) == 100
    # the figure draws the teacher once, θ*'s transformer on it, and the two levels
    fig = figures.control_figure("sarsa", outcome.results)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    teacher, tf = lines["analytic teacher"], next(v for k, v in lines.items() if k.startswith("transformer: θ*"))
    np.testing.assert_allclose(tf.get_ydata(), teacher.get_ydata(), atol=1e-12)
    assert lines["oracle (value iteration)"].get_ydata()[0] == pytest.approx(curves["oracle"])
    assert lines["random policy"].get_ydata()[0] == pytest.approx(curves["random"])


def test_page_has_the_control_figure_and_table(report):
    outcome, out, _ = report
    info = next(f for f in outcome.figures if f.key == "sarsa-control")
    assert info.error == "" and info.files == ["figures/sarsa-control.png"]
    assert (out / "figures" / "sarsa-control.png").stat().st_size > 10_000
    html = (out / "index.html").read_text()
    assert 'src="figures/sarsa-control.png"' in html and "In-context control: numbers" in html
    assert "100.00% (min 100.0%)" in html  # θ*'s greedy agreement in the control table
    assert "transformer on top of the teacher" in info.caption or "lies on the teacher" in info.caption


def test_cache_reuse_is_byte_identical_and_settings_are_part_of_the_key(report, theta, tmp_path, no_figures):
    _, out, first = report
    again = build_report([theta], out, ReportConfig(workers=1, progress=False))
    assert again.results[0].cached and (out / "summary.json").read_bytes() == first
    # other control settings: a cache miss, re-run with those settings
    other = build_report([theta], out, ReportConfig(workers=1, progress=False, control_iterations=7, control_mdps=3))
    assert not other.results[0].cached
    row = _row(out)
    assert (row["control.settings.mdps"], row["control.settings.iterations"]) == (3, 7)
    assert len(other.results[0].analysis["control"]["curves"]["iteration"]) == 8
    # a fresh evaluation elsewhere (no cache) reproduces the first summary: the seed is fixed
    fresh = tmp_path / "fresh"
    build_report([theta], fresh, ReportConfig(workers=1, progress=False))
    assert (fresh / "summary.json").read_bytes() == first  # exact: the same computation rerun


def test_control_mdps_zero_disables_and_bad_values_are_refused(theta, tmp_path, capsys):
    out = tmp_path / "off"
    assert main(["report", str(theta), "--out", str(out), "--workers", "1", "--control-mdps", "0"]) == 0
    row = _row(out)
    assert row["status"] == "ok" and not [k for k in row if k.startswith("control")]
    assert not (out / "figures" / "sarsa-control.png").exists()
    assert "In-context control: numbers" not in (out / "index.html").read_text()
    capsys.readouterr()
    assert main(["report", str(theta), "--out", str(out), "--control-mdps", "-1"]) == 2
    assert "control-mdps must be a non-negative integer" in capsys.readouterr().err
    assert main(["report", str(theta), "--out", str(out), "--control-iterations", "0"]) == 2
    assert "control-iterations must be at least 1" in capsys.readouterr().err


def test_failing_control_is_recorded_not_fatal_and_recordings_get_none(tmp_path):
    """A model whose outputs overflow to NaN/Inf, a config control cannot use, and a recording."""
    model = theta_star_model("sarsa", 6, gamma=0.5, alpha=1.0)
    with torch.no_grad():
        model.blocks[0].attn.V.mul_(1e308)
    huge = checkpoint.save(model, {"n": 16, "task": TASK}, tmp_path / "huge")
    (huge / "analysis.json").write_text(json.dumps(F.make_analysis("sarsa", "user", 0.5)))
    fake = F.write_checkpoint(tmp_path / "fake", F.make_analysis("sarsa", "trained", 0.5), {"family": "sarsa"})
    rec = F.write_recording(tmp_path / "rec.h5", F.make_analysis("sarsa", "trained", 0.5), family="sarsa")
    settings = control_eval.ControlSettings(mdps=3, iterations=5)
    results = batch.run_batch(batch.collect_inputs([huge, fake, rec]), tmp_path / "out", analyzer=FAKE,
                              progress=False, control=settings)
    assert [r.status for r in results] == ["ok", "ok", "ok"]
    by_name = {r.input.path.name: r.analysis for r in results}
    diverged = by_name["huge"]["control"]
    assert diverged["diverged_mdps"] == 3 and diverged["error"].startswith("transformer output NaN/Inf in 3 of 3 MDPs")
    assert diverged["returns"]["teacher"]["mean"] is not None  # the rest of the evaluation is kept
    assert by_name["fake"]["control"]["error"] and "returns" not in by_name["fake"]["control"]
    assert "control" not in by_name["rec.h5"]
    assert [r.cached for r in batch.run_batch(batch.collect_inputs([huge, fake, rec]), tmp_path / "out",
                                              analyzer=FAKE, progress=False, control=settings)] == [True] * 3
    lines = text_table(results).splitlines()[1:]
    line = lambda name: next(x.rstrip() for x in lines if name in x.split("  ")[0])  # noqa: E731
    assert line("fake").endswith("  error")  # no numbers
    assert line("huge").endswith(" (NaN)") and line("rec").endswith("—")  # numbers, flagged; no control


def test_subsample_known_answer():
    assert control_eval.subsample(50).tolist() == list(range(50))
    idx = control_eval.subsample(1001)
    assert len(idx) == 100 and idx[0] == 0 and idx[-1] == 1000 and np.all(np.diff(idx) > 0)
    assert control_eval.subsample(101).tolist() == np.unique(np.round(np.linspace(0, 100, 100)).astype(int)).tolist()
    assert control_eval.wants_control("checkpoint", "actor-critic") and not control_eval.wants_control("recording", "sarsa")
    assert not control_eval.wants_control("checkpoint", "linear-td")
