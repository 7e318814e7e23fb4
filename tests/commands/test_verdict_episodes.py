"""`icrl-interp verdict --episodes EPS.h5`: the behavioural fit of the learning rules from the command line,
its JSON, and the options it refuses in one line."""
from __future__ import annotations

import json

import pytest

from icrl_interp import cli
from icrl_interp.tasks.episodes import write_episodes
from tests.commands.test_episode_analysis import made  # noqa: F401  (a fixture: the tiny AD model's recording)
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
    assert v["schema"] == "icrl_interp.episode_verdict/2" and v["source"] == str(eps)
    assert list(v["candidates"]) == ["q_learning"] and v["histories"]["split_seed"] == 4
    assert v["verdict"]["label"] == "none fits" and "none fits" in text and "history_frequency" in text
    assert "representation" not in v  # the behavioural fit alone


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


# ------------------------------------------------------------------ on an episode recording
@pytest.fixture(scope="module")
def rec(made):
    """A tiny 2-layer AD model's recording over 16 Dark Room (3 x 3) histories of 30 steps of a Q-learning source
    (with the random-init baseline): `made` of tests/commands/test_episode_analysis.py."""
    return made[0] / "rec.h5"


def two_rules(monkeypatch):
    """The fit of a verdict on a recording kept to two rules, for time (the fit is tested in tests/verdicts)."""
    from icrl_interp.verdicts import episode_evidence

    real = episode_evidence.fit_behaviour
    monkeypatch.setattr(episode_evidence, "fit_behaviour",
                        lambda ep, **kw: real(ep, **{**kw, "candidates": kw["candidates"] or ["q_learning", "sarsa"],
                                                     "fit_resamples": 5}))


def test_verdict_on_an_episode_recording_is_verdict_on_recording(rec, tmp_path, capsys, monkeypatch):
    """Kills a wiring mutant: the recording's action probabilities, layers or random-init layers not passed, the
    split seed, test fraction or candidates not honoured, the representation not printed. The Python API
    (`icrl_interp.verdict(REC.h5)`, `verdicts.episode_evidence.verdict_on_recording`) gives the same JSON."""
    import icrl_interp

    out = tmp_path / "v.json"
    rc, text, err = _cli(capsys, "verdict", str(rec), "--candidates", "q_learning,mc_control", "--bootstrap", "50",
                         "--split-seed", "2", "--test-fraction", "0.4", "--json", str(out))
    assert rc == 0, err
    got = json.loads(out.read_text())
    want = icrl_interp.verdict(rec, split_seed=2, test_fraction=0.4, bootstrap=50,
                               candidates=["q_learning", "mc_control"])
    for v in (got, want):
        for c in v["candidates"].values():
            del c["fit_seconds"]
    assert json.loads(json.dumps(want)) == got  # the same arithmetic on the same arrays
    assert got["schema"] == "icrl_interp.episode_verdict/2" and got["fitted_to"] == "action_probs"
    layer = got["representation"]["candidates"]["q_learning"]["layers"]["1"]["delta"]
    assert layer["baselines"]["random_init"] is not None
    assert got["representation"]["agreement"]["text"] in text and "history_frequency" in text


def test_verdict_on_an_episode_recording_refuses_what_it_does_not_use(rec, tmp_path, capsys):
    for argv, words in (((str(rec), "--min-r2", "0.2"), "--min-r2: not used on an episode recording"),
                        ((str(rec), "--tasks", "8"), "--tasks: not used on an episode recording"),
                        ((str(rec), "--no-causal"), "--causal: not used on an episode recording"),
                        ((str(rec), "--candidates", "td0"), "unknown td0"),
                        ((str(rec), "--json", str(tmp_path / "v.txt")), "suffix")):
        rc, _, err = _cli(capsys, "verdict", *argv)
        assert rc == 2 and words in err and err.count("\n") == 1, err
    assert not (tmp_path / "v.txt").exists()


def test_the_command_line_of_the_verdict_on_a_recording_section_runs(rec, tmp_path, capsys, monkeypatch):
    import re
    import shutil
    from pathlib import Path

    from tests.test_doc_commands import argv_of, doc_commands

    docs = Path(__file__).resolve().parents[2] / "docs" / "episodes.md"
    parts = re.split(r"^## (.+)$", docs.read_text(), flags=re.M)
    (tmp_path / "section.md").write_text("".join(b for h, b in zip(parts[1::2], parts[2::2])
                                                 if h.strip() == "The verdict on a recording"))
    lines = [argv_of(c) for _, c, whole, _ in doc_commands(tmp_path / "section.md") if whole]
    assert [a[0] for a in lines] == ["verdict"], lines
    shutil.copy(rec, tmp_path / "rec.h5")
    monkeypatch.chdir(tmp_path)
    two_rules(monkeypatch)
    for argv in lines:
        assert cli.main(argv) == 0, argv
    capsys.readouterr()
    v = json.loads((tmp_path / "verdict-rec.json").read_text())
    assert list(v["candidates"]) == ["q_learning", "sarsa"] and v["representation"]["agreement"]["label"] in \
        ("agrees", "alike", "disagrees", "not carried", "inconclusive")
