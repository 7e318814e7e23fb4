"""Prompt layouts (named row blocks) and the batched prompt builders."""
from __future__ import annotations

import json

import numpy as np
import pytest

from icrl_interp import layouts
from icrl_interp.layouts import PromptLayout

from helpers import boyan, mdps, plain, raises_user, random_policy, td_data

# The documented block tables (constructions.md sections 1-3), for d = 3 and m = 2.
EXPECTED = {
    "linear-td": {"phi": [0, 3], "gamma_phi_next": [3, 6], "reward": [6, 7]},
    "softmax-td": {"x": [0, 3], "reward": [3, 4], "target_mem": [4, 5], "current_mem": [5, 6]},
    "sarsa": {"phi": [0, 3], "gamma_phi_next": [3, 6], "reward": [6, 7], "param_one": [7, 8], "w": [8, 11]},
    "actor-critic": {"phi": [0, 3], "gamma_phi_next": [3, 6], "reward": [6, 7], "score": [7, 9],
                     "param_one": [9, 10], "w": [10, 13], "lam": [13, 15]},
}


@pytest.mark.parametrize("family", layouts.FAMILIES)
def test_layout_blocks_match_the_documented_tables(family):
    lay = layouts.layout_for(family, 3, m=2)
    assert lay.family == family
    assert lay.to_dict()["blocks"] == EXPECTED[family]
    assert lay.names == list(EXPECTED[family])
    for name, (a, b) in EXPECTED[family].items():
        assert lay.slice(name) == slice(a, b) and lay.size(name) == b - a


@pytest.mark.parametrize("d", [1, 2, 5])
def test_d_model_formulas(d):
    assert layouts.td_layout(d).d_model == 2 * d + 1
    assert layouts.softmax_layout(d).d_model == d + 3
    assert layouts.sarsa_layout(d).d_model == 3 * d + 2
    assert layouts.actor_critic_layout(d, 4).d_model == 3 * d + 2 * 4 + 2


def test_readout_blocks_and_signs():
    assert (layouts.td_layout(2).readout_block, layouts.td_layout(2).readout_sign) == ("reward", -1)
    assert (layouts.softmax_layout(2).readout_block, layouts.softmax_layout(2).readout_sign) == ("current_mem", 1)
    assert (layouts.sarsa_layout(2).readout_block, layouts.sarsa_layout(2).readout_sign) == ("w", 1)
    z = np.arange(2 * 3 * 5, dtype=float).reshape(2, 3, 5)  # td layout, d = 2: reward row is 4
    np.testing.assert_array_equal(layouts.td_layout(2).readout(z), -z[:, -1, 4:5])
    torch = pytest.importorskip("torch")
    zt = torch.arange(2 * 3 * 11, dtype=torch.float64).reshape(2, 3, 11)  # sarsa, d = 3: w = rows 8..10
    assert torch.equal(layouts.sarsa_layout(3).readout(zt), zt[:, -1, 8:11])


@pytest.mark.parametrize("family", layouts.FAMILIES)
def test_layout_json_round_trip(family):
    lay = layouts.layout_for(family, 4, m=3)
    text = lay.to_json()
    assert json.loads(text) == lay.to_dict()
    again = PromptLayout.from_dict(json.loads(text))
    assert again == lay and hash(again) == hash(lay)


def test_layout_validation():
    with raises_user("contiguous", "'b'"):
        PromptLayout("x", (("a", 0, 2), ("b", 3, 4)), "a")
    with raises_user("contiguous", "'a'"):
        PromptLayout("x", (("a", 0, 0),), "a")
    with raises_user("readout block", "'c'"):
        PromptLayout("x", (("a", 0, 2),), "c")
    with raises_user("duplicate", "'a'"):
        PromptLayout("x", (("a", 0, 2), ("a", 2, 3)), "a")
    with raises_user("readout_sign"):
        PromptLayout("x", (("a", 0, 2),), "a", readout_sign=2)
    with raises_user("no block", "'target_mem'", "phi"):
        layouts.td_layout(2).slice("target_mem")
    with raises_user("unknown family", "'transformer'"):
        layouts.layout_for("transformer", 2)
    with raises_user("actor-critic", "m"):
        layouts.layout_for("actor-critic", 2)
    good = layouts.td_layout(2).to_dict()
    for bad in ({}, {**good, "blocks": [[0, 2]]}, {**good, "blocks": {"phi": 3}},
                {**good, "blocks": {"phi": ["zero", 2]}}, {**good, "readout_sign": "minus"}, "not a dict"):
        with raises_user("layout"):
            plain(PromptLayout.from_dict)(bad)


# ------------------------------------------------------------------ builders
def test_td_prompt_puts_every_quantity_in_its_block():
    phi, phi_next, r, phi_q = td_data(batch=3, n=5, d=2)
    states = np.arange(3 * 6).reshape(3, 6)
    p = layouts.td_prompt(phi, phi_next, r, phi_q, 0.8, states)
    lay = p.layout
    assert p.z.shape == (3, 6, 5) and p.n == 5
    np.testing.assert_array_equal(p.z[:, :5, lay.slice("phi")], phi)
    np.testing.assert_allclose(p.z[:, :5, lay.slice("gamma_phi_next")], 0.8 * phi_next, rtol=0, atol=0)
    np.testing.assert_array_equal(p.z[:, :5, lay.slice("reward")][..., 0], r)
    np.testing.assert_array_equal(p.z[:, 5, lay.slice("phi")], phi_q)
    assert np.all(p.z[:, 5, 2:] == 0)  # query column: gamma phi' and reward are zero
    np.testing.assert_array_equal(p.rewards[:, :5], r)
    assert np.all(p.rewards[:, 5] == 0)
    np.testing.assert_array_equal(p.states, states)
    assert np.all(p.actions == -1)
    assert set(p.labels()) == {"state", "action", "reward"}


