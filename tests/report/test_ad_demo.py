"""The shipped AD model in the demo (`report.ad_demo`): its return curves are the numbers of its config.json, and its
behavioural verdict is fitted on its own closed-loop episodes of the held-out goals and written as an episode verdict."""
from __future__ import annotations

import json

import pytest

from icrl_interp.core.resources import ad_dir
from icrl_interp.models.ad_transformer import read_config
from icrl_interp.report import ad_demo, demo


def test_the_curves_are_the_shipped_numbers():
    config = read_config(ad_dir())
    lines = ad_demo.curve_lines(config)
    e = config["evaluation"]
    assert "8 held-out" in lines[0] and lines[1].split()[2:14] == [f"{x:.2f}" for x in e["model"]["curve"]]
    assert lines[2].split()[2:14] == [f"{x:.2f}" for x in e["source"]["curve"]]
    lo, hi = e["model"]["ci95"]
    assert lines[1].endswith(f"{e['model']['difference']:+.2f} [{lo:.2f}, {hi:.2f}])")  # the interval is shown


def test_quick_prints_the_curves_and_skips_the_verdict(tmp_path, capsys):
    assert demo.shipped_ad_verdict(tmp_path / "v.json", demo.DemoConfig(quick=True)) == []
    out = capsys.readouterr().out
    assert "Q-learning source" in out and "skipped with --quick" in out and not (tmp_path / "v.json").exists()


@pytest.mark.slow  # ~10 s: 8 closed-loop histories of 120 steps and the six rules' fit
def test_the_verdict_is_fitted_on_the_models_own_closed_loop_actions(tmp_path):
    pytest.importorskip("gymnasium")
    doc = ad_demo.closed_loop_verdict(tmp_path / "v.json", histories_per_goal=1, seed=0)
    assert json.loads((tmp_path / "v.json").read_text()) == json.loads(json.dumps(doc))
    assert doc["schema"] == "icrl_interp.episode_verdict/2" and doc["fitted_to"] == "actions"
    assert doc["histories"]["train"] + doc["histories"]["held_out"] == 8 and doc["steps"]["train"] % 120 == 0
