"""Episode probes (analyzers/episode_probes.py) on models of KNOWN mechanism (tests/episode_models.py): the
selective part of delta credited where the stream computes it and not where it only holds the reward, the
shuffled-by-history baseline catching a clock, the split by history catching a memorizer of histories, the
random-init baseline, blocked (h5py) reads equal to whole ones."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from episode_models import ALPHA, BETA, GAMMA, KnownModel, bandit_episodes, step_activations, token_format

from icrl_interp.analyzers import episode_probes as P
from icrl_interp.analyzers import td_probe
from icrl_interp.core.errors import UserError

H, T = 64, 30


@pytest.fixture(scope="module")
def ep():
    return bandit_episodes(H, T, 2)


@pytest.fixture(scope="module")
def targets(ep):
    return P.replay_targets(ep, "q_learning", alpha=ALPHA, gamma=GAMMA, beta=BETA)


def acts(ep, kind, layers=(0, 1), **kw):
    m = KnownModel(token_format(ep), kind, **kw)
    m.ids = torch.arange(ep.n_histories)
    return {layer: step_activations(m, ep, layer) for layer in layers}


def row(res, layer, name):
    return res.json["layers"][str(layer)][name]


def test_targets_are_the_learner_replay_aligned_to_what_the_model_has_seen(ep, targets):
    from icrl_interp.tasks.learners import replay

    rep = replay("q_learning", ep, alpha=ALPHA, gamma=GAMMA, beta=BETA)
    assert np.all(np.isnan(targets["delta"][:, 0]))  # nothing seen yet at step 0 (exact: NaN by construction)
    np.testing.assert_array_equal(targets["delta"][:, 1:], rep.delta[:, :-1])  # a copy, exact
    np.testing.assert_array_equal(targets["q"], np.take_along_axis(rep.q, ep.actions[..., None], -1)[..., 0])
    np.testing.assert_array_equal(targets["q_action_1"], rep.q[..., 1])
    X = P.input_features(ep)
    fmt = token_format(ep)
    np.testing.assert_array_equal(X[:, 1:, fmt.columns["prev_reward"].start], ep.rewards[:, :-1])
    np.testing.assert_array_equal(X[:, 1:, fmt.columns["prev_action"]].argmax(-1), ep.actions[:, :-1])
    assert not X[:, 0, fmt.columns["prev_action"]].any()


def test_q_reader_carries_delta_selectively_the_reward_decoy_does_not(ep, targets):
    """The Q-reader's layer 0 holds delta_{t-1}: its selective part decoded (R^2 ~ 1, interval far above 0); Q
    per action at layer 1. The decoy's stream holds the reward: raw delta decodes as well as the input does, and
    its selective part is not credited (interval below conclusion.NEGLIGIBLE_SELECTIVITY)."""
    res = P.probe_episodes(ep, acts(ep, "q_reader"), targets, n_boot=300)
    sel = row(res, 0, "delta_selective")
    for name in ("delta", "delta_selective", "v"):  # the per-history sums hold every held-out R^2 of the JSON
        r, S = row(res, 0, name), res.sums[(0, name)].sum(0)
        assert td_probe.r2_of_sums(S[0], S[3], S[4], S[5]) == pytest.approx(r["r2"], abs=1e-9)
        assert td_probe.r2_of_sums(S[6], S[3], S[7], S[8]) == pytest.approx(r["baselines"]["shuffled"], abs=1e-9)
        assert td_probe.r2_of_sums(S[1], S[3], S[4], S[5]) == pytest.approx(r["baselines"]["input"], abs=1e-9)
        assert r["max_baseline"] == max(v for v in r["baselines"].values() if v is not None)
        assert r["selectivity"]["mean"] == pytest.approx(r["r2"] - r["max_baseline"], abs=1e-9)
    assert sel["r2"] > 0.99 and sel["selectivity"]["ci"][0] > 0.5 and sel["selective"]
    assert row(res, 1, "q_action_0")["r2"] > 0.99 and row(res, 1, "q_action_0")["selective"]
    assert row(res, 0, "q_action_0")["selectivity"]["mean"] < row(res, 1, "q_action_0")["selectivity"]["mean"] - 0.3
    decoy = P.probe_episodes(ep, acts(ep, "reward_decoy"), targets, n_boot=300)
    for layer in (0, 1):
        assert row(decoy, layer, "delta")["r2"] > 0.5  # it does carry (the reward part of) delta
        s = row(decoy, layer, "delta_selective")
        assert s["selectivity"]["ci"][1] < 0.02 and not s["selective"]
    assert decoy.json["explained"]["delta"]["r2_test"] > 0.5


def test_shuffled_by_history_baseline_catches_a_clock(ep, targets):
    """A stream holding only the step index predicts delta's selective part (it shrinks as the learner learns):
    R^2 well above 0 and above the input's; only the same-step targets of another history match it."""
    res = P.probe_episodes(ep, acts(ep, "clock", layers=(0,)), targets, n_boot=300)
    s = row(res, 0, "delta_selective")
    assert s["r2"] > 0.1 and s["r2"] - s["baselines"]["input"] > 0.1  # without the shuffled baseline: "selective"
    assert s["baselines"]["shuffled"] > s["r2"] - 0.02 and not s["selective"]
    assert s["selectivity"]["mean"] < 0.02


