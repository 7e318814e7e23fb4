"""`icrl-interp analyze REC.h5` of an episode recording and `icrl-interp causal MODEL --episodes EPS.h5`: the command
lines end to end on a tiny AD model, their wiring (the JSON is what the library functions return on the same
arrays), the one-line refusals, and the command lines of docs/episodes.md's "Representation and causation"."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from icrl_interp import cli
from icrl_interp.analyzers.episode_probes import probe_episodes, replay_targets
from icrl_interp.analyzers.episode_recording import action_probs
from icrl_interp.interventions.episode_causal import causal_episodes
from icrl_interp.models import episode_tokens as et
from icrl_interp.models.ad_transformer import ADConfig, ADTransformer, load, save
from icrl_interp.models.random_init import random_init_copy
from icrl_interp.recording.format import Recording
from icrl_interp.tasks.collect import collect
from icrl_interp.tasks.episodes import write_episodes
from icrl_interp.verdicts.behaviour_fit import fit_behaviour

REPO = Path(__file__).resolve().parents[2]
DARK = "icrl_interp/DarkRoom-v0"
Q = {"alpha": 0.5, "gamma": 0.9, "beta": 5.0}
GIVEN = ["--candidate", "q-learning", "--alpha", "0.5", "--gamma", "0.9", "--inverse-temperature", "5"]
TOL = 1e-9
"""The CLI and the direct call do the same float64 arithmetic on the same arrays: equal up to summation order."""


def _cli(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """16 Dark Room (3 x 3) histories of 30 steps of a Q-learning source, a tiny 2-layer AD model and its recording
    over them (with the random-init baseline)."""
    t = tmp_path_factory.mktemp("episode-analysis")
    eps = collect(DARK, "q-learning", histories=16, steps=30, seed=0, env_kwargs={"size": 3, "horizon": 5},
                  alpha=Q["alpha"], gamma=Q["gamma"], beta=Q["beta"])
    write_episodes(t / "eps.h5", eps)
    torch.manual_seed(0)
    fmt = et.format_for(eps, "ad-step", context=30)
    save(ADTransformer(ADConfig(fmt.to_dict(), d_model=8, n_layers=2, n_heads=2, d_mlp=8)), t / "ad")
    assert cli.main(["record", str(t / "ad"), "--episodes", str(t / "eps.h5"), "--out", str(t / "rec.h5"),
                     "--no-progress"]) == 0
    return t, eps


def _close(a, b) -> bool:
    """JSON trees equal, floats within TOL (relative to 1)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= TOL * max(1.0, abs(a), abs(b))
    return a == b


def test_analyze_probes_are_probe_episodes_on_the_recorded_arrays(made, capsys):
    """Kills a wiring mutant: the layers swapped or mislabelled, the wrong targets (another candidate, a parameter
    dropped), the random-init baseline not passed, another split."""
    t, eps = made
    rc, out, err = _cli(capsys, "analyze", t / "rec.h5", *GIVEN, "--json", t / "given.json")
    assert rc == 0, err
    got = json.loads((t / "given.json").read_text())
    with Recording(t / "rec.h5") as rec:
        layers = {l: rec.read(f"blocks.{l}.hook_resid_post") for l in (0, 1)}
        base = {l: rec.array(f"baseline/acts/blocks.{l}.hook_resid_post") for l in (0, 1)}
    want = probe_episodes(eps, layers, replay_targets(eps, "q_learning", **Q), random_layers=base, seed=0,
                          test_fraction=0.25, folds=5).json  # analyze's --test-fraction, --folds, --split-seed defaults
    assert got["schema"] == want["schema"] and got["targets"] == want["targets"]
    assert _close(got["layers"], want["layers"]) and _close(got["split"], want["split"])
    assert got["layers"]["0"]["q"]["r2"] != got["layers"]["1"]["q"]["r2"]  # the layers differ: a swap would show
    assert got["layers"]["0"]["q"]["baselines"]["random_init"] is not None
    assert got["candidate"] == {"candidate": "q_learning", "params": Q, "source": "given"}
    assert re.search(r"^\s+1\s+delta_selective\s", out, re.M) and "q_learning (alpha 0.5, gamma 0.9, beta 5)" in out


