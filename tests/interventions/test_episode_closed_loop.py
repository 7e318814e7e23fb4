"""The closed-loop return under an edit (interventions/episode_causal.py, `closed_loop`, `causal_episodes(...,
closed_loop_histories=N)`) on models of KNOWN mechanism (tests/episode_models.py) acting on a two-armed bandit that
pays 0.9 on arm 1 and 0.1 on arm 0: the Q-reader learns arm 1 in context and, with its delta erased, acts uniformly
(its return drops); an edit nothing reads changes no action (the arms are paired by seed: the same tasks and the
same uniforms, so equal policies give equal histories); in every token format the edit touches exactly the read
positions of each forward pass, the site the recorded erasure edits (a causal model that reads every position gives
the same edited logits in closed loop as on the encoded finished history); hooks never outlive the loop, the model's
modes come back; a file whose environment cannot be re-made is refused in one line before any work."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from episode_models import ALPHA, BETA, GAMMA, Block, KnownModel, bandit_episodes, token_format
from torch import nn

from icrl_interp.analyzers import episode_probes
from icrl_interp.core.errors import UserError
from icrl_interp.interventions import episode_causal as C
from icrl_interp.interventions.edits import Edit, projection_edit
from icrl_interp.models.closed_loop import ModelPolicy
from icrl_interp.models.episode_tokens import TokenFormat, encode
from icrl_interp.recording.capture import attached_hook_count, intervene
from icrl_interp.tasks.collect import collect
from icrl_interp.tasks.episodes import Episodes

ENV, KW = "icrl_interp/Bandit-v0", {"arms": 2, "probs": [0.1, 0.9]}
T = 20


@pytest.fixture(scope="module")
def ep():
    return collect(ENV, "q-learning", histories=48, steps=T, seed=0, env_kwargs=KW, alpha=ALPHA, gamma=GAMMA, beta=BETA)


def loop(model, arms, histories=16, seed=0):
    return C.closed_loop(model, token_format(ep_like()), "blocks.0.hook_resid_post", arms, env=ENV, env_kwargs=KW,
                         seed=seed, histories=list(range(100, 100 + histories)), steps=T)


def ep_like():
    return bandit_episodes(1, T, 2)  # only its spaces and length: the format of the models here


def test_erasing_the_q_readers_delta_in_closed_loop_costs_return_and_pairs_by_seed():
    """Kills: arms run with different seeds (an unread edit, or the same arm twice, would then change the
    histories), the edit not attached while the policy acts (the erased arm would learn), the hook left attached,
    the modes not restored."""
    model = KnownModel(token_format(ep_like()), "q_reader")
    model.train()
    u_delta, u_noise = model.u_delta.double().numpy(), model.U_noise[:, 0].double().numpy()
    got = loop(model, {"unedited": [None], "again": [None], "erased": [projection_edit(u_delta, 0.0)],
                       "unread": [projection_edit(u_noise, 0.0)]})
    assert attached_hook_count(model) == 0 and model.training and model.blocks[0].training
    assert model.seen_training and not any(model.seen_training)  # it acted in eval mode
    for arm in ("again", "unread"):  # the same policy on the same seeds: the same histories (exact)
        for k in got["unedited"]:
            np.testing.assert_array_equal(got[arm][k], got["unedited"][k])
    # step 0 reads no delta (no previous action): the first episode is the same in every arm (exact)
    np.testing.assert_array_equal(got["erased"]["first_episode"], got["unedited"]["first_episode"])
    assert got["unedited"]["last_quarter"].mean() > 0.75  # it learned arm 1 in context
    drop = got["erased"]["last_quarter"] - got["unedited"]["last_quarter"]
    assert drop.mean() < -0.15 and got["erased"]["last_quarter"].mean() == pytest.approx(0.5, abs=0.15)  # uniform


def test_the_edit_hook_is_removed_when_the_model_raises_in_closed_loop():
    class Boom(KnownModel):
        def forward(self, tokens):
            if self.calls >= T + 3:  # the unedited arm runs through; the edited one raises mid-loop
                raise RuntimeError("boom")
            return super().forward(tokens)

    model = Boom(token_format(ep_like()), "q_reader")
    model.train()
    with pytest.raises(UserError, match="boom"):  # a user model's exception is one line (ModelPolicy)
        loop(model, {"unedited": [None], "erased": [projection_edit(model.u_delta.double().numpy(), 0.0)]}, 4)
    assert attached_hook_count(model) == 0 and model.training


def test_history_returns_by_hand():
    """Two histories of 8 steps: episodes end at the marked steps; the last quarter of a history's own episodes."""
    done = np.zeros((2, 8), bool)
    done[0, [1, 3, 5, 7]] = True  # history 0: 4 episodes of 2 steps -> last quarter = the last episode
    done[1, [0, 1, 2, 3, 4, 5, 6, 7]] = True  # history 1: 8 one-step episodes -> the last 2
    r = np.array([[0, 1, 0, 0, 1, 1, 0, 2], [1, 0, 0, 0, 0, 0, 3, 1]], float)
    z = np.zeros((2, 8), np.int64)
    eps = Episodes(observations=z, actions=z, rewards=r, next_observations=z, terminations=done,
                   truncations=np.zeros((2, 8), bool), valid=np.ones((2, 8), bool), n_actions=2, n_observations=1)
    got = C.history_returns(eps)
    np.testing.assert_array_equal(got["first_episode"], [1.0, 1.0])  # exact: sums of small integers
    np.testing.assert_array_equal(got["last_quarter"], [2.0, 2.0])
    np.testing.assert_array_equal(got["improvement"], [1.0, 1.0])


