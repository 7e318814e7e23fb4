"""Options are honoured as documented, not dropped (issue 23, section 5); the refusals of options a command
would ignore are rows of test_bad_inputs.py.

* `construct actor-critic` without `--critic-step` holds the critic step beta = --alpha (docs/concepts.md);
* a verdict on a recording with its model edits the model where the recording's [roles] point, and a
  model it cannot edit is an error rather than a verdict silently without causation;
* the model-level verdict never nulls `best` while its text names one;
* a report that fails after creating --out removes it again, unless its cache holds analyses.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from icrl_interp import cli
from icrl_interp.families import registry
from icrl_interp.verdicts import behaviour as V
from icrl_interp.core.errors import UserError

TESTS = Path(__file__).resolve().parents[1]
ROLES = '[roles]\nresid_post = "blocks.{layer}"\npattern = "blocks.{layer}.attn#1"\nreadout = ["ln_f", "head"]\n'


# ------------------------------------------------------------------ construct actor-critic: beta defaults to alpha
@pytest.mark.parametrize("extra, beta", [([], 3.0), (["--critic-step", "0.5"], 0.5)])
def test_actor_critic_critic_step_defaults_to_alpha(tmp_path, extra, beta):
    from safetensors.numpy import load_file

    out = tmp_path / "ac"
    argv = ["construct", "actor-critic", "--out", str(out), "--n-states", "2", "--n-actions", "2", "--n", "6",
            "--alpha", "3", *extra]
    assert cli.main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["alpha"] == 3.0 and config["origin"]["critic_step"] == beta  # exact: the flag's value
    assert "beta" not in config["origin"]
    V_ = load_file(str(out / "model.safetensors"))["blocks.0.attn.V"]
    lay = registry.get("actor-critic").layout(4, 4)
    np.testing.assert_array_equal(V_[lay.slice("w"), lay.slice("phi")], beta * np.eye(4))  # critic: beta I, exact
    np.testing.assert_array_equal(V_[lay.slice("lam"), lay.slice("score")], 3.0 * np.eye(4))  # actor: alpha I


def test_construct_options_say_the_critic_step_default():
    opts = registry.get("actor-critic").construct(alpha=7.0)
    assert opts.constants()["critic_step"] == 7.0
    assert registry.get("actor-critic").construct(alpha=7.0, critic_step=0.25).constants()["critic_step"] == 0.25


# ------------------------------------------------------------------ the verdict with a recording and its model
@pytest.fixture(scope="module")
def net_recording(tmp_path_factory):
    """tests/helpers.py's Net (no TransformerLens hooks) recorded through a [roles] spec, and the model."""
    import torch

    from helpers import Net

    t = tmp_path_factory.mktemp("net")
    (t / "roles.toml").write_text(ROLES)
    torch.manual_seed(0)
    model = Net()
    from icrl_interp import record

    record(model, "linear-td", t / "net.h5", task_options={"d": 4, "n": 6, "n_layers": 2}, probe=t / "roles.toml",
           tasks=24, batch_size=12, progress=False, baseline="none")
    return t / "net.h5", model


def test_verdict_with_the_model_edits_it_where_the_recording_roles_point(net_recording):
    import icrl_interp

    path, model = net_recording
    v = icrl_interp.verdict(path, model=model, bootstrap=10, causal_draws=2, causal_tasks=4, progress=False)
    assert [layer["causation"]["available"] for layer in v["layers"]] == [True, True]
    assert [layer["causation"]["module"] for layer in v["layers"]] == ["blocks.0", "blocks.1"]
    alone = icrl_interp.verdict(path, bootstrap=10, progress=False)  # same behaviour evidence, no causation
    behaviour = lambda w: [{k: x for k, x in layer["verdict"].items() if k != "causation_top"}  # noqa: E731
                           for layer in w["layers"]]
    assert behaviour(alone) == behaviour(v)
    assert not any(layer["causation"]["available"] for layer in alone["layers"])
    assert all("causation_top" in layer["verdict"] for layer in v["layers"])


def test_verdict_refuses_a_model_it_cannot_edit(net_recording):
    import icrl_interp
    from torch import nn

    path, _ = net_recording
    with pytest.raises(UserError, match="cannot edit the model for the causal evidence.*--no-causal"):
        icrl_interp.verdict(path, model=nn.Sequential(nn.Linear(9, 1)), bootstrap=10, progress=False)
    v = icrl_interp.verdict(path, model=nn.Sequential(nn.Linear(9, 1)), causal=False, bootstrap=10, progress=False)
    assert v["schema"] == V.SCHEMA


# ------------------------------------------------------------------ the headline names no best it nulls
@pytest.mark.parametrize("r2, fits", [([0.2, 0.1], False), ([0.9, 0.3], True)])
def test_decision_text_names_a_best_only_when_one_fits(r2, fits):
    r2 = np.array(r2)
    boot = r2 + np.linspace(-0.01, 0.01, 50)[:, None]  # tight intervals around the point values
    d = V.decide(["td0", "lstd"], r2, boot, 0.0, np.zeros(50), min_r2=0.5)
    assert d["fits"] is fits and d["best"] == "td0"  # the ranking's top, whatever the decision
    if fits:
        assert d["text"].startswith("td0")
    else:
        assert d["text"].startswith("none fits") and "best" not in d["text"] and "(td0)" in d["text"]


# ------------------------------------------------------------------ report: no --out left by a failure
@pytest.mark.parametrize("cached", [False, True])
def test_a_report_that_fails_after_creating_out_removes_it_unless_it_holds_analyses(tmp_path, monkeypatch, capsys,
                                                                                    cached):
    from icrl_interp import report

    ck = TESTS.parent / "data" / "checkpoints" / "sarsa"
    out = tmp_path / "rep"

    def failing(inputs, out_dir, config, engine=None):
        (Path(out_dir) / "cache").mkdir(parents=True)
        if cached:
            (Path(out_dir) / "cache" / "abc.json").write_text("{}")
        raise UserError("the scheduler went away")

    monkeypatch.setattr(report, "build_report", failing)
    assert cli.main(["report", str(ck), "--out", str(out), "--no-progress"]) == 2
    assert "the scheduler went away" in capsys.readouterr().err
    assert out.exists() is cached
    out.mkdir(exist_ok=True)
    (out / "index.html").write_text("an earlier report")  # a directory that existed before is never removed
    assert cli.main(["report", str(ck), "--out", str(out), "--no-progress"]) == 2
    assert (out / "index.html").read_text() == "an earlier report"


def test_a_failed_input_of_a_report_is_named_on_stderr(tmp_path, capsys):
    """A damaged recording found in a scanned folder is a failed row (exit 1, the report written) and one
    line on stderr; the same file named on the command line is refused before anything is written."""
    import shutil

    folder = tmp_path / "in"
    shutil.copytree(TESTS.parent / "data" / "checkpoints" / "sarsa", folder / "ck")
    (folder / "cut.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    out = tmp_path / "rep"
    assert cli.main(["report", str(folder), "--out", str(out), "--workers", "1", "--live-tasks", "0",
                     "--control-mdps", "0", "--no-progress"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("icrl-interp")]
    assert len(err) == 1 and err[0].startswith(f"icrl-interp report: error: {folder / 'cut.h5'}: "), err
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert sorted(r["status"] for r in rows) == ["failed", "ok"]
    assert cli.main(["report", str(folder / "cut.h5"), "--out", str(tmp_path / "rep2"), "--no-progress"]) == 2
    assert not (tmp_path / "rep2").exists()
