"""`icrl-interp record --episodes EPS.h5`: an AD model directory or a user's FILE.py:FUNC recorded over an
episodes file from the command line, and the options it refuses in one line, leaving no file."""
from __future__ import annotations

import numpy as np
import torch

from icrl_interp import cli
from icrl_interp.models import episode_tokens as et
from icrl_interp.models.ad_transformer import ADConfig, ADTransformer, save
from icrl_interp.recording.format import Recording
from icrl_interp.tasks.episodes import write_episodes
from tests.recording.test_episodes_record import A, O, episodes

USER_MODEL = f'''
import torch
from torch import nn

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear({et.TokenFormat("ad-step", O, A, 3).d_token}, 5), nn.Tanh(), nn.Linear(5, {A}))
'''


def _cli(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_record_episodes_from_the_command_line(tmp_path, capsys):
    eps = tmp_path / "eps.h5"
    write_episodes(eps, episodes())
    torch.manual_seed(0)
    save(ADTransformer(ADConfig(et.TokenFormat("ad-step", O, A, 4).to_dict(), d_model=8, n_layers=1, n_heads=2,
                                d_mlp=8)), tmp_path / "ad")
    rc, text, err = _cli(capsys, "record", tmp_path / "ad", "--episodes", eps, "--out", tmp_path / "r.h5", "--no-progress",
                         "--baseline", "none")
    assert rc == 0, err
    with Recording(tmp_path / "r.h5") as rec:
        assert rec.hooks() == ["blocks.0.hook_resid_post"] and rec.array("outputs/logits").shape == (5, 9, A)
        assert not rec.has("baseline/outputs/logits") and rec.attr("model_spec") == str(tmp_path / "ad")


def test_record_episodes_refusals(tmp_path, capsys):
    eps = tmp_path / "eps.h5"
    write_episodes(eps, episodes())
    (tmp_path / "user.py").write_text(USER_MODEL)
    user = f"{tmp_path / 'user.py'}:make"
    out = tmp_path / "r.h5"
    for argv, words in (((), "needs the model"),
                        (("--model", user, "--task", "sarsa"), "--task does not go with --episodes"),
                        (("--model", user), "no token_format attribute")):
        rc, _, err = _cli(capsys, "record", "--episodes", eps, "--out", out, "--no-progress", *argv)
        assert rc == 2 and words in err and err.count("\n") == 1, err
    rc, _, err = _cli(capsys, "record", "--model", user, "--task", "sarsa", "--context", 4, "--out", out)
    assert rc == 2 and "go with --episodes" in err
    (tmp_path / "spec.toml").write_text('[roles]\nresid_post = ["0", "2"]\n')
    rc, text, err = _cli(capsys, "record", "--model", user, "--episodes", eps, "--token-format", "ad-step", "--context", 3,
                         "--probe", tmp_path / "spec.toml", "--out", out, "--no-progress")  # the user's model, its roles
    assert rc == 0, err
    with Recording(out) as rec:
        assert rec.read("blocks.1.hook_resid_post").shape == (5, 9, A) and rec.has("baseline/outputs/logits")
        assert np.isnan(rec.array("outputs/logits")[3, 6:]).all()  # history 3 ends at step 6: padding
    out.unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eps.h5", "spec.toml", "user.py"]  # no recording, no lock