def test_refused_in_one_line_before_any_work(ep):
    """A file whose environment cannot be re-made (built by hand, a Minari file): refused before the model runs
    once (kills a check made after the erasure test)."""
    targets = episode_probes.replay_targets(ep, "q_learning", alpha=ALPHA, gamma=GAMMA, beta=BETA)
    fmt = token_format(ep)
    for meta, words in (({"source": "minari", "dataset_id": "x"}, "source minari) has none to re-make"),
                        ({}, "source unknown) has none to re-make")):
        model = KnownModel(fmt, "q_reader")
        other = Episodes(**{k: getattr(ep, k) for k in ("observations", "actions", "rewards", "next_observations",
                                                         "terminations", "truncations", "valid")},
                         n_actions=2, n_observations=1, meta=meta)
        with pytest.raises(UserError, match=re.escape(words)):
            C.causal_episodes(model, other, fmt, targets, layer=0, closed_loop_histories=2)
        assert model.calls == 0
    model = KnownModel(fmt, "q_reader")
    with pytest.raises(UserError, match="closed-loop-histories must be an integer >= 0"):
        C.causal_episodes(model, ep, fmt, targets, layer=0, closed_loop_histories=-1)


def test_causal_episodes_reports_the_closed_loop_on_fresh_histories(ep):
    """The wiring of `closed_loop` into the causal test: fresh history indices after the file's, the file's seed,
    environment and length, one random arm over every draw, the paired differences of the arms' per-history values
    (the difference of the means; the step 0 of a bandit reads no delta, so its first episode is the same in the
    unedited and the selective arm)."""
    targets = episode_probes.replay_targets(ep, "q_learning", alpha=ALPHA, gamma=GAMMA, beta=BETA)
    model = KnownModel(token_format(ep), "q_reader")
    res = C.causal_episodes(model, ep, token_format(ep), targets, layer=0, n_boot=50, draws=2, steer=(),
                            closed_loop_histories=4)
    cl = res["closed_loop"]
    assert (cl["env"], cl["env_kwargs"], cl["seed"], cl["steps"]) == (ENV, KW, 0, T)
    assert cl["histories"] == [48, 52] and cl["random_draws"] == 2
    assert set(cl["arms"]) == {"unedited", "selective", "random"}
    assert cl["selective_minus_unedited"]["first_episode"] == {"mean": 0.0, "ci": [0.0, 0.0]}  # exact (see above)
    for x, y in (("selective", "unedited"), ("random", "unedited"), ("selective", "random")):
        for k in ("last_quarter", "improvement"):
            d = cl[f"{x}_minus_{y}"][k]
            assert d["mean"] == pytest.approx(cl["arms"][x][k]["mean"] - cl["arms"][y][k]["mean"], abs=1e-12)
            assert d["ci"][0] <= d["mean"] <= d["ci"][1]
    assert attached_hook_count(model) == 0


