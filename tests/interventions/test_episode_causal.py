"""The causal test on actions over learning histories (interventions/episode_causal.py) on models of KNOWN
mechanism (tests/episode_models.py): the Q-reader acts through delta at layer 0 ("yes"), not at layer 1 (the
wrong layer: its head reads Q, never delta there); a model that carries delta and Q but perseverates says "no";
the reward decoy's selective delta is not credited though erasing its probe direction moves its actions; steering
delta up makes the Q-reader repeat its last action (sign "as an RL learner"), and no other model; hooks are removed
and the train/eval mode restored, also when the forward pass raises. The closed loop: test_episode_closed_loop.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from episode_models import ALPHA, BETA, GAMMA, KnownModel, bandit_episodes, token_format

from icrl_interp.analyzers import episode_probes
from icrl_interp.core.errors import UserError
from icrl_interp.interventions import episode_causal as C
from icrl_interp.recording.capture import attached_hook_count
from icrl_interp.tasks.episodes import Episodes

N_BOOT = 400
STEER = {"steer": (-2.0, 2.0), "steer_steps": 2}
"""Two scales, two steered steps per history: enough for the known answers, a quarter of the default's passes."""


@pytest.fixture(scope="module")
def ep():
    return bandit_episodes(64, 30, 2)


@pytest.fixture(scope="module")
def targets(ep):
    return episode_probes.replay_targets(ep, "q_learning", alpha=ALPHA, gamma=GAMMA, beta=BETA)


def run(ep, targets, kind, layer, **kw):
    model = KnownModel(token_format(ep), kind)
    return C.causal_episodes(model, ep, token_format(ep), targets, layer=layer, n_boot=N_BOOT, **{**STEER, **kw}), model


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
    assert late["steering"]["sign"] == "unresolved"
    assert all(p["dp_previous"]["selective"]["mean"] == 0.0 for p in late["steering"]["points"])  # exact, as above


def test_steering_delta_up_repeats_the_last_action_for_the_q_reader_only(ep, targets):
    """At a step t the Q-reader adds alpha * delta_{t-1} (read from the stream) to Q(a_{t-1}): steering the
    selective direction by +s sigma raises pi(a_{t-1}) at t, -s sigma lowers it, by far more than random directions
    of the same norm move it (kills a flipped steering sign, a steering vector of another size, the random control's
    directions not variance-matched)."""
    res, _ = run(ep, targets, "q_reader", 0)
    st = res["steering"]
    assert st["sign"] == "as an RL learner"
    assert st["histories"] == res["histories"]["test"]  # a bandit: every step after the first repeats the state
    down, up = st["points"]
    assert (down["scale"], up["scale"]) == (-2.0, 2.0)
    assert up["dp_previous"]["selective"]["ci"][0] > 0.03 and down["dp_previous"]["selective"]["ci"][1] < -0.03
    assert up["dp_previous"]["selective"]["mean"] > 2 * up["dp_previous"]["random_abs"]["mean"]
    assert up["kl"]["excess_over_random"]["ci"][0] > 0
    # every steering vector has the norm 2 sigma, sigma the selective projection's std; the random directions are
    # variance-matched, so their own projections have that std too (a raw random direction's would differ)
    assert st["sigma"] == pytest.approx(np.sqrt(res["erased_variance"]["selective"]), rel=1e-12)
    assert st["sigma_random"] == pytest.approx(st["sigma"], rel=1e-6)
    assert abs(st["sigma_input_explained"] - st["sigma"]) > 0.1 * st["sigma"]  # the input's is not rescaled to it


def test_steering_sign_is_judged_against_the_random_directions_size(ep, targets):
    """The reward decoy at layer 0: steering its selective probe's direction moves pi(a_{t-1}) a little toward the
    side of s (the direction leans on the reward), while the 8 random draws' *signed* mean happens to lean the other
    way; random directions of its norm move it far more either way, so the sign is not credited (a sign read against
    the draws' signed mean would say "as an RL learner" here). The perseverating Q-carrier: no sign either."""
    res, _ = run(ep, targets, "reward_decoy", 0)
    down, up = res["steering"]["points"]
    assert up["dp_previous"]["selective"]["ci"][0] > 0 and down["dp_previous"]["selective"]["ci"][1] < 0
    assert up["dp_previous"]["selective"]["mean"] - up["dp_previous"]["random"]["mean"] > 0.05
    assert up["dp_previous"]["random_abs"]["mean"] > 3 * up["dp_previous"]["selective"]["mean"]
    assert res["steering"]["sign"] == "unresolved"
    ignored, _ = run(ep, targets, "q_ignored", 0)
    assert ignored["steering"]["sign"] == "unresolved"