def test_split_by_history_catches_a_memorizer(monkeypatch):
    """A random code per history (orthogonal to the token, more dimensions than training histories): a split by
    step learns each history's level of V from its other steps (a leak); the split by history cannot, so the
    probe is below the input baseline."""
    H = 32
    ep = bandit_episodes(H, T, 2, seed=1)
    targets = P.replay_targets(ep, "q_learning", alpha=ALPHA, gamma=GAMMA, beta=BETA)
    layers = acts(ep, "memorizer", layers=(0,), d=56, n_histories=H)
    res = P.probe_episodes(ep, layers, targets, n_boot=300)
    v = row(res, 0, "v")
    assert v["r2"] < v["baselines"]["input"] and v["selectivity"]["mean"] < -0.1 and not v["selective"]
    fold = res.split.fold
    assert np.all(P.step_folds(res.split, T) == fold[:, None])  # every step of a history on one side
    partner = res.split.partner
    assert np.all(partner != np.arange(H)) and sorted(partner) == list(range(H))  # a derangement
    # the mutant: folds by step; the same assertion then fails
    monkeypatch.setattr(P, "step_folds", lambda split, n: np.broadcast_to(np.arange(n) % (split.k + 1), (H, n)))
    leak = row(P.probe_episodes(ep, layers, targets, n_boot=10), 0, "v")
    assert leak["r2"] > v["baselines"]["input"] + 0.1


def test_random_init_baseline_is_subtracted(ep, targets):
    """The decoy's layer 1 holds win-stay-lose-shift products (non-linear in the token): Q per action decodes
    above the linear input baseline; a random-init model carrying the same features takes that away."""
    layers = acts(ep, "reward_decoy", layers=(1,))
    alone = row(P.probe_episodes(ep, layers, targets, n_boot=50), 1, "q_action_0")
    assert alone["selectivity"]["mean"] > 0.05 and alone["baselines"]["random_init"] is None
    same = row(P.probe_episodes(ep, layers, targets, random_layers=layers, n_boot=50), 1, "q_action_0")
    assert same["baselines"]["random_init"] == pytest.approx(same["r2"], abs=1e-9)
    assert same["selectivity"]["mean"] <= 1e-9


def test_blocked_and_h5py_reads_equal_whole_reads(ep, targets, tmp_path):
    layers = acts(ep, "q_reader", layers=(0,))
    whole = P.probe_episodes(ep, layers, targets, n_boot=50)
    reads = []

    class Spy:  # an array-like that records how many histories each read asks for
        shape = layers[0].shape

        def __getitem__(self, key):
            reads.append(np.arange(H)[key].size)
            return layers[0][key]

    blocked = P.probe_episodes(ep, {0: Spy()}, targets, n_boot=50, block=5)
    assert reads and max(reads) <= 5
    reads.clear()
    with pytest.MonkeyPatch.context() as mp:  # the default block: BLOCK_BYTES of float32 activations
        mp.setattr(P, "BLOCK_BYTES", 4 * 24 * T * 3)
        P.probe_episodes(ep, {0: Spy()}, targets, n_boot=5)
    assert max(reads) == 3
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = layers[0]
    with h5py.File(tmp_path / "a.h5", "r") as f:
        h5 = P.probe_episodes(ep, {0: f["x"]}, targets, n_boot=50, block=7)
    for name in ("delta_selective", "q", "v"):
        a, b, c = row(whole, 0, name), row(blocked, 0, name), row(h5, 0, name)
        assert b["r2"] == pytest.approx(a["r2"], abs=1e-9)  # float64 sums in a different order
        assert c["r2"] == pytest.approx(a["r2"], abs=1e-9)
        assert b["selectivity"]["ci"] == pytest.approx(a["selectivity"]["ci"], abs=1e-9)