def test_python_analyze_of_an_episode_recording_is_the_cli_json(made, capsys):
    """`icrl_interp.analyze(REC.h5)` of an episode recording is `analyze REC.h5 --json`'s JSON (same defaults: split,
    folds; same candidate). Kills: the recording sent to the families' analyzer (it refused it as "damaged"), a
    default that differs from the CLI's (test_fraction 0.3 for 0.25), the candidate or its parameters dropped."""
    import icrl_interp

    t, _ = made
    rc, _, err = _cli(capsys, "analyze", t / "rec.h5", *GIVEN, "--json", t / "py-given.json")
    assert rc == 0, err
    got = icrl_interp.analyze(t / "rec.h5", candidate="q-learning", params=Q)
    want = json.loads((t / "py-given.json").read_text())
    assert got["source"] == str(t / "rec.h5") and _close(got, want)


def two_rules(monkeypatch) -> dict:
    """Spy on the behavioural fit of the targets (its arguments and result land in the dict returned) and keep it to
    two rules, for time (fit_behaviour itself is tested in tests/verdicts)."""
    from icrl_interp.verdicts import episode_targets

    seen = {}

    def spy(episodes, **kw):
        seen.update(kw, fit=fit_behaviour(episodes, **{**kw, "candidates": ("sarsa", "q_learning")}))
        return seen["fit"]

    monkeypatch.setattr(episode_targets, "fit_behaviour", spy)
    return seen


def test_analyze_by_default_probes_the_fit_to_the_models_action_probabilities(made, capsys, monkeypatch):
    """Kills: the fit run on the source's actions instead of the model's probabilities, or its winner (the closest
    rule, also when none fits) and fitted parameters not the ones replayed. The fit itself (fit_behaviour, tested in
    tests/verdicts) is spied on and kept to two rules here, for time."""
    t, eps = made
    seen = two_rules(monkeypatch)
    rc, _, err = _cli(capsys, "analyze", t / "rec.h5", "--split-seed", "3", "--json", t / "fit.json")
    assert rc == 0, err
    got = json.loads((t / "fit.json").read_text())
    with Recording(t / "rec.h5") as rec:
        probs = action_probs(rec.array("outputs/logits"), eps.valid)
    assert np.allclose(seen["action_probs"], probs, rtol=0, atol=1e-12) and seen["split_seed"] == 3
    fit = seen["fit"]
    best = fit["verdict"]["closest"]
    params = {k: v["value"] for k, v in fit["candidates"][best]["params"].items()}
    assert got["candidate"]["source"] == "behavioural fit" and got["candidate"]["fitted_to"] == "action_probs"
    assert got["candidate"]["candidate"] == best and _close(got["candidate"]["params"], params)
    with Recording(t / "rec.h5") as rec:
        layer = {1: rec.read("blocks.1.hook_resid_post")}
    want = probe_episodes(eps, layer, replay_targets(eps, best, **params), seed=3, test_fraction=0.25, n_boot=10)
    assert _close(got["layers"]["1"]["delta"]["r2"], want.json["layers"]["1"]["delta"]["r2"])


def test_causal_on_episodes_is_causal_episodes_with_the_random_init_model(made, capsys):
    """Kills: another layer or target edited, the random-init model not passed, the seeds or draws not honoured."""
    t, eps = made
    rc, out, err = _cli(capsys, "causal", t / "ad", "--episodes", t / "eps.h5", "--layer", "1", "--target", "q",
                        *GIVEN, "--random-draws", "2", "--bootstrap", "50", "--json", t / "c.json")
    assert rc == 0, err
    got = json.loads((t / "c.json").read_text())
    model = load(t / "ad")
    want = causal_episodes(model, eps, model.token_format, replay_targets(eps, "q_learning", **Q), layer=1,
                           target="q", draws=2, seed=0, split_seed=0, test_fraction=0.5, n_boot=50,
                           random_model=random_init_copy(model, 0)[0])
    assert got["site"] == "blocks.1.hook_resid_post" and got["target"] == "q"
    assert _close(got["effects"], want["effects"]) and _close(got["probe"], want["probe"])
    assert got["conclusion"] == want["conclusion"] and f"conclusion: {want['reason']}" in out


