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


SECTION = "Recording a model over episodes"
GIVEN = ["--candidate", "q-learning", "--alpha", "0.5", "--gamma", "0.9", "--inverse-temperature", "10"]


def test_the_resume_and_shards_lines_of_the_recording_section_run_and_analyze_alike(tmp_path, monkeypatch, capsys):
    """docs/episodes.md's `data/ad` lines of its recording section on a small dark.h5 (batches of 1 history in
    place of the default 128): the plain line interrupted after one batch (exit 130, rec.h5.partial kept), a
    --resume over another episodes file refused in one line, the --resume line, then the --shards line, each
    giving the uninterrupted recording's datasets; `analyze` of the sharded recording writes the plain one's JSON."""
    import json
    import re
    from pathlib import Path

    from icrl_interp.recording.episodes import load_episode_model, record_episodes
    from icrl_interp.recording.format import RecordingWriter
    from icrl_interp.tasks.collect import collect
    from tests.recording.test_episodes_resume import _same_recording
    from tests.test_doc_commands import argv_of, doc_commands

    repo = Path(__file__).resolve().parents[2]
    parts = re.split(r"^## (.+)$", (repo / "docs" / "episodes.md").read_text(), flags=re.M)
    (tmp_path / "episodes.md").write_text("".join(b for h, b in zip(parts[1::2], parts[2::2]) if h.strip() == SECTION))
    lines = [argv_of(c) for _, c, whole, _ in doc_commands(tmp_path / "episodes.md") if whole and "data/ad" in c]
    assert [a[-1] for a in lines] == ["rec.h5", "--resume", "4"], lines  # the plain, --resume and --shards 4 lines
    plain, resume, sharded = ([*a, "--batch-size", "1", "--no-progress"] for a in lines)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").symlink_to(repo / "data")
    for name, seed in (("dark.h5", 0), ("other.h5", 1)):
        write_episodes(name, collect("icrl_interp/DarkRoom-v0", "q-learning", histories=6, steps=20, seed=seed,
                                     env_kwargs={"size": 5, "horizon": 10}, alpha=0.5, gamma=0.9, beta=10.0))
    record_episodes(load_episode_model("data/ad"), "dark.h5", "ref.h5", batch_size=1, progress=False,
                    model_spec="data/ad")  # the plain line's recording, uninterrupted
    real, calls = RecordingWriter.write_batch, []

    def write_batch(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(RecordingWriter, "write_batch", write_batch)
        assert cli.main(plain) == 130
    assert Path("rec.h5.partial").exists() and not Path("rec.h5").exists()
    capsys.readouterr()
    rc, _, err = _cli(capsys, *[a.replace("dark.h5", "other.h5") for a in resume])
    assert rc == 2 and err.count("\n") == 1 and "different histories_sha256" in err, err
    assert cli.main(resume) == 0
    _same_recording("ref.h5", "rec.h5")
    Path("rec.h5").unlink()
    assert cli.main(sharded) == 0
    _same_recording("ref.h5", "rec.h5")
    assert sorted(p.name for p in Path().glob("rec.shard-*")) == [f"rec.shard-{i}-of-4.h5" for i in range(4)]
    for name in ("ref", "rec"):
        assert cli.main(["analyze", f"{name}.h5", *GIVEN, "--json", f"{name}.json"]) == 0
    capsys.readouterr()
    one, two = (json.loads(Path(f"{n}.json").read_text()) for n in ("ref", "rec"))
    assert (one.pop("source"), two.pop("source")) == ("ref.h5", "rec.h5")
    assert one == two  # exact: the same datasets analyzed the same way
