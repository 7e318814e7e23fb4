"""`icrl-interp construct` writes theta* checkpoints that load into exactly theta_star_model's
parameters; `icrl-interp inspect` prints config and shapes; mistakes are one-line errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from icrl_interp import checkpoint, cli
from icrl_interp.models import theta_star_model


def _cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv,family,kw", [
    ([], "linear-td", dict(d=4, n_layers=3, gamma=0.9)),
    (["--untied", "--layers", "2", "--alpha", "0.4", "--scale", "-2"], "linear-td", dict(d=4, n_layers=2, gamma=0.9, alpha=0.4, c=-2.0, tied=False)),
    ([], "softmax-td", dict(d=5, n_layers=6, gamma=0.9)),
    (["--form", "dual", "--score-scale", "4", "--states", "3", "--gamma", "0.8"], "softmax-td", dict(d=3, n_layers=6, gamma=0.8, form="dual", score_scale=4.0)),
    ([], "sarsa", dict(d=36, n_layers=1, gamma=0.5)),
    (["--states", "2", "--actions", "3", "--scale", "0.5", "--alpha", "2"], "sarsa", dict(d=6, n_layers=1, gamma=0.5, c=0.5, alpha=2.0)),
])
def test_construct_writes_theta_star(argv, family, kw, tmp_path, capsys):
    out = tmp_path / "ck"
    rc, stdout, _ = _cli(capsys, "construct", family, "--out", str(out), *argv)
    assert rc == 0 and str(out) in stdout
    config, tensors = checkpoint.read(out)
    expected = theta_star_model(family, **kw).arrays()
    assert sorted(tensors) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(tensors[name], expected[name])
    assert config["origin"]["kind"] == "theta_star" and config["family"] == family
    task = config["task"]
    assert task["kind"] == ("mdp" if family == "sarsa" else "boyan") and task["n"] == config["n"]
    sampling = pytest.importorskip("icrl_interp.sampling")
    sampling.TaskSpec.from_dict(task, family)  # the sampler accepts the recorded task


def test_inspect_prints_config_and_parameters(tmp_path, capsys):
    out = tmp_path / "ck"
    assert _cli(capsys, "construct", "softmax-td", "--out", str(out), "--untied", "--layers", "2", "--form", "dual")[0] == 0
    rc, text, _ = _cli(capsys, "inspect", str(out))
    assert rc == 0
    for word in ("softmax-td", "dual", checkpoint.sha256(out), "current_mem [7, 8)", "blocks.1.attn.V_target", "8x8"):
        assert word in text
    rc, text, _ = _cli(capsys, "inspect", str(out), "--json")
    data = json.loads(text)
    assert data["parameters"]["blocks.0.attn.A"]["shape"] == [8, 8] and data["parameters"]["blocks.0.attn.A"]["nonzeros"] == 5
    assert data["config"]["form"] == "dual" and data["sha256"] == checkpoint.sha256(out)


@pytest.mark.parametrize("argv,words", [
    (["construct", "softmax-td", "--d", "4"], ["one-hot", "d = number of states (5)"]),
    (["construct", "sarsa", "--d", "7"], ["states*actions = 36"]),
    (["construct", "linear-td", "--layers", "0"], ["n_layers"]),
    (["construct", "linear-td", "--gamma", "1.2"], ["gamma"]),
    (["construct", "softmax-td", "--scale", "2"], ["c does not apply"]),
])
def test_construct_errors_are_one_line(argv, words, tmp_path, capsys):
    rc, out, err = _cli(capsys, *argv, "--out", str(tmp_path / "ck"))
    assert rc == 2 and err.count("\n") == 1 and all(w in err for w in words), err
    assert not (tmp_path / "ck").exists()


def test_existing_directory_needs_force(tmp_path, capsys):
    out = str(tmp_path / "ck")
    assert _cli(capsys, "construct", "linear-td", "--out", out)[0] == 0
    first = checkpoint.sha256(out)
    rc, _, err = _cli(capsys, "construct", "linear-td", "--out", out, "--alpha", "0.5")
    assert rc == 2 and "--force" in err and checkpoint.sha256(out) == first
    assert _cli(capsys, "construct", "linear-td", "--out", out, "--alpha", "0.5", "--force")[0] == 0
    assert checkpoint.read(out)[0]["alpha"] == 0.5


def test_inspect_refuses_non_checkpoints(tmp_path, capsys):
    (tmp_path / "weights.pt").write_bytes(b"\x80\x04\x95\x00")
    rc, _, err = _cli(capsys, "inspect", str(tmp_path / "weights.pt"))
    assert rc == 2 and "pickle" in err and err.count("\n") == 1
    rc, _, err = _cli(capsys, "inspect", str(tmp_path))
    assert rc == 2 and "weights.pt" in err
    with pytest.raises(SystemExit):
        cli.main(["construct", "gpt2", "--out", str(tmp_path / "x")])
