"""The trainer: run directory contents, checkpoint fields, determinism, resume after a stop.

Family-specific init (softmax masks, lazy blocks) is tested with each family's recipe in tests/families/."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from icrl_interp.models import checkpoint
from icrl_interp.core.errors import UserError
from icrl_interp.train import config_for, list_checkpoints, load_run_config, train

TINY = {
    "linear-td": dict(d=2, n_states=4, n=6, n_layers=2, windows=4, trajectories_per_task=1, tasks_per_step=2, eval_tasks=4),
    "softmax-td": dict(n_states=3, n=8, n_layers=2, batch=4, eval_tasks=4),
    "sarsa": dict(n_states=2, n_actions=2, n=8, batch=4, eval_tasks=4),
    "actor-critic": dict(n_states=2, n_actions=2, n=8, batch=4, eval_tasks=4),
}


def _cfg(family, **kw):
    return config_for(family, **{**TINY[family], "steps": 6, "checkpoint_every": 2, "log_every": 1, "lr": 0.05, **kw})


def _params(step_dir):
    return load_file(str(step_dir / "model.safetensors"))


@pytest.mark.parametrize("family", list(TINY))
def test_run_directory_and_determinism(tmp_path, family):
    cfg = _cfg(family)
    a = train(cfg, tmp_path / "a", progress=False)
    b = train(cfg, tmp_path / "b", progress=False, evaluate=False)
    steps = [s for s, _ in list_checkpoints(a.run_dir)]
    assert steps == [2, 4, 6]
    lines = [json.loads(x) for x in (a.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, 7)) and all({"loss", "lr", "wall_s"} <= set(x) for x in lines)
    assert load_run_config(a.run_dir) == cfg
    conf = json.loads((a.run_dir / "checkpoints/step_000004/config.json").read_text())
    assert conf["origin"] == {"kind": "trained", "run_id": conf["origin"]["run_id"], "step": 4} and conf["training"]["seed"] == 0
    assert conf["origin"]["run_id"] == json.loads((a.run_dir / "config.json").read_text())["run_id"]
    assert conf["training"] == cfg.to_dict() and conf["seed"] == cfg.seed
    assert conf["task"]["family"] == family and conf["task"]["n"] == cfg.n
    assert checkpoint.load(a.run_dir / "checkpoints/step_000006").config.family == family
    for s in steps:  # same seed -> identical checkpoints (bytes of every tensor): the same computation rerun
        pa, pb = _params(a.run_dir / f"checkpoints/step_{s:06d}"), _params(b.run_dir / f"checkpoints/step_{s:06d}")
        assert all(np.array_equal(pa[k], pb[k]) for k in pa)
    assert json.loads((a.run_dir / "final_metrics.json").read_text())["step"] == 6
    other = train(config_for(family, **{**TINY[family], "steps": 2, "seed": 1, "lr": 0.05}), tmp_path / "c", progress=False, evaluate=False)
    assert not np.array_equal(_params(other.run_dir / "checkpoints/step_000002")[k := sorted(pa)[0]], _params(a.run_dir / "checkpoints/step_000002")[k])


@pytest.mark.parametrize("family", ["linear-td", "sarsa"])
def test_resume_after_stop_equals_uninterrupted(tmp_path, family):
    cfg = _cfg(family, steps=8, checkpoint_every=3)
    full = train(cfg, tmp_path / "full", progress=False, evaluate=False)
    part = train(cfg, tmp_path / "part", progress=False, evaluate=False, stop_after=5)  # checkpoint at 3, killed at 5
    assert [s for s, _ in list_checkpoints(part.run_dir)] == [3]
    resumed = train(cfg, tmp_path / "part", progress=False, evaluate=False)
    assert resumed.resumed_from == 3
    pf, pr = _params(full.run_dir / "checkpoints/step_000008"), _params(part.run_dir / "checkpoints/step_000008")
    assert all(np.array_equal(pf[k], pr[k]) for k in pf)  # exact: the resume continues the same computation
    losses = lambda r: [json.loads(x)["loss"] for x in (r / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert losses(part.run_dir) == losses(full.run_dir)  # no duplicated or missing lines after the resume


def test_resume_refuses_a_different_config(tmp_path):
    train(_cfg("sarsa", steps=2), tmp_path, progress=False, evaluate=False)
    with pytest.raises(UserError, match="different config.*lr"):
        train(_cfg("sarsa", steps=2, lr=0.01), tmp_path, progress=False)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not a training config"):
        train(_cfg("sarsa", steps=2), tmp_path, progress=False)
