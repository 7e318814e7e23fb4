"""An episode verdict (`icrl_interp.episode_verdict/1`, `verdict --episodes --json`) among the report's inputs: routed as a
verdict, its answer (label, the best rule's fitted parameters with intervals, margin, clear) in the leading answers
section, its own table in the verdicts section, and no figure (it has no layers)."""
from __future__ import annotations

import json
from pathlib import Path

from icrl_interp.analyzers import inputs
from icrl_interp.report import answers
from icrl_interp.report.batch import ReportInput, Result, read_verdict, verdict_status
from icrl_interp.report.verdict import html_table

DOC = {
    "schema": "icrl_interp.episode_verdict/1", "source": "ad-closed.h5", "fitted_to": "actions",
    "candidates": {
        "q_learning": {"params": {"alpha": {"value": 0.43, "ci": [0.15, 0.97]}, "gamma": {"value": 0.86, "ci": [0.2, 1.0]},
                                  "beta": {"value": 2.0, "ci": [0.77, 11.0]}},
                       "held_out_loglik": -1.332, "held_out_loglik_ci": [-1.52, -1.09]},
        "sarsa": {"params": {"alpha": {"value": 0.49, "ci": [0.09, 1.0]}}, "held_out_loglik": -1.357,
                  "held_out_loglik_ci": [-1.6, -1.1]},
    },
    "baselines": {"uniform": {"held_out_loglik": -1.609, "held_out_loglik_ci": [-1.609, -1.609]}},
    "verdict": {"best": "q_learning", "label": "q_learning", "runner_up": "sarsa", "margin": 0.021,
                "margin_ci": [-0.029, 0.056], "margin_ci_adjusted": [-0.054, 0.066], "fits": True, "clear": False,
                "text": "q_learning, not clear: it does not beat runner_up"},
}


def test_an_episode_verdict_file_is_read_as_a_verdict(tmp_path):
    path = tmp_path / "ad_verdict.json"
    path.write_text(json.dumps(DOC))
    assert inputs.is_verdict_json(path)
    doc = read_verdict(path)
    assert doc["verdict"]["label"] == "q_learning" and verdict_status(doc) == ("ok", "")


def test_its_answer_row_has_the_label_the_best_rules_parameters_with_intervals_and_the_margin():
    r = Result(ReportInput(Path("/x/ad_verdict.json"), "verdict"), "ok", verdict=DOC)
    (row,) = answers.answers([r])
    assert row["model"] == "ad" and row["task"] == "episodes" and row["verdict"] == "q_learning"
    assert row["params"] == "alpha 0.43 [0.15, 0.97], gamma 0.86 [0.2, 1], beta 2 [0.77, 11]"  # the best rule's, not sarsa's
    assert row["margin"] == "0.021 [-0.054, 0.066] adjusted over sarsa" and row["clear"] == "no"
    assert "alpha 0.43 [0.15, 0.97]" in answers.text([r])


def test_its_table_lists_every_rule_and_baseline_with_intervals():
    table = html_table(DOC)
    assert "q_learning</td><td>-1.332 [-1.520, -1.090]" in table and "gamma 0.860 [0.200, 1.000]" in table
    assert "uniform (baseline)</td><td>-1.609 [-1.609, -1.609]" in table and "not clear" in table
