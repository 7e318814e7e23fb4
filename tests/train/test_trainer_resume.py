"""The trainer's run files given the inputs its resume checks exist for (icrl_interp/train/trainer.py):
which directories are runs, which step directories are complete checkpoints, metric lines past the
resumed step, and a step directory whose resume state is missing, corrupt or of another model. Each
refusal is one line and changes nothing.

Mutants caught (tests/mutation.py): `is_run_dir` answering None or accepting a config without its
run_id / family, `list_checkpoints` taking a half-written step or a stray name, `_truncate_metrics`
keeping a line past the step or dropping the step's own (`<=` -> `<`), the resume's checks removed.
"""
from __future__ import annotations

import json

import pytest

from icrl_interp.core.errors import UserError
from icrl_interp.train import config_for, list_checkpoints, train
from icrl_interp.train import trainer

TINY = dict(n_states=2, n_actions=2, n=8, batch=4, eval_tasks=4, steps=4, checkpoint_every=2, log_every=1, lr=0.05)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished sarsa run of 4 steps with checkpoints at 2 and 4."""
    return train(config_for("sarsa", **TINY), tmp_path_factory.mktemp("run") / "r", progress=False,
                 evaluate=False).run_dir


@pytest.mark.parametrize("config, answer", [
    ({"run_id": "abc", "family": "sarsa"}, True),
    ({"run_id": "abc"}, False),
    ({"family": "sarsa"}, False),
    ({"run_id": 7, "family": "sarsa"}, False),
    ({"run_id": "abc", "family": None}, False),
    ([{"run_id": "abc", "family": "sarsa"}], False),
    ("{not json", False),
    (None, False),   # no config.json
])
def test_is_run_dir(tmp_path, config, answer):
    if config is not None:
        (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    assert trainer.is_run_dir(tmp_path) is answer


def test_a_finished_run_is_a_run_dir(run):
    assert trainer.is_run_dir(run) is True and trainer.is_run_dir(run / "checkpoints") is False


def test_only_complete_step_directories_are_checkpoints(run, tmp_path):
    import shutil

    copy = tmp_path / "r"
    shutil.copytree(run, copy)
    assert [s for s, _ in list_checkpoints(copy)] == [2, 4]
    ck = copy / "checkpoints"
    shutil.copytree(ck / "step_000002", ck / "step_000003")
    (ck / "step_000003" / "trainer_state.json").unlink()  # killed before its last file: not complete
    shutil.copytree(ck / "step_000002", ck / "step_00000x")  # not a step number
    (ck / "step_000009").write_text("a file")
    assert list_checkpoints(copy) == [(2, ck / "step_000002"), (4, ck / "step_000004")]
    assert list_checkpoints(tmp_path / "nowhere") == []


def test_metric_lines_past_the_resumed_step_are_dropped_and_its_own_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in (1, 2, 3, 4)]
    path.write_text("\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:]) + "\n")
    trainer._truncate_metrics(path, 3)
    assert path.read_text() == "".join(x + "\n" for x in lines[:3])  # the blank line goes too
    trainer._truncate_metrics(path, 0)
    assert path.read_text() == ""
    trainer._truncate_metrics(tmp_path / "missing.jsonl", 3)  # nothing to do
    assert not (tmp_path / "missing.jsonl").exists()


@pytest.mark.parametrize("bad", ['{"loss": 1.0}', '{"step": "x"}', '{"step": 2', "[2]"])
def test_a_torn_metric_line_is_refused_naming_it(tmp_path, bad):
    path = tmp_path / "metrics.jsonl"
    text = json.dumps({"step": 1}) + "\n" + bad + "\n"
    path.write_text(text)
    with pytest.raises(UserError, match=r"cannot resume: .*metrics.jsonl line 2 is not a metrics line") as info:
        trainer._truncate_metrics(path, 5)
    assert "\n" not in str(info.value) and path.read_text() == text


@pytest.mark.parametrize("damage, words", [
    (lambda d: (d / "trainer_state.json").write_text("{torn"), "trainer_state.json is corrupt"),
    (lambda d: (d / "trainer_state.json").write_text('{"step": 2}'), "trainer_state.json is corrupt"),
    (lambda d: (d / "optimizer.safetensors").write_bytes(b"\0" * 16), "optimizer.safetensors is corrupt"),
    (lambda d: (d / "optimizer.safetensors").unlink(), "optimizer.safetensors is corrupt"),
])
def test_a_damaged_resume_state_is_refused_in_one_line(run, tmp_path, damage, words):
    import shutil

    import torch

    copy = tmp_path / "r"
    shutil.copytree(run, copy)
    step_dir = copy / "checkpoints" / "step_000004"
    damage(step_dir)
    cfg = config_for("sarsa", **TINY)
    model, _ = trainer.build(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    with pytest.raises(UserError, match=rf"cannot resume: .*step_000004/{words} .*delete .*step_000004 to resume from"):
        trainer.load_resume_state(step_dir, model, opt)


def test_the_resume_state_round_trips_exactly(run):
    """What save_checkpoint wrote at step 4 loads back: the step, every parameter and both Adam moments
    (exact: safetensors stores the float bits)."""
    import torch
    from safetensors.torch import load_file

    cfg = config_for("sarsa", **TINY)
    model, _ = trainer.build(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    step_dir = run / "checkpoints" / "step_000004"
    assert trainer.load_resume_state(step_dir, model, opt) == 4
    saved = load_file(str(step_dir / "optimizer.safetensors"))
    state = json.loads((step_dir / "trainer_state.json").read_text())
    for name, p in model.named_parameters():
        if name in state["adam_steps"]:
            assert torch.equal(opt.state[p]["exp_avg"], saved[f"{name}.exp_avg"])
            assert torch.equal(opt.state[p]["exp_avg_sq"], saved[f"{name}.exp_avg_sq"])
            assert float(opt.state[p]["step"]) == state["adam_steps"][name] == 4.0