@pytest.mark.parametrize("command, argv, words", [
    ("analyze", ["--candidate", "q-lerning", "--alpha", "0.5"], "unknown learning rule 'q_lerning'"),
    ("analyze", ["--candidate", "q-learning", "--alpha", "0.5"], "q_learning needs parameter gamma"),
    ("analyze", ["--alpha", "0.5"], "--alpha: a candidate's parameters: give --candidate NAME"),
    ("analyze", ["--candidate", "q-learning", "--n", "4"], "--n does not go with an episode recording"),
    ("analyze", ["--tasks", "4"], "--tasks does not go with an episode recording"),
    ("causal", ["--layer", "2"], "--layer 2: the model has no blocks.2.hook_resid_post (its layers: 0, 1)"),
    ("causal", ["--layer", "0", "--candidate", "sarsa", "--alpha", "0.5", "--gamma", "0.9", "--inverse-temperature",
                "1", "--lam", "0.5"], "sarsa has no parameter lam"),
    ("causal", ["--layer", "0", "--figure", "f.png"], "--figure does not go with --episodes"),
])
def test_refusals_are_one_line_exit_2_and_write_nothing(made, capsys, command, argv, words):
    t, _ = made
    src = ["analyze", t / "rec.h5"] if command == "analyze" else ["causal", t / "ad", "--episodes", t / "eps.h5"]
    out = t / "refused.json"
    rc, _, err = _cli(capsys, *src, *argv, "--json", out)
    assert rc == 2 and err.startswith(f"icrl-interp {command}: error: ") and err.count("\n") == 1, err
    assert words in err, err
    assert not out.exists()


def test_episode_flags_on_a_family_recording_or_without_episodes_are_refused(tmp_path, capsys):
    assert cli.main(["construct", "linear-td", "--out", str(tmp_path / "ck"), "--d", "2", "--n", "6"]) == 0
    assert cli.main(["record", str(tmp_path / "ck"), "--out", str(tmp_path / "fam.h5"), "--tasks", "4",
                     "--no-progress"]) == 0
    capsys.readouterr()
    for argv, words in ((["analyze", tmp_path / "fam.h5", "--candidate", "sarsa"], "--candidate goes with an episode "
                                                                                      "recording"),
                        (["analyze", tmp_path / "fam.h5", "--lam", "0.5"], "--lam goes with an episode recording"),
                        (["causal", tmp_path / "ck", "--layer", "0", "--target", "v"], "--target goes with --episodes")):
        rc, _, err = _cli(capsys, *argv, "--json", tmp_path / "x.json")
        assert rc == 2 and err.count("\n") == 1 and words in err, err
        assert not (tmp_path / "x.json").exists()


SECTION = "Representation and causation"
SMALL = {"--histories": "6", "--steps-per-history": "40"}
"""The docs' collect line at a test's size (the shipped model reads any history up to its 120-step context)."""


def test_every_command_line_of_the_representation_and_causation_section_runs(tmp_path, monkeypatch, capsys):
    from tests.test_doc_commands import argv_of, doc_commands

    parts = re.split(r"^## (.+)$", (REPO / "docs" / "episodes.md").read_text(), flags=re.M)
    text = "".join(body for head, body in zip(parts[1::2], parts[2::2]) if head.strip() == SECTION)
    mine = tmp_path / "episodes.md"
    mine.write_text(text)
    lines = [argv_of(c) for _, c, whole, _ in doc_commands(mine) if whole]
    assert [a[0] for a in lines] == ["collect", "record", "analyze", "analyze", "causal"], lines
    monkeypatch.chdir(tmp_path)
    two_rules(monkeypatch)
    (tmp_path / "data").symlink_to(REPO / "data")
    for argv in lines:
        argv = [SMALL.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]
        if argv[0] == "causal":
            argv += ["--random-draws", "2", "--bootstrap", "50"]
        assert cli.main(argv) == 0, argv
    capsys.readouterr()
    assert json.loads(Path("probes.json").read_text())["candidate"]["source"] == "behavioural fit"
    assert json.loads(Path("probes-q.json").read_text())["candidate"]["candidate"] == "q_learning"
    assert json.loads(Path("causal.json").read_text())["conclusion"] in ("yes", "no", "inconclusive")