POINT, K = "blocks.0.hook_resid_post", 6


class Mixer(nn.Module):
    """A causal model over the tokens of any format: the stream x = [token, 0] (a last column nothing reads) at
    `blocks.0.hook_resid_post`; logits at p = sum_{q <= p} tanh(x_q W1) W2, so every position up to p is read and
    an edit of any of them moves p's logits. Records per forward pass the stream before and after the hook and the
    logits."""

    def __init__(self, fmt: TokenFormat):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        w1 = torch.randn(fmt.d_token + 1, 8, generator=g)
        w1[-1] = 0.0  # the last column is not read
        self.W1, self.W2 = nn.Parameter(w1), nn.Parameter(torch.randn(8, fmt.n_actions, generator=g))
        self.blocks = nn.ModuleList([Block()])
        self.seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def forward(self, tokens):
        x = torch.cat([tokens, torch.zeros_like(tokens[..., :1])], -1)
        y = self.blocks[0].hook_resid_post(x)
        logits = torch.cumsum(torch.tanh(y @ self.W1), 1) @ self.W2
        self.seen.append((x.detach().clone(), y.detach().clone(), logits.detach().clone()))
        return logits


def read_positions_by_hand(fmt: TokenFormat, x: torch.Tensor) -> np.ndarray:
    """[P] the read positions of one closed-loop forward, from the tokens themselves (not from position
    arithmetic): every step token (ad-step), the observation tokens (ad-element: type column o), the last (dpt)."""
    P = x.shape[1]
    if fmt.name == "ad-step":
        return np.ones(P, bool)
    if fmt.name == "ad-element":
        return (x[0, :, fmt.columns["type"].start] == 1).numpy()
    return np.arange(P) == P - 1


@pytest.mark.parametrize("name", ["ad-step", "ad-element", "dpt"])
def test_the_loop_edits_exactly_the_read_positions_and_an_unread_edit_changes_nothing(name):
    """A marker edit (+1 in the column nothing reads) shows where the edit landed in each of the T forward passes:
    exactly the read positions (kills: every position edited in ad-element or dpt, the last-but-one instead of
    the last, the query instead of the last transition in dpt); it changes no logit and no history, exactly
    (pairing by seed; kills arms run on different seeds); an edit of a read column does change the logits (the
    hook is attached while the policy acts)."""
    fmt = TokenFormat(name, 1, 2, K)
    model = Mixer(fmt)
    model.train()
    marker = Edit(v=np.eye(fmt.d_token + 1)[-1])
    read = Edit(v=3.0 * np.eye(fmt.d_token + 1)[0])
    got = C.closed_loop(model, fmt, POINT, {"unedited": [None], "marked": [marker], "read": [read]}, env=ENV,
                        env_kwargs=KW, seed=0, histories=[100, 101, 102], steps=K)
    assert attached_hook_count(model) == 0 and model.training
    assert len(model.seen) == 3 * K
    unedited, marked, edited = model.seen[:K], model.seen[K:2 * K], model.seen[2 * K:]
    for t, (x, y, logits) in enumerate(marked):
        hit = (y != x).any(-1).numpy()  # [n, P]: positions the edit changed
        want = read_positions_by_hand(fmt, x)
        np.testing.assert_array_equal(hit, np.broadcast_to(want, hit.shape), err_msg=f"{name} step {t}")
        assert want.sum() == (1 if name == "dpt" else t + 1)  # every step's read token is in view (T = K)
        np.testing.assert_array_equal(logits, unedited[t][2])  # exact: the marked column has weight 0
    for k in got["unedited"]:
        np.testing.assert_array_equal(got["marked"][k], got["unedited"][k])  # same policy, same seed: same histories
    assert not torch.equal(edited[0][2], unedited[0][2])  # step 0: the same input, the read edit moved the logits


