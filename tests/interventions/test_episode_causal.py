"""The causal test on actions over learning histories (interventions/episode_causal.py) on models of KNOWN
mechanism (tests/episode_models.py): the Q-reader acts through delta at layer 0 ("yes"), not at layer 1 (the
wrong layer: its head reads Q, never delta there); a model that carries delta and Q but perseverates says "no";
the reward decoy's selective delta is not credited though erasing its probe direction moves its actions; hooks
are removed and the train/eval mode restored, also when the forward pass raises."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from episode_models import ALPHA, BETA, GAMMA, KnownModel, bandit_episodes, token_format

from icrl_interp.analyzers import episode_probes
from icrl_interp.core.errors import UserError
from icrl_interp.interventions import episode_causal as C
from icrl_interp.recording.capture import attached_hook_count

N_BOOT = 400


@pytest.fixture(scope="module")
def ep():
    return bandit_episodes(64, 30, 2)


@pytest.fixture(scope="module")
def targets(ep):
    return episode_probes.replay_targets(ep, "q_learning", alpha=ALPHA, gamma=GAMMA, beta=BETA)


def run(ep, targets, kind, layer, **kw):
    model = KnownModel(token_format(ep), kind)
    return C.causal_episodes(model, ep, token_format(ep), targets, layer=layer, n_boot=N_BOOT, **kw), model


def states(res):
    return {c["name"]: c["state"] for c in res["conclusion_detail"]["criteria"]}


def test_q_reader_acts_through_delta_at_its_layer_and_not_at_the_next(ep, targets):
    res, _ = run(ep, targets, "q_reader", 0)
    assert res["conclusion"] == "yes", res["reason"]
    kl = res["effects"]["kl"]
    assert kl["selective"]["ci"][0] > 5 * kl["random"]["mean"]  # erasing delta changes the policy, a random one barely
    dp = res["effects"]["abs_dp_chosen"]  # the greedy action's probability moves too
    assert dp["selective"]["ci"][0] > 2 * dp["random"]["mean"] and dp["selective"]["mean"] > 0.05
    assert res["erased_variance"]["random"] == pytest.approx(res["erased_variance"]["selective"], rel=1e-6)
    assert res["erased_variance"]["input_explained"] == pytest.approx(res["erased_variance"]["selective"], rel=1e-6)
    # the same direction family one layer later: the head reads Q, which layer 1 already wrote
    late, _ = run(ep, targets, "q_reader", 1)
    assert late["conclusion"] == "no" and states(late)["selective probe"] == "yes"
    assert late["effects"]["kl"]["selective"]["mean"] == 0.0  # exact: unchanged within rounding, replaced by base


def test_carried_but_unread_delta_is_no(ep, targets):
    res, _ = run(ep, targets, "q_ignored", 0)
    assert res["conclusion"] == "no" and states(res)["selective probe"] == "yes"
    assert states(res)["beats random"] == "no"


def test_reward_decoy_is_not_credited_with_delta(ep, targets):
    """Layer 1 of the decoy writes win-stay-lose-shift logits: erasing the selective delta probe's direction moves
    its actions more than random and input-explained erasures do, but the probe is not selective: "no"."""
    res, _ = run(ep, targets, "reward_decoy", 1)
    st = states(res)
    assert st["beats the input"] == "yes" and st["selective probe"] == "no"
    assert res["conclusion"] == "no"
    early, _ = run(ep, targets, "reward_decoy", 0)  # layer 0: its reward direction is what moves the actions
    assert early["conclusion"] == "no" and early["effects"]["kl"]["minus_input_explained"]["ci"][1] < 0


def test_hooks_removed_and_modes_restored_also_on_error(ep, targets):
    model = KnownModel(token_format(ep), "q_reader")
    model.train()
    C.causal_episodes(model, ep, token_format(ep), targets, layer=0, n_boot=20, draws=2)
    assert attached_hook_count(model) == 0 and model.training and model.blocks[0].training
    assert model.seen_training and not any(model.seen_training)  # every forward pass ran in eval mode

    class Boom(KnownModel):
        def forward(self, tokens):
            if self.calls >= 2:  # the unedited pass works; the first edited one raises inside the hooks
                raise RuntimeError("boom")
            return super().forward(tokens)

    bad = Boom(token_format(ep), "q_reader")
    bad.train()
    with pytest.raises(RuntimeError, match="boom"):
        C.causal_episodes(bad, ep, token_format(ep), targets, layer=0, n_boot=20, draws=2)
    assert attached_hook_count(bad) == 0 and bad.training


def test_effects_by_hand():
    base = np.log(np.array([[[0.5, 0.5], [0.8, 0.2]]]))
    edited = np.log(np.array([[[0.25, 0.75], [0.8, 0.2]]]))
    e = C.effects(base, edited, np.ones((1, 2), bool), torch.float64)
    kl0 = 0.5 * np.log(0.5 / 0.25) + 0.5 * np.log(0.5 / 0.75)
    assert e["kl"][0] == pytest.approx(kl0 / 2, rel=1e-12)  # step 1 unchanged: 0 exactly
    assert e["dp_chosen"][0] == pytest.approx((0.25 - 0.5) / 2, rel=1e-12)  # greedy of a tie: action 0 (argmax)
    e = C.effects(base, edited, np.array([[False, True]]), torch.float64)
    assert e["kl"][0] == 0.0 and e["abs_dp_chosen"][0] == 0.0  # only the valid step counts (exact: unchanged)


def test_refusals(ep, targets):
    model = KnownModel(token_format(ep), "q_reader")
    with pytest.raises(UserError, match="not among"):
        C.causal_episodes(model, ep, token_format(ep), targets, layer=0, target="nope")
    with pytest.raises(UserError, match="no hook point"):
        C.causal_episodes(model, ep, token_format(ep), targets, layer=5)
    with pytest.raises(UserError, match="draws"):
        C.causal_episodes(model, ep, token_format(ep), targets, layer=0, draws=1)
    assert attached_hook_count(model) == 0


def test_the_edit_touches_the_read_positions_only(ep):
    """run_model edits the site where `at` is True and nowhere else (the clock model's layer 1 passes layer 0 on)."""
    from icrl_interp.interventions.edits import projection_edit
    from icrl_interp.models.episode_tokens import encode

    model = KnownModel(token_format(ep), "clock")
    tokens, _ = encode(ep, model.fmt)
    at = np.random.default_rng(0).random(tokens.shape[:2]) < 0.5
    u = np.zeros(24)
    u[[0, 3, 20]] = 1.0
    edit = projection_edit(u, 0.25)
    seen = []
    handle = model.blocks[1].hook_resid_post.register_forward_hook(lambda m, i, o: seen.append(o.double().numpy()))
    try:
        C.run_model(model, tokens, "blocks.0.hook_resid_post", at, batch_size=40)
        C.run_model(model, tokens, "blocks.0.hook_resid_post", at, edit=edit, batch_size=40)
    finally:
        handle.remove()
    base, edited = np.concatenate(seen[:2]), np.concatenate(seen[2:])
    np.testing.assert_array_equal(edited[~at], base[~at])  # exact: untouched
    want = edit.apply(base[at])
    np.testing.assert_allclose(edited[at], want, atol=8 * np.finfo(np.float32).eps * np.abs(base).max())
    assert np.abs(edited[at] - base[at]).max() > 0.1


def test_random_init_activations_join_the_selectivity_criterion(ep, targets):
    """A random-init model that carries what the model carries (here: itself) leaves no selectivity: "no"."""
    model = KnownModel(token_format(ep), "q_reader")
    res = C.causal_episodes(model, ep, token_format(ep), targets, layer=0, n_boot=100, draws=2, random_model=model)
    sel = res["probe"]["delta_selective"]
    assert sel["baselines"]["random_init"] == pytest.approx(sel["r2"], abs=1e-9)
    assert res["conclusion"] == "no" and states(res)["selective probe"] == "no"


@pytest.mark.parametrize("name,context,stride", [("ad-step", 8, 3), ("ad-element", 5, None), ("dpt", 4, None)])
def test_read_positions_come_back_aligned_to_steps(name, context, stride):
    """run_model keeps the read positions only (row-major); to_steps puts them where PositionMap.to_steps does."""
    from icrl_interp.models.episode_tokens import encode, format_for

    ep = bandit_episodes(5, 11, 3, seed=2)
    fmt = format_for(ep, name, context, stride)
    tokens, pmap = encode(ep, fmt)
    values = np.random.default_rng(1).standard_normal((*tokens.shape[:2], 4))
    at = C.read_mask(pmap)
    assert at.sum() == ep.valid.sum()  # one read position per valid step (exact count)
    np.testing.assert_array_equal(C.to_steps(pmap, values[at]), pmap.to_steps(values))  # exact: a gather


def test_directions_use_training_histories_only(ep, targets):
    """Changing a held-out history's activations changes neither the directions nor the covariance they are sized by."""
    from episode_models import step_activations

    X = step_activations(KnownModel(token_format(ep), "q_reader"), ep, 0)
    probes = episode_probes.probe_episodes(ep, {0: X}, {"delta": targets["delta"]}, n_boot=5)
    dirs, mean_x, cov_x = C.directions(X, probes, 0, "delta")
    Y = X.copy()
    Y[probes.split.test] += np.random.default_rng(0).standard_normal(Y[probes.split.test].shape)
    d2, m2, c2 = C.directions(Y, probes, 0, "delta")
    np.testing.assert_array_equal(cov_x, c2)  # exact: the same training rows
    np.testing.assert_array_equal(dirs["selective"].u, d2["selective"].u)
    assert dirs["selective"].std > 0 and np.abs(dirs["selective"].u @ dirs["input"].u) < 1


def test_paired_bootstrap_over_histories():
    idx = C.resamples(40, 2000, 3)
    assert idx.shape == (2000, 40) and idx.min() == 0 and idx.max() == 39  # every history can be drawn
    np.testing.assert_array_equal(idx, C.resamples(40, 2000, 3))  # a pure function of the seed
    a = np.r_[np.zeros(20), np.ones(20)]
    b = C.bootstrap(a, idx)
    half = 1.96 * 0.5 / np.sqrt(40)  # the normal approximation of the mean's interval
    assert b["mean"] == 0.5 and b["ci"] == pytest.approx([0.5 - half, 0.5 + half], abs=0.03)


def test_nothing_reads_the_site_is_inconclusive(ep, targets):
    class Deaf(KnownModel):  # the hooks fire, the logits ignore them
        def forward(self, tokens):
            return 0 * super().forward(tokens) + torch.arange(self.A, dtype=torch.float32)

    res = C.causal_episodes(Deaf(token_format(ep), "q_reader"), ep, token_format(ep), targets, layer=0, n_boot=50,
                            draws=2)
    assert res["conclusion"] == "inconclusive" and "changes the action distribution" in res["reason"]
    assert res["effects"]["kl"]["random"]["mean"] == 0.0  # exact: every edited logit is the base one
