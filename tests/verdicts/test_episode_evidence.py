"""The verdict on an episode recording (icrl_interp.verdicts.episode_evidence): the behavioural fit to the model's
action probabilities with the representation evidence beside it, on models of KNOWN mechanism
(tests/episode_models.py): the Q-reader computes Q-learning's TD error and reads it (representation agrees); the
reward decoy acts as Q-learning with alpha 1 (win-stay-lose-shift) but carries no TD error beyond its input
(representation: not carried). The one split by history, and the paired agreement comparison."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from episode_models import KnownModel, bandit_episodes, step_activations, token_format

from icrl_interp.analyzers.episode_probes import split_histories
from icrl_interp.analyzers.episode_recording import action_probs
from icrl_interp.models.episode_tokens import encode
from icrl_interp.verdicts import episode_evidence as EE
from icrl_interp.verdicts.behaviour_fit import fit_behaviour

RULES = ["q_learning", "model_based"]
"""Two rules that differ on a bandit (the one-step rules are identical there), for time."""
KW = dict(bootstrap=200, fit_resamples=0, candidates=RULES, split_seed=1)


@pytest.fixture(scope="module")
def ep():
    return bandit_episodes(64, 30, 2)


def recording(ep, kind):
    """What `open_episode_recording` gives: the histories, the layers [H, T, d] and the action probabilities."""
    m = KnownModel(token_format(ep), kind)
    tokens, pmap = encode(ep, m.fmt)
    with torch.no_grad():
        logits = pmap.to_steps(m(torch.as_tensor(tokens)).double().numpy())
    return SimpleNamespace(episodes=ep, layers={layer: step_activations(m, ep, layer) for layer in (0, 1)},
                           random_layers=None, action_probs=lambda: action_probs(logits, ep.valid))


@pytest.fixture(scope="module")
def q_reader(ep):
    return EE.verdict_on_recording(recording(ep, "q_reader"), **KW)


def test_the_q_reader_is_named_and_its_representation_agrees(q_reader):
    v = q_reader
    assert v["verdict"]["label"] == "q_learning" and v["verdict"]["representation"] == "agrees", v["verdict"]["text"]
    a = v["representation"]["agreement"]
    assert a["winner"] == "q_learning" and a["runner_up"] == "model_based" and a["ci"][0] > 0
    assert a["winner_selective_layers"] == ["0", "1"]
    d = v["representation"]["candidates"]["q_learning"]["layers"]["0"]
    assert d["delta"]["r2"] > 0.99 and d["delta"]["r2_ci"][0] > 0.99 and d["delta_selective"]["selective"]
    assert d["delta"]["r2_ci"][0] <= d["delta"]["r2"] <= d["delta"]["r2_ci"][1]
    fitted = {k: p["value"] for k, p in v["candidates"]["model_based"]["params"].items()}
    assert v["representation"]["candidates"]["model_based"]["params"] == fitted  # each rule with its own fit


def test_one_split_by_history_for_the_fit_and_the_probes(ep, q_reader):
    """Kills a wrong split: the fit's held-out histories are the probes' (`split_histories`), so no held-out
    history was seen by the fitted parameters or by a probe; the seed moves it."""
    held = split_histories(ep.n_histories, KW["split_seed"], 0.3).test.tolist()
    assert q_reader["histories"]["held_out_indices"] == held == q_reader["representation"]["held_out_indices"]
    assert q_reader["histories"]["split"] == "given"
    assert held != split_histories(ep.n_histories, 0, 0.3).test.tolist()


def test_the_reward_decoy_is_named_by_behaviour_but_its_td_error_is_not_carried(ep):
    """Win-stay-lose-shift is Q-learning with alpha 1: the behavioural label stays (and `clear` is the fit's
    alone), but the representation evidence does not back it and the text says so."""
    rec = recording(ep, "reward_decoy")
    v = EE.verdict_on_recording(rec, **KW)
    alone = fit_behaviour(ep, action_probs=rec.action_probs(), held_out=v["histories"]["held_out_indices"],
                          **{k: KW[k] for k in ("bootstrap", "fit_resamples", "candidates", "split_seed")})
    assert v["verdict"]["label"] == alone["verdict"]["label"] == "q_learning"
    assert v["verdict"]["clear"] == alone["verdict"]["clear"]
    assert v["candidates"]["q_learning"]["params"]["alpha"]["value"] > 0.95
    assert v["verdict"]["representation"] == "not carried", v["verdict"]["text"]
    assert "does not back it" in v["verdict"]["text"] and v["verdict"]["text"].startswith(alone["verdict"]["text"])


def test_the_agreement_is_paired():
    """Two probes whose R^2 vary widely across resamples but differ by a constant: the paired difference's interval
    is narrow around it (an unpaired comparison would straddle 0)."""
    rng = np.random.default_rng(0)
    base = 0.5 + 0.2 * rng.normal(size=2000)
    samples = np.stack([base + 0.1 + 1e-3 * rng.normal(size=2000), base], 1)
    col = {(0, EE.key("w", "delta")): 0, (0, EE.key("r", "delta")): 1}
    cands = {c: {"layers": {"0": {"delta": {"r2": float(samples[:, j].mean())},
                                  "delta_selective": {"selective": True}}}} for c, j in (("w", 0), ("r", 1))}
    a = EE.agreement({"closest": "w", "runner_up": "r"}, cands, samples, col, [0])
    assert a["label"] == "agrees" and a["paired"]
    assert 0.095 < a["ci"][0] < a["ci"][1] < 0.105
    swapped = EE.agreement({"closest": "r", "runner_up": "w"}, cands, samples, col, [0])
    assert swapped["label"] == "disagrees" and swapped["ci"][1] < 0


@pytest.mark.parametrize("gap, label", [(-0.004, "alike"), (0.004, "alike"), (-0.03, "disagrees"),
                                        (0.03, "agrees")])
def test_a_negligible_paired_difference_is_alike_not_a_disagreement(gap, label):
    """A narrow paired interval a few thousandths from 0 (the shipped AD model's Q-learning vs SARSA: -0.004
    [-0.008, -0.001]) is 'alike'; a gap beyond `NEGLIGIBLE_R2` keeps its sign's label."""
    rng = np.random.default_rng(1)
    base = 0.4 + 0.05 * rng.normal(size=2000)
    samples = np.stack([base + gap + 1e-3 * rng.normal(size=2000), base], 1)
    col = {(0, EE.key("w", "delta")): 0, (0, EE.key("r", "delta")): 1}
    cands = {c: {"layers": {"0": {"delta": {"r2": float(samples[:, j].mean())},
                                  "delta_selective": {"selective": True}}}} for c, j in (("w", 0), ("r", 1))}
    a = EE.agreement({"closest": "w", "runner_up": "r"}, cands, samples, col, [0])
    assert a["label"] == label, a["text"]
    assert (a["ci"][1] < 0 or a["ci"][0] > 0)  # every case is 'significant': only the size decides


def test_r2_samples_score_every_probe_on_the_same_resamples():
    """Identical per-history sums give identical R^2 in every resample (exact: the same arithmetic on the same
    numbers), and each column is the R^2 of its resampled sums."""
    rng = np.random.default_rng(1)
    y = rng.normal(size=(20, 2))
    n, sy, syy = np.full(20, 5.0), 5 * y[:, 0], 5 * (y ** 2).sum(1) + 5
    one = np.column_stack([rng.uniform(1, 2, 20), np.zeros(20), np.zeros(20), n, sy, syy, np.zeros((20, 3))])
    other = one.copy()
    other[:, 0] *= 3.0
    s = EE.r2_samples(np.stack([one, one, other], 1), seed=0, n_boot=50)
    assert s.shape == (50, 3)
    np.testing.assert_array_equal(s[:, 0], s[:, 1])
    assert np.all(s[:, 2] < s[:, 0])
    full = one.sum(0)
    assert np.median(s[:, 0]) == pytest.approx(1 - full[0] / (full[5] - full[4] ** 2 / full[3]), abs=0.2)
