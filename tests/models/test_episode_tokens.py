"""The AD / DPT token formats: shapes, the position map round-trips every step, no token shows a causal
model the action it must predict, and each token holds what the docs say (a shifted action is caught)."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.core.errors import UserError
from icrl_interp.models import episode_tokens as et
from icrl_interp.tasks.episodes import Episodes

H, T, O, A = 3, 11, 4, 3


def episodes(seed=0, box=False) -> Episodes:
    rng = np.random.default_rng(seed)
    obs = rng.integers(0, O, (H, T))
    nxt = rng.integers(0, O, (H, T))
    truncations = np.zeros((H, T), bool)
    truncations[:, 3::4] = True  # episodes of 4 steps
    valid = np.ones((H, T), bool)
    valid[1, 8:] = False  # a shorter history, padded
    if box:
        obs, nxt = rng.standard_normal((H, T, 2)), rng.standard_normal((H, T, 2))
    return Episodes(obs, rng.integers(0, A, (H, T)), rng.random((H, T)), nxt, np.zeros((H, T), bool), truncations,
                    valid, A, None if box else O)


CASES = [("ad-step", None), ("ad-step", 2), ("ad-element", None), ("ad-element", 3), ("dpt", None)]


@pytest.mark.parametrize("name,stride", CASES)
def test_shapes_and_every_valid_step_read_once(name, stride):
    ep = episodes()
    fmt = et.format_for(ep, name, 4, stride)
    tokens, pmap = et.encode(ep, fmt)
    assert tokens.dtype == np.float32 and tokens.shape[1:] == (fmt.positions, fmt.d_token)
    assert pmap.history.shape == tokens.shape[:2] == pmap.element.shape
    # each valid step exactly once among the read positions, and nothing else
    pairs = sorted(zip(pmap.read_history.tolist(), pmap.read_step.tolist()))
    assert pairs == sorted(zip(*np.nonzero(ep.valid)))
    # padding is a zero token mapped to -1
    pad = pmap.history < 0
    assert np.all(tokens[pad] == 0) and np.all(pmap.step[pad] == -1) and np.all(pmap.element[pad] == et.PAD)


@pytest.mark.parametrize("name,stride", CASES)
def test_map_round_trips_steps(name, stride):
    """to_steps puts the value at each read position back at its (h, t); the map's per-position labels
    agree with the episodes' own episode index and step within the episode."""
    ep = episodes()
    tokens, pmap = et.encode(ep, et.format_for(ep, name, 4, stride))
    N, P = pmap.history.shape
    code = (np.arange(N)[:, None] * 1000 + np.arange(P)[None, :]).astype(float)  # which (sequence, position)
    back = pmap.to_steps(code)
    assert back.shape == (H, T) and np.all(np.isnan(back[~ep.valid]))
    seq, pos = (back[ep.valid] // 1000).astype(int), (back[ep.valid] % 1000).astype(int)
    h, t = np.nonzero(ep.valid)
    # the read position's own labels name the step it reads: AD at the step's token, DPT its query at 0
    label_pos = np.zeros_like(pos) if name == "dpt" else pos
    assert np.array_equal(pmap.history[seq, label_pos], h) and np.array_equal(pmap.step[seq, label_pos], t)
    on = pmap.history >= 0
    hh, tt = pmap.history[on], pmap.step[on]
    assert np.array_equal(pmap.episode[on], ep.episode_index[hh, tt])
    assert np.array_equal(pmap.episode_step[on], ep.episode_step[hh, tt])
    element = np.asarray(et.ELEMENTS)[pmap.element[seq, pos]]
    expected = {"ad-step": "step", "ad-element": "observation"}.get(name)
    if name == "dpt":  # the last context transition; the query itself at t = 0 (no context yet)
        expected = np.where(t == 0, "query", "transition")
    assert np.all(element == expected)


def test_ad_step_token_holds_previous_action_and_reward():
    """Token t = [one-hot o_t, one-hot a_{t-1}, r_{t-1}, new-episode flag], read back column by column
    against the episodes (kills an action shifted by one step either way, a reward taken from step t)."""
    ep = episodes()
    fmt = et.format_for(ep, "ad-step", 4, 2)
    tokens, pmap = et.encode(ep, fmt)
    c = fmt.columns
    on = pmap.history >= 0
    h, t = pmap.history[on], pmap.step[on]
    tok = tokens[on]
    assert np.array_equal(tok[:, c["obs"]].argmax(-1), ep.observations[h, t])
    later = t > 0
    assert np.array_equal(tok[later][:, c["prev_action"]].argmax(-1), ep.actions[h[later], t[later] - 1])
    # exact: float32 copies of float64 rewards
    assert np.array_equal(tok[later][:, c["prev_reward"].start], ep.rewards[h[later], t[later] - 1].astype(np.float32))
    assert np.all(tok[~later][:, c["prev_action"].start:c["prev_reward"].stop] == 0)
    assert np.array_equal(tok[:, c["new_episode"].start] == 1, ep.episode_step[h, t] == 0)


@pytest.mark.parametrize("name,stride", CASES)
def test_no_token_up_to_a_read_position_shows_its_action(name, stride):
    """Changing a_t changes no token at or before the position where a_t is predicted (the sequence a causal
    model sees there), and changes a later one (the format does carry it)."""
    ep = episodes()
    fmt = et.format_for(ep, name, 4, stride)
    tokens, pmap = et.encode(ep, fmt)
    for h, t in [(0, 0), (0, 5), (2, 9), (1, 3)]:
        actions = ep.actions.copy()
        actions[h, t] = (actions[h, t] + 1) % A
        changed, _ = et.encode(Episodes(ep.observations, actions, ep.rewards, ep.next_observations, ep.terminations,
                                        ep.truncations, ep.valid, A, O), fmt)
        m = np.flatnonzero((pmap.read_history == h) & (pmap.read_step == t))[0]
        seq, pos = pmap.read_seq[m], pmap.read_pos[m]
        assert np.array_equal(tokens[seq, : pos + 1], changed[seq, : pos + 1])
        if t + 1 < T:
            assert not np.array_equal(tokens, changed)


def test_dpt_context_is_the_past_transitions():
    ep = episodes()
    fmt = et.format_for(ep, "dpt", 4)
    tokens, pmap = et.encode(ep, fmt)
    c = fmt.columns
    seq = 2 * T + 7  # history 2, step 7: context = steps 3..6
    assert tokens[seq, 0, c["obs"]].argmax() == ep.observations[2, 7] and tokens[seq, 0, c["query"].start] == 1
    assert np.array_equal(pmap.step[seq], [7, 3, 4, 5, 6])
    ctx = tokens[seq, 1:]
    assert np.array_equal(ctx[:, c["action"]].argmax(-1), ep.actions[2, 3:7])
    assert np.array_equal(ctx[:, c["next_obs"]].argmax(-1), ep.next_observations[2, 3:7])
    assert np.all(ctx[:, c["query"].start] == 0) and np.all(ctx[:, c["present"].start] == 1)
    first = 2 * T + 1  # step 1: one transition, then padding
    assert pmap.read_pos[np.flatnonzero((pmap.read_history == 2) & (pmap.read_step == 1))[0]] == 1
    assert np.all(tokens[first, 2:] == 0)


def test_a_dpt_context_longer_than_the_histories_pads():
    """A dpt context longer than the histories (a model acting in a short run, a short file) encodes: the
    sequences of context T with zero tokens after them, read at the same positions (kills indexing the
    transitions past the history's end)."""
    ep = episodes()
    short, smap = et.encode(ep, et.format_for(ep, "dpt", T))
    long, lmap = et.encode(ep, et.format_for(ep, "dpt", T + 5))
    # exact: the same float32 values copied, zeros written
    assert np.array_equal(long[:, : 1 + T], short) and np.all(long[:, 1 + T:] == 0)
    assert np.array_equal(lmap.read_pos, smap.read_pos) and np.array_equal(lmap.read_seq, smap.read_seq)


def test_box_observations_are_copied():
    ep = episodes(box=True)
    fmt = et.format_for(ep, "ad-element", 4)
    tokens, pmap = et.encode(ep, fmt)
    on = (pmap.history >= 0) & (pmap.element == et.ELEMENTS.index("observation"))
    got = tokens[on][:, fmt.columns["obs"]]
    assert np.array_equal(got, ep.observations[pmap.history[on], pmap.step[on]])


def test_refusals():
    ep = episodes()
    with pytest.raises(UserError, match="token format must be one of"):
        et.TokenFormat("gpt", 4, 3, 4)
    with pytest.raises(UserError, match="stride"):
        et.TokenFormat("ad-step", 4, 3, 4, stride=5)
    with pytest.raises(UserError, match="expects 5"):
        et.encode(ep, et.TokenFormat("ad-step", 5, 3, 4))
