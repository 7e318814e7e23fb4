"""Prompt layouts (named row blocks) and the batched prompt builders."""
from __future__ import annotations

import json

import numpy as np
import pytest

from icrl_interp import layout_for
from icrl_interp.tasks import layouts
from icrl_interp.families import registry
from icrl_interp.tasks.layouts import PromptLayout
from icrl_interp.families import linear_td, softmax_td, sarsa, actor_critic

from helpers import boyan, mdps, plain, raises_user, random_policy, td_data

# The documented block tables (docs/concepts.md, sections Families at a glance and Actor-critic),
# for d = 3 and m = 2.
EXPECTED = {
    "linear-td": {"phi": [0, 3], "gamma_phi_next": [3, 6], "reward": [6, 7]},
    "softmax-td": {"x": [0, 3], "reward": [3, 4], "target_mem": [4, 5], "current_mem": [5, 6]},
    "sarsa": {"phi": [0, 3], "gamma_phi_next": [3, 6], "reward": [6, 7], "param_one": [7, 8], "w": [8, 11]},
    "actor-critic": {"phi": [0, 3], "gamma_phi_next": [3, 6], "reward": [6, 7], "score": [7, 9],
                     "param_one": [9, 10], "w": [10, 13], "lam": [13, 15]},
}


@pytest.mark.parametrize("family", registry.names())
def test_layout_blocks_match_the_documented_tables(family):
    lay = layout_for(family, 3, m=2)
    assert lay.family == family
    assert lay.to_dict()["blocks"] == EXPECTED[family]
    assert lay.names == list(EXPECTED[family])
    for name, (a, b) in EXPECTED[family].items():
        assert lay.slice(name) == slice(a, b) and lay.size(name) == b - a


@pytest.mark.parametrize("d", [1, 2, 5])
def test_d_model_formulas(d):
    assert linear_td.layout(d).d_model == 2 * d + 1
    assert softmax_td.layout(d).d_model == d + 3
    assert sarsa.layout(d).d_model == 3 * d + 2
    assert actor_critic.layout(d, 4).d_model == 3 * d + 2 * 4 + 2


def test_readout_blocks_and_signs():
    assert (linear_td.layout(2).readout_block, linear_td.layout(2).readout_sign) == ("reward", -1)
    assert (softmax_td.layout(2).readout_block, softmax_td.layout(2).readout_sign) == ("current_mem", 1)
    assert (sarsa.layout(2).readout_block, sarsa.layout(2).readout_sign) == ("w", 1)
    z = np.arange(2 * 3 * 5, dtype=float).reshape(2, 3, 5)  # td layout, d = 2: reward row is 4
    np.testing.assert_array_equal(linear_td.layout(2).readout(z), -z[:, -1, 4:5])  # exact: a negated copy
    torch = pytest.importorskip("torch")
    zt = torch.arange(2 * 3 * 11, dtype=torch.float64).reshape(2, 3, 11)  # sarsa, d = 3: w = rows 8..10
    assert torch.equal(sarsa.layout(3).readout(zt), zt[:, -1, 8:11])  # exact: a copy


@pytest.mark.parametrize("family", registry.names())
def test_layout_json_round_trip(family):
    lay = layout_for(family, 4, m=3)
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
        linear_td.layout(2).slice("target_mem")
    with raises_user("unknown family", "'transformer'"):
        layout_for("transformer", 2)
    with raises_user("actor-critic", "m"):
        layout_for("actor-critic", 2)
    good = linear_td.layout(2).to_dict()
    for bad in ({}, {**good, "blocks": [[0, 2]]}, {**good, "blocks": {"phi": 3}},
                {**good, "blocks": {"phi": ["zero", 2]}}, {**good, "readout_sign": "minus"}, "not a dict"):
        with raises_user("layout"):
            plain(PromptLayout.from_dict)(bad)
