"""The calibration of the verdict's parameter intervals by simulation (zoo/calibration.py): the Wilson interval,
the pooling, a known-answer run of noisy teachers, and the `zoo calibrate` command."""
from __future__ import annotations

import json

import pytest

from icrl_interp import cli
from icrl_interp.core.outputs import is_ours
from icrl_interp.zoo import calibration as K
from icrl_interp.zoo.run import one_thread

TEACHER = K.TEACHERS[0]  # td0, alpha 0.5, gamma' 0.9, 2 steps: every parameter's truth differs from the others'


def test_wilson_interval_matches_its_textbook_values():
    # 0/10 and 10/10: [0, 0.2775] and [0.7225, 1] (Wilson 1927; Agresti & Coull 1998, table 1)
    assert K.wilson(0, 10) == pytest.approx([0.0, 0.27753], abs=1e-5)
    assert K.wilson(10, 10) == pytest.approx([0.72247, 1.0], abs=1e-5)
    lo, hi = K.wilson(95, 100)
    assert lo < 0.95 < hi and hi - 0.95 < 0.95 - lo  # skewed toward the middle, unlike the Wald interval
    assert K.wilson(0, 0) is None


def test_cells_and_pooling_count_each_parameter_and_noise_apart():
    def row(a, g, wrong_a=False):
        return {"params": {"alpha": {"ci": [0.4, 0.6]}, "gamma": {"ci": [0.8, 1.0]}},
                "inside": {"alpha": a, "gamma": g}, "wrong_inside": {"alpha": wrong_a, "gamma": False}}

    c1 = K.cell([row(True, True), row(True, False), row(False, True, True), row(True, True)])
    assert (c1["alpha"]["covered"], c1["gamma"]["covered"], c1["alpha"]["replicates"]) == (3, 3, 4)
    assert c1["alpha"]["wrong_value_covered"] == 0.25 and c1["gamma"]["wrong_value_covered"] == 0.0
    assert c1["alpha"]["median_width"] == pytest.approx(0.2, abs=1e-12)
    assert c1["alpha"]["coverage_ci"] == K.wilson(3, 4)
    c2 = K.cell([row(True, True)] * 2)
    s = K.summarize([{"noise": 0.1, "parameters": c1}, {"noise": 0.3, "parameters": c2}])
    assert (s["overall"]["covered"], s["overall"]["checked"]) == (10, 12)
    assert (s["by_noise"]["0.1"]["covered"], s["by_noise"]["0.1"]["checked"]) == (6, 8)
    assert (s["by_noise"]["0.3"]["covered"], s["by_noise"]["0.3"]["checked"]) == (4, 4)
    assert (s["by_parameter"]["alpha"]["covered"], s["by_parameter"]["alpha"]["checked"]) == (5, 6)
    assert s["by_noise"]["0.3"]["in_target"] is False  # 100 % is above the 90-99 % band
    assert (s["by_noise_and_parameter"]["0.1"]["gamma"]["covered"], s["by_noise_and_parameter"]["0.1"]["gamma"]
            ["checked"]) == (3, 4)


def test_noisy_teacher_intervals_cover_its_truth_and_not_a_wrong_value():
    """Known answer: at noise 0.3 (the fit is uncertain: alpha's point lands anywhere in ~[0.14, 0.51]) each
    interval covers the truth in nearly every replicate; a zero-width interval would miss alpha most times, a
    truth read off the wrong parameter (alpha 0.5 against the step's [2, 8], gamma' 0.9 against alpha's) misses,
    and an interval that holds everything would hold the wrong alpha 1.0 too."""
    with one_thread():
        reps = [K.replicate(TEACHER, 0.3, seed, tasks=160, fit_resamples=100, max_step=8, test_fraction=0.3)
                for seed in range(6)]
    for name in ("alpha", "gamma", "step"):
        assert sum(r["inside"][name] for r in reps) >= 4, name  # seeds 0..5: 4, 6, 5 of 6 (2 misses: alpha-k trade)
    assert sum(r["wrong_inside"]["alpha"] for r in reps) <= 1
    alpha = [r["params"]["alpha"]["value"] for r in reps]
    assert max(alpha) - min(alpha) > 0.05  # the noise makes the fit uncertain (else the check shows nothing)
    widths = sorted(r["params"]["alpha"]["ci"][1] - r["params"]["alpha"]["ci"][0] for r in reps)
    assert widths[3] > 0.15  # the intervals carry the uncertainty (a point interval is 2 % wide: RESOLUTION)
    truth = K.truth_of(TEACHER)
    for r in reps:  # "inside" is the reported interval against the truth of the same parameter
        for name, ok in r["inside"].items():
            lo, hi = r["params"][name]["ci"]
            assert ok == (lo - 1e-9 <= truth[name] <= hi + 1e-9), name


def test_zoo_calibrate_writes_json_and_figure_and_refuses_bad_options(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(K, "NOISES", (0.3,))  # one cell: the command's plumbing, not the numbers
    monkeypatch.setattr(K, "TEACHERS", K.TEACHERS[:1])
    out = tmp_path / "cal"
    assert cli.main(["zoo", "calibrate", "--out", str(out), "--replicates", "1", "--tasks", "30", "--no-progress"]) == 0
    cal = json.loads((out / "calibration.json").read_text())
    assert cal["schema"] == K.SCHEMA and cal["settings"]["replicates"] == 1 and cal["settings"]["tasks"] == 30
    assert [(c["teacher"], c["noise"]) for c in cal["cells"]] == [(TEACHER, 0.3)]
    assert {"alpha", "gamma", "step"} <= set(cal["cells"][0]["parameters"])
    assert is_ours(out / "calibration.png")
    assert not list(out.glob("*.tmp"))
    assert "intervals cover the truth" in capsys.readouterr().out
    bad = tmp_path / "bad"
    assert cli.main(["zoo", "calibrate", "--out", str(bad), "--replicates", "0"]) == 2
    assert not bad.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--replicates must be >= 1" in err[0]


@pytest.mark.slow
def test_coverage_is_near_nominal_over_many_replicates():
    """40 replicates per cell: every parameter's pooled coverage lies in [0.85, 1], and at the lower noise the
    wrong alpha (twice the truth) is rarely held; at noise 0.3 the alpha intervals are wide enough to hold it
    often (docs/zoo.md, "Calibration", has the 200-replicate numbers)."""
    cal = K.calibrate(replicates=40)
    for name, p in cal["summary"]["by_parameter"].items():
        assert p["coverage"] >= 0.85, (name, p)
    for c in cal["cells"]:
        if c["noise"] == min(K.NOISES):
            assert c["parameters"]["alpha"]["wrong_value_covered"] <= 0.1, c["teacher"]
