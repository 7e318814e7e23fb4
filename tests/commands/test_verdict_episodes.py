"""`icrl-interp verdict --episodes EPS.h5`: the behavioural fit of the learning rules from the command line,
its JSON, and the options it refuses in one line."""
from __future__ import annotations

import json

from icrl_interp import cli
from icrl_interp.tasks.episodes import write_episodes
from tests.verdicts.test_behaviour_fit import simulate


def _cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_verdict_on_an_episodes_file(tmp_path, capsys):
    eps = tmp_path / "eps.h5"
    write_episodes(eps, simulate("perseverate", H=8, T=30, seed=3))
    out = tmp_path / "v.json"
    rc, text, err = _cli(capsys, "verdict", "--episodes", str(eps), "--candidates", "q_learning", "--bootstrap", "50",
                         "--split-seed", "4", "--json", str(out))
    assert rc == 0, err
    v = json.loads(out.read_text())
    assert v["schema"] == "icrl_interp.episode_verdict/1" and v["source"] == str(eps)
    assert list(v["candidates"]) == ["q_learning"] and v["histories"]["split_seed"] == 4
    assert v["verdict"]["label"] == "none fits" and "none fits" in text and "action_sequence" in text


def test_verdict_episodes_refusals(tmp_path, capsys):
    eps = tmp_path / "eps.h5"
    write_episodes(eps, simulate("fixed", H=4, T=5, seed=3))
    for argv, words in (((str(eps), "--episodes", str(eps)), "not used with --episodes"),
                        (("--episodes", str(eps), "--min-r2", "0.2"), "--min-r2"),
                        (("--episodes", str(eps), "--candidates", "td0"), "unknown td0"),
                        (("--episodes", str(tmp_path / "none.h5")), "no such episodes file"),
                        (("--episodes", str(eps), "--json", str(tmp_path / "v.txt")), "suffix")):
        rc, _, err = _cli(capsys, "verdict", *argv)
        assert rc == 2 and words in err and err.count("\n") == 1, err
    assert not (tmp_path / "v.txt").exists()
