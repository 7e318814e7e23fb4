"""`python -m icrl_interp.train.trends RUN_DIR --png X`: every checkpoint evaluated and plotted, with
the series, scale and reference lines of the run's own family (its recipe's `trends`)."""
import json

import pytest

from icrl_interp.train import config_for, train
from icrl_interp.train import trends

TINY = {
    "linear-td": dict(d=2, n_states=4, n=6, n_layers=2, windows=3, trajectories_per_task=1, tasks_per_step=2),
    "softmax-td": dict(n_states=3, n=8, n_layers=2, batch=4),
    "sarsa": dict(n_states=2, n_actions=2, n=8, batch=4),
    "actor-critic": dict(n_states=2, n_actions=2, n=8, batch=4),
}


@pytest.mark.parametrize("family", list(TINY))
def test_trends_plots_every_checkpoint_with_the_family_series(tmp_path, family):
    """actor-critic used to get SARSA's series and fail with KeyError: 'mod_null'."""
    cfg = config_for(family, **TINY[family], steps=4, checkpoint_every=2, log_every=1, eval_tasks=4, lr=0.05)
    run = train(cfg, tmp_path / "run", progress=False, evaluate=False)
    png, out = tmp_path / "fig" / "trend.png", tmp_path / "rows.json"
    assert trends.main([str(run.run_dir), "--png", str(png), "--json", str(out), "--eval-tasks", "4"]) == 0
    assert png.is_file() and png.stat().st_size > 0 and not (tmp_path / "fig" / "trend.tmp.png").exists()
    rows = json.loads(out.read_text())
    assert [r["step"] for r in rows] == [2, 4]