def test_refusals(ep, targets):
    layers = acts(ep, "q_reader", layers=(0,))
    with pytest.raises(UserError, match="shape"):
        P.probe_episodes(ep, {0: layers[0][:, :5]}, targets)
    with pytest.raises(UserError, match="selective target"):
        P.probe_episodes(ep, layers, {"v": targets["v"]})
    with pytest.raises(UserError, match="probe target"):
        P.probe_episodes(ep, layers, {"delta": targets["delta"][:3]})
    few = bandit_episodes(12, 6, 2, seed=4)  # ~4 held-out histories: below td_probe.MIN_CI_TASKS, no interval
    res = P.probe_episodes(few, acts(few, "q_reader", layers=(0,)), P.replay_targets(
        few, "q_learning", alpha=ALPHA, gamma=GAMMA, beta=BETA), n_boot=20)
    assert res.split.test.size < td_probe.MIN_CI_TASKS and row(res, 0, "v")["selectivity"]["ci"] is None
    with pytest.raises(UserError, match="held-out"):
        P.split_histories(1)  # one history: never both a held-out and two training ones
    seed = next(s for s in range(100) if np.all(td_probe.task_folds(np.arange(3), s, P.TEST_FRACTION, P.FOLDS) < 5))
    with pytest.raises(UserError, match="leave no held-out"):
        P.split_histories(3, seed)  # three training histories, none held out


def test_padding_steps_are_left_out(ep, targets):
    """Histories shorter than T (valid False at their end, NaN activations there, as a recording stores them): the
    padding is never a sample, and the probes equal those with the padding's activations set to anything."""
    import dataclasses

    valid = ep.valid.copy()
    valid[::2, -6:] = False
    short = dataclasses.replace(ep, valid=valid)
    tg = P.replay_targets(short, "q_learning", alpha=ALPHA, gamma=GAMMA, beta=BETA)
    assert np.all(np.isnan(tg["v"][~valid]))
    x = acts(ep, "q_reader", layers=(0,))[0]
    res_nan = P.probe_episodes(short, {0: np.where(valid[..., None], x, np.nan)}, tg, n_boot=20)
    res_big = P.probe_episodes(short, {0: np.where(valid[..., None], x, 1e6)}, tg, n_boot=20)
    a, b = row(res_nan, 0, "delta_selective"), row(res_big, 0, "delta_selective")
    assert a["r2"] > 0.99 and a["r2"] == b["r2"] and a["selectivity"] == b["selectivity"]  # exact: same samples
    assert a["n_train"] + a["n_test"] == int((res_nan.mask).sum()) and not res_nan.mask[~valid].any()


def test_input_features_are_the_ad_step_token():
    """input_features equals what one `ad-step` token holds (episode_tokens.encode), episode starts and padding
    included, on multi-step episodes with a short history."""
    from icrl_interp.models.episode_tokens import TokenFormat, encode
    from icrl_interp.tasks.episodes import Episodes

    rng = np.random.default_rng(3)
    H_, T_ = 4, 12
    obs, nxt = rng.integers(0, 3, (H_, T_)), rng.integers(0, 3, (H_, T_))
    valid = np.ones((H_, T_), bool)
    valid[1, 8:] = False
    ep = Episodes(observations=obs, actions=rng.integers(0, 2, (H_, T_)), rewards=rng.normal(size=(H_, T_)),
                  next_observations=nxt, terminations=rng.random((H_, T_)) < 0.3, truncations=np.zeros((H_, T_), bool),
                  valid=valid, n_actions=2, n_observations=3)
    tokens, _ = encode(ep, TokenFormat("ad-step", 3, 2, T_))  # one window: position t is step t
    X = P.input_features(ep)
    np.testing.assert_allclose(X, tokens.reshape(H_, T_, -1), rtol=np.finfo(np.float32).eps, atol=0)
    assert X[0, 0, -1] == 1.0 and X[1, 9:].sum() == 0.0  # first step starts an episode; padding is 0 (exact)