@pytest.mark.parametrize("name", ["ad-step", "ad-element", "dpt"])
def test_the_loops_edited_logits_are_the_recorded_erasures(name):
    """With the whole history in view (T = K) and a causal model, the logits a model acts on at step t under the
    loop's edit equal the logits `run_model` reads at step t's read position of the encoded finished history under
    the recorded erasure's edit (at `read_mask`): the two edit the same site. Kills an edit at every position
    (ad-element: the action and reward tokens too; dpt: the query and the context), or at the last-but-one."""
    fmt = TokenFormat(name, 1, 2, K)
    model = Mixer(fmt)
    edit = projection_edit(np.linspace(-1.0, 1.0, fmt.d_token + 1), 0.7)
    with intervene(model, POINT, C.at_read_positions(edit, fmt)):
        eps = collect(ENV, ModelPolicy(model, fmt), histories=[100, 101, 102, 103], steps=K, seed=0, env_kwargs=KW)
    live = np.stack([logits[:, -1].double().numpy() for _, _, logits in model.seen], 1)  # [H, T, A] acted on
    tokens, pmap = encode(eps, fmt)
    rec = C.to_steps(pmap, C.run_model(model, tokens, POINT, C.read_mask(pmap), edit=edit)[0])
    plain = C.to_steps(pmap, C.run_model(model, tokens, POINT, C.read_mask(pmap))[0])
    tol = 64 * np.finfo(np.float32).eps * (1 + np.abs(live).max())  # float32 sums of <= 3K terms in another order
    np.testing.assert_allclose(rec, live, rtol=0, atol=tol)
    assert np.abs(rec - plain).max() > 100 * tol  # the erasure moves the logits: the comparison is not vacuous


def test_a_site_not_shaped_as_the_sequence_is_one_line():
    """The loop's edit needs [batch, positions, width] with an ad-element sequence's 3k + 1 positions."""
    fn = C.at_read_positions(Edit(v=np.ones(3)), TokenFormat("ad-element", 1, 2, K))
    for shape in ((2, 3), (2, 6, 3)):
        with pytest.raises(UserError, match="the edited site has shape"):
            fn(torch.zeros(shape))
    assert torch.equal(fn(torch.zeros(1, 4, 3))[0, :, 0], torch.tensor([1.0, 0.0, 0.0, 1.0]))  # exact: 0 + 1


@pytest.mark.slow
def test_closed_loop_return_effect_beyond_random_for_the_q_reader_only(ep):
    """At 32 fresh histories: erasing the Q-reader's selective delta direction lowers its last-quarter return and its
    in-context improvement more than erasing random directions of the same variance does; for the Q-carrier that
    does not read it, the difference's interval covers 0."""
    targets = episode_probes.replay_targets(ep, "q_learning", alpha=ALPHA, gamma=GAMMA, beta=BETA)
    res = C.causal_episodes(KnownModel(token_format(ep), "q_reader"), ep, token_format(ep), targets, layer=0,
                            n_boot=400, draws=4, steer=(), closed_loop_histories=32)
    cl = res["closed_loop"]
    assert cl["selective_minus_random"]["last_quarter"]["ci"][1] < 0
    assert cl["selective_minus_random"]["improvement"]["ci"][1] < 0
    assert cl["arms"]["unedited"]["improvement"]["ci"][0] > 0  # it does learn in context
    ignored = C.causal_episodes(KnownModel(token_format(ep), "q_ignored"), ep, token_format(ep), targets, layer=0,
                                n_boot=100, draws=4, steer=(), closed_loop_histories=32)["closed_loop"]
    for k in ("last_quarter", "improvement"):
        lo, hi = ignored["selective_minus_random"][k]["ci"]
        assert lo <= 0 <= hi and hi - lo < 0.2
