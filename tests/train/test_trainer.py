"""The trainer: run directory contents, determinism, resume after a stop, masks and lazy blocks."""
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from icrl_interp import checkpoint
from icrl_interp.errors import UserError
from icrl_interp.train import config_for, list_checkpoints, load_run_config, train
from icrl_interp.train.init import lazy_slice, softmax_masks

TINY = {
    "linear-td": dict(d=2, n_states=4, n=6, n_layers=2, windows=4, trajectories_per_task=1, tasks_per_step=2, eval_tasks=4),
    "softmax-td": dict(n_states=3, n=8, n_layers=2, batch=4, eval_tasks=4),
    "sarsa": dict(n_states=2, n_actions=2, n=8, batch=4, eval_tasks=4),
}


def _cfg(family, **kw):
    return config_for(family, **{**TINY[family], "steps": 6, "checkpoint_every": 2, "log_every": 1, "lr": 0.05, **kw})


def _params(step_dir):
    return load_file(str(step_dir / "model.safetensors"))


@pytest.mark.parametrize("family", ["linear-td", "softmax-td", "sarsa"])
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
    assert checkpoint.load(a.run_dir / "checkpoints/step_000006").config.family == family
    for s in steps:  # same seed -> identical checkpoints (bytes of every tensor)
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
    assert all(np.array_equal(pf[k], pr[k]) for k in pf)
    losses = lambda r: [json.loads(x)["loss"] for x in (r / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert losses(part.run_dir) == losses(full.run_dir)  # no duplicated or missing lines after the resume


def test_resume_refuses_a_different_config(tmp_path):
    train(_cfg("sarsa", steps=2), tmp_path, progress=False, evaluate=False)
    with pytest.raises(UserError, match="different config.*lr"):
        train(_cfg("sarsa", steps=2, lr=0.01), tmp_path, progress=False)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not a training config"):
        train(_cfg("sarsa", steps=2), tmp_path, progress=False)


def test_softmax_masks_keep_everything_outside_exactly_zero(tmp_path):
    for form in ("tsm", "dual"):
        run = train(_cfg("softmax-td", form=form, masks=True), tmp_path / form, progress=False, evaluate=False)
        masks = softmax_masks(run.model.layout)
        for name, p in run.model.named_parameters():
            mask = masks[name.rsplit(".", 1)[-1]].bool()
            assert torch.all(p.detach()[~mask] == 0.0) and torch.all(p.detach()[mask] != 0.0)
    free = train(_cfg("softmax-td", masks=False), tmp_path / "free", progress=False, evaluate=False)
    A = dict(free.model.named_parameters())["blocks.0.attn.A"].detach()
    assert torch.count_nonzero(A) == A.numel()


def test_sarsa_lazy_blocks_stay_exactly_zero_and_drift_under_the_ablation(tmp_path):
    run = train(_cfg("sarsa", steps=30, checkpoint_every=10), tmp_path / "lazy", progress=False, evaluate=False)
    two = lazy_slice(run.model.layout)
    for _, d in list_checkpoints(run.run_dir):
        p = _params(d)
        assert np.all(p["blocks.0.attn.P"][two, two] == 0.0) and np.all(p["blocks.0.attn.V"][two, two] == 0.0)
    assert all(json.loads(x)["lazy_max_abs"] == 0.0 for x in (run.run_dir / "metrics.jsonl").read_text().splitlines())
    abl = train(_cfg("sarsa", steps=30, checkpoint_every=10, lazy_ablation=True), tmp_path / "abl", progress=False, evaluate=False)
    first, last = (_params(d) for _, d in (list_checkpoints(abl.run_dir)[0], list_checkpoints(abl.run_dir)[-1]))
    for name in ("blocks.0.attn.P", "blocks.0.attn.V"):
        assert np.abs(last[name][two, two]).max() > 0
    assert not np.array_equal(first["blocks.0.attn.V"][two, two], last["blocks.0.attn.V"][two, two])  # they move


def test_cli_trains_exports_and_reports_errors(tmp_path, capsys):
    from icrl_interp.cli import main

    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"family": "sarsa", **TINY["sarsa"], "checkpoint_every": 2}))
    code = main(["train", "sarsa", "--out", str(tmp_path / "run"), "--config", str(cfg), "--steps", "4", "--no-progress",
                 "--export", str(tmp_path / "ship")])
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "ship").iterdir()) == ["config.json", "final_metrics.json", "model.safetensors", "train_config.json"]
    assert json.loads((tmp_path / "ship/train_config.json").read_text())["steps"] == 4
    assert main(["train", "sarsa", "--out", str(tmp_path / "x"), "--windows", "3"]) == 2
    assert "unknown sarsa training option(s): windows" in capsys.readouterr().err
