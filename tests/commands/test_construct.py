"""`icrl-interp construct FAMILY` writes theta* checkpoints that load into exactly theta_star_model's
parameters, with flags from the family's construct dataclass; mistakes are one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from icrl_interp.models import checkpoint
from icrl_interp import cli
from icrl_interp.models import theta_star_model


def _cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv,family,kw", [
    ([], "linear-td", dict(d=4, n_layers=3, gamma=0.9)),
    (["--no-tied", "--n-layers", "2", "--alpha", "0.4", "--scale", "-2"], "linear-td", dict(d=4, n_layers=2, gamma=0.9, alpha=0.4, c=-2.0, tied=False)),
    ([], "softmax-td", dict(d=5, n_layers=6, gamma=0.9)),
    (["--form", "dual", "--score-scale", "4", "--n-states", "3", "--gamma", "0.8"], "softmax-td", dict(d=3, n_layers=6, gamma=0.8, form="dual", score_scale=4.0)),
    ([], "sarsa", dict(d=36, n_layers=1, gamma=0.5)),
    (["--n-states", "2", "--n-actions", "3", "--scale", "0.5", "--alpha", "2"], "sarsa", dict(d=6, n_layers=1, gamma=0.5, c=0.5, alpha=2.0)),
])
def test_construct_writes_theta_star(argv, family, kw, tmp_path, capsys):
    out = tmp_path / "ck"
    rc, stdout, _ = _cli(capsys, "construct", family, "--out", str(out), *argv)
    assert rc == 0 and str(out) in stdout
    config, tensors = checkpoint.read(out)
    expected = theta_star_model(family, **kw).arrays()
    assert sorted(tensors) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(tensors[name], expected[name])  # exact: theta*, written entry by entry
    assert config.origin["kind"] == "theta_star" and config.family == family == config.task.family
    assert config.task.kind == ("mdp" if family == "sarsa" else "boyan")
    assert config.sample(2, 0).prompt.z.shape[1:] == (config.task.n + 1, config.model.D)  # the task samples




@pytest.mark.parametrize("argv,words", [
    (["construct", "softmax-td", "--d", "4"], ["one-hot", "d = number of states (5)"]),
    (["construct", "sarsa", "--d", "7"], ["states*actions = 36"]),
    (["construct", "linear-td", "--n-layers", "0"], ["n_layers"]),
    (["construct", "linear-td", "--gamma", "1.2"], ["gamma"]),
    (["construct", "softmax-td", "--scale", "2"], ["unrecognized arguments: --scale"]),
    (["construct", "linear-td", "--n-layers", "two"], ["--n-layers", "expected int"]),
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
    assert checkpoint.read(out)[0].model.alpha == 0.5


def test_construct_and_record_import_neither_transformers_nor_transformer_lens(tmp_path):
    """Cold start: the package's own models carry TL's hook API themselves (models/hooks.py), so constructing
    and recording them never pays for importing TransformerLens, which imports `transformers`."""
    code = ("import sys\nfrom icrl_interp import cli\n"
            f"assert cli.main(['construct', 'linear-td', '--out', {str(tmp_path / 'ck')!r}, '--d', '2', '--n-layers', '1']) == 0\n"
            f"assert cli.main(['record', {str(tmp_path / 'ck')!r}, '--out', {str(tmp_path / 'r.h5')!r}, '--tasks', '4', "
            "'--no-progress']) == 0\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'transformer_lens'))\n"
            "assert 'icrl_interp.models.hooks' in sys.modules and not heavy, heavy[:5]\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, capture_output=True)