def test_td_prompt_from_mrp_labels_and_columns():
    mrp = boyan(batch=4, n_states=6, d=3, gamma=0.7)
    traj = mrp.sample(9, rng=1)
    q = np.array([0, 5, 2, 3])
    p = layouts.td_prompt_from_mrp(mrp, traj, q)
    lay = p.layout
    for b in range(4):
        for i in range(9):
            s, s1 = traj.states[b, i], traj.states[b, i + 1]
            col = p.z[b, i]
            np.testing.assert_array_equal(col[lay.slice("phi")], mrp.phi[b, s])
            np.testing.assert_allclose(col[lay.slice("gamma_phi_next")], 0.7 * mrp.phi[b, s1], atol=1e-15)
            assert col[lay.slice("reward")][0] == mrp.r[b, s] == p.rewards[b, i]
            assert p.states[b, i] == s
        np.testing.assert_array_equal(p.z[b, 9, lay.slice("phi")], mrp.phi[b, q[b]])
        assert p.states[b, 9] == q[b]


def test_softmax_prompt_from_mrp_labels_and_columns():
    mrp = boyan(batch=3, n_states=5, d=2)
    traj = mrp.sample(7, rng=2)
    p = layouts.softmax_prompt_from_mrp(mrp, traj)
    lay = p.layout
    assert p.z.shape == (3, 8, 5)
    for b in range(3):
        for k in range(8):  # 0-based column k holds x(S_k), and R_{k+1} = r(S_k) for k < n
            s = traj.states[b, k]
            np.testing.assert_array_equal(p.z[b, k, lay.slice("x")], mrp.phi[b, s])
            reward = mrp.r[b, s] if k < 7 else 0.0
            assert p.z[b, k, lay.slice("reward")][0] == reward == p.rewards[b, k]
            assert p.states[b, k] == s
    assert np.all(p.z[:, :, lay.slice("target_mem")] == 0) and np.all(p.z[:, :, lay.slice("current_mem")] == 0)


def test_sarsa_prompt_from_mdp_labels_and_columns():
    mdp = mdps(batch=3, n_states=4, n_actions=2, gamma=0.6)
    traj = mdp.sample(random_policy(mdp), 6, rng=3)
    w = np.random.default_rng(0).standard_normal((3, 8))
    p = layouts.sarsa_prompt_from_mdp(mdp, traj, w)
    lay = p.layout
    assert p.z.shape == (3, 7, 3 * 8 + 2)
    eye = np.eye(8)
    for b in range(3):
        for i in range(6):
            s, a = traj.states[b, i], traj.actions[b, i]
            s1, a1 = traj.states[b, i + 1], traj.actions[b, i + 1]
            col = p.z[b, i]
            np.testing.assert_array_equal(col[lay.slice("phi")], eye[s * 2 + a])
            np.testing.assert_allclose(col[lay.slice("gamma_phi_next")], 0.6 * eye[s1 * 2 + a1], atol=1e-15)
            assert col[lay.slice("reward")][0] == mdp.R[b, s, a] == p.rewards[b, i]
            assert col[lay.slice("param_one")][0] == 0 and np.all(col[lay.slice("w")] == 0)
            assert (p.states[b, i], p.actions[b, i]) == (s, a)
        last = p.z[b, 6]
        assert np.all(last[: 2 * 8 + 1] == 0) and last[lay.slice("param_one")][0] == 1.0
        np.testing.assert_array_equal(last[lay.slice("w")], w[b])
        assert (p.states[b, 6], p.actions[b, 6], p.rewards[b, 6]) == (-1, -1, 0)


def test_builders_validate_their_inputs():
    phi, phi_next, r, phi_q = td_data(batch=2, n=4, d=3)
    td = plain(layouts.td_prompt)
    with raises_user("phi_next", "shape"):
        td(phi, phi_next[:, :3], r, phi_q, 0.9)
    with raises_user("rewards", "shape"):
        td(phi, phi_next, r[:, :3], phi_q, 0.9)
    with raises_user("phi_query", "shape"):
        td(phi, phi_next, r, phi_q[:, :2], 0.9)
    with raises_user("gamma"):
        td(phi, phi_next, r, phi_q, 1.0)
    with raises_user("phi", "NaN"):
        td(np.where(phi > 1, np.nan, phi), phi_next, r, phi_q, 0.9)
    with raises_user("rewards", "NaN"):
        td(phi, phi_next, np.full_like(r, np.inf), phi_q, 0.9)
    with raises_user("states", "shape"):
        td(phi, phi_next, r, phi_q, 0.9, np.zeros((2, 4), dtype=int))
    soft = plain(layouts.softmax_prompt)
    with raises_user("rewards", "shape"):
        soft(np.zeros((2, 5, 3)), np.zeros((2, 5)))
    with raises_user("x", "NaN"):
        soft(np.full((2, 5, 3), np.nan), np.zeros((2, 4)))
    sarsa = plain(layouts.sarsa_prompt)
    with raises_user("w", "shape"):
        sarsa(phi, phi_next, r, np.zeros((2, 2)), 0.5)
    with raises_user("w", "NaN"):
        sarsa(phi, phi_next, r, np.full((2, 3), np.nan), 0.5)
    with raises_user("gamma"):
        sarsa(phi, phi_next, r, np.zeros((2, 3)), -0.5)
    with raises_user("actions", "shape"):
        sarsa(phi, phi_next, r, np.zeros((2, 3)), 0.5, None, np.zeros((2, 3), dtype=int))