def test_carried_but_unread_delta_is_no(ep, targets):
    res, _ = run(ep, targets, "q_ignored", 0)
    assert res["conclusion"] == "no" and states(res)["selective probe"] == "yes"
    assert states(res)["beats random"] == "no"


def test_reward_decoy_is_not_credited_with_delta(ep, targets):
    """Layer 1 of the decoy writes win-stay-lose-shift logits: erasing the selective delta probe's direction moves
    its actions more than random and input-explained erasures do, but the probe is not selective: "no"."""
    res, _ = run(ep, targets, "reward_decoy", 1)
    st = states(res)
    assert st["against the input"] == "yes" and st["selective probe"] == "no"
    assert res["conclusion"] == "no"
    early, _ = run(ep, targets, "reward_decoy", 0)  # layer 0: its reward direction is what moves the actions
    assert early["conclusion"] == "no" and early["effects"]["kl"]["minus_input_explained"]["ci"][1] < 0


def test_hooks_removed_and_modes_restored_also_on_error(ep, targets):
    model = KnownModel(token_format(ep), "q_reader")
    model.train()
    res = C.causal_episodes(model, ep, token_format(ep), targets, layer=0, n_boot=20, draws=2, steer_steps=1)
    assert len(res["steering"]["points"]) == 4  # the default scales: the steering passes ran too
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
    res = C.causal_episodes(model, ep, token_format(ep), targets, layer=0, n_boot=100, draws=2, random_model=model,
                            steer=())
    assert res["steering"] is None and res["closed_loop"] is None  # none asked for
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
                            draws=2, steer=())
    assert res["conclusion"] == "inconclusive" and "changes the action distribution" in res["reason"]
    assert res["effects"]["kl"]["random"]["mean"] == 0.0  # exact: every edited logit is the base one


def test_steered_steps_repeat_the_state_and_are_edited_and_read_at_their_own_read_position():
    """`steer_steps` draws only repeat-state steps (o_t = o_{t-1}, both valid, t >= 1), -1 where a history has none;
    `steered` edits exactly one position per history and copy, the read position of that step (windows of an
    ad-step format with a stride, so a step's position is not its index), and reads the change there (kills an
    edit or a read one step off, a dropped repeat-state condition)."""
    from icrl_interp.models.episode_tokens import encode, format_for

    rng = np.random.default_rng(4)
    H, T = 6, 13
    obs = rng.integers(0, 2, (H, T))
    obs[5] = np.arange(T) % 2  # never repeats
    valid = np.ones((H, T), bool)
    valid[0, 9:] = False
    z = np.zeros((H, T), np.int64)
    ep = Episodes(observations=obs, actions=rng.integers(0, 2, (H, T)), rewards=np.zeros((H, T)),
                  next_observations=obs, terminations=np.zeros((H, T), bool), truncations=np.zeros((H, T), bool),
                  valid=valid, n_actions=2, n_observations=2)
    steps = C.steer_steps(ep, 5, seed=1)
    np.testing.assert_array_equal(steps, C.steer_steps(ep, 5, seed=1))  # a pure function of the seed
    assert (steps[5] == -1).all() and (steps[:5] >= 1).all()
    h = np.repeat(np.arange(5), 5)
    t = steps[:5].ravel()
    assert (obs[h, t] == obs[h, t - 1]).all() and valid[h, t].all() and valid[h, t - 1].all()
    fmt = format_for(ep, "ad-step", 5, 2)
    tokens, pmap = encode(ep, fmt)
    at = C.read_mask(pmap)
    seen = []

    def run(edit_at):  # a fake model: the edit adds 1 to action 0's logit at the edited read positions only
        assert (edit_at & ~at).sum() == 0 and edit_at.sum() == 5  # one read position per history with steps
        seen.append(edit_at)
        logits = np.zeros((at.sum(), 2))
        logits[edit_at[at], 0] = 1.0
        return logits

    previous = np.zeros((H, T), np.int64)
    got = C.steered(run, pmap, np.zeros((H, T, 2)), steps, previous, torch.float64)
    want = 1 / (1 + np.exp(-1.0)) - 0.5  # pi_edit(0) - pi(0), every steered step
    np.testing.assert_allclose(got["dp_previous"], want, rtol=1e-12)
    kl = 0.5 * np.log(0.5 / (1 / (1 + np.exp(-1.0)))) + 0.5 * np.log(0.5 / (1 / (1 + np.exp(1.0))))
    np.testing.assert_allclose(got["kl"], kl, rtol=1e-12)
    for k, edit_at in enumerate(seen):  # the edited position is the read position of steps[h, k]
        marked = np.zeros((H, T), bool)
        marked[pmap.read_history, pmap.read_step] = edit_at[pmap.read_seq, pmap.read_pos]
        np.testing.assert_array_equal(np.argwhere(marked), np.c_[np.arange(5), steps[:5, k]])
