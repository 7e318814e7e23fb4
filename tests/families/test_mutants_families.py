"""Family known answers that a mutation sweep found missing (or only caught indirectly): the sampler
honours the checkpoint's context length, the actor-critic critic step is looked up in the documented
order, theta* carries the checkpoint's step alpha (per layer when untied), and every layout has the
row order of docs (shared/docs/constructions.md). Expected values are written out by hand.
"""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.models import checkpoint
from icrl_interp.families import registry
from icrl_interp.families import actor_critic, linear_td, sarsa, softmax_td
from icrl_interp.tasks.layouts import PromptLayout, build_layout
from icrl_interp.models import ModelConfig

ALPHA = 0.37

MODELS = {
    "linear-td": dict(model=ModelConfig("linear-td", 2, n_layers=2, gamma=0.9, alpha=ALPHA, dtype="float64"),
                      task={"kind": "boyan", "n_states": 5, "features": "random"}),
    "softmax-td": dict(model=ModelConfig("softmax-td", 3, n_layers=2, gamma=0.9, alpha=ALPHA, form="tsm",
                                         dtype="float64"),
                       task={"kind": "boyan", "n_states": 3, "features": "onehot"}),
    "sarsa": dict(model=ModelConfig("sarsa", 6, gamma=0.5, alpha=ALPHA, dtype="float64"),
                  task={"kind": "mdp", "n_states": 3, "n_actions": 2}),
    "actor-critic": dict(model=ModelConfig("actor-critic", 6, m=6, gamma=0.5, alpha=ALPHA, dtype="float64"),
                         task={"kind": "mdp", "n_states": 3, "n_actions": 2}),
}


def _config(family: str, n: int = 30, origin: dict | None = None, training: dict | None = None, **model):
    spec = MODELS[family]
    m = ModelConfig(**{**_fields(spec["model"]), **model})
    extras = {"task": {**spec["task"], "n": n}, "origin": origin or {"kind": "theta_star"}}
    if training is not None:
        extras["training"] = training
    return checkpoint.make_config(m, extras)


def _fields(model: ModelConfig) -> dict:
    return {k: getattr(model, k) for k in ModelConfig.field_names()}


# ------------------------------------------------------------ the sampler's context length
@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("n", [7, 13])
def test_sampler_uses_the_checkpoints_context_length(family, n):
    cfg = _config(family, n=n)
    assert cfg.task.n == n
    for pb in (cfg.sample(3, 0), registry.get(family).sample(cfg, cfg.task, 3, np.random.default_rng(0))):
        D = cfg.model.layout.d_model
        assert pb.prompt.z.shape == (3, n + 1, D)  # n context columns + the query / parameter column
        assert pb.prompt.states.shape == (3, n + 1) and pb.prompt.rewards.shape == (3, n + 1)
        assert pb.reference["td_errors"].shape[-1] == n  # one TD error per context column
        assert np.all(pb.prompt.states[:, :n] >= 0)  # every context column holds a labelled state
        np.testing.assert_array_equal(pb.prompt.rewards[:, n], 0.0)  # the last column carries no reward (a literal 0)


# ------------------------------------------------------------ actor-critic critic step (beta)
@pytest.mark.parametrize("origin,training,beta", [
    ({"kind": "theta_star", "critic_step": 0.3}, {"critic_step": 0.7}, 0.3),  # origin.critic_step first
    ({"kind": "trained"}, {"critic_step": 0.7}, 0.7),  # then training.critic_step
    ({"kind": "trained", "critic_step": None}, {"critic_step": 0.7}, 0.7),  # a null origin value is none
    ({"kind": "trained"}, {"lr": 1e-3}, ALPHA),  # else the actor step alpha
    ({"kind": "trained"}, None, ALPHA),
])
def test_actor_critic_critic_step_lookup_order(origin, training, beta):
    cfg = _config("actor-critic", origin=origin, training=training)
    assert actor_critic.read_constants(cfg)["critic_step"] == beta
    assert cfg.constants["critic_step"] == beta
    assert actor_critic.control(cfg).beta == beta and actor_critic.control(cfg).alpha == ALPHA
    lay = cfg.model.layout
    V = cfg.theta_star()["blocks.0.attn.V"]
    # exact: theta* is written entry by entry, a step times 0 or 1
    np.testing.assert_array_equal(V[lay.slice("w"), lay.slice("phi")], beta * np.eye(6))  # critic step
    np.testing.assert_array_equal(V[lay.slice("lam"), lay.slice("score")], ALPHA * np.eye(6))  # actor step


# ------------------------------------------------------------ theta* carries alpha
# theta* is written entry by entry (alpha, beta or a scale times 0 or 1): array_equal is exact here
def test_theta_star_carries_the_step_alpha_linear_td():
    cfg = _config("linear-td")
    th = cfg.theta_star()
    P, Q = th["blocks.0.attn.P"], th["blocks.0.attn.Q"]
    want_P = np.zeros((5, 5))
    want_P[4, 4] = ALPHA  # P* = alpha e_{2d+1} e_{2d+1}^T
    want_Q = np.zeros((5, 5))
    want_Q[0:2, 0:2] = -np.eye(2)
    want_Q[0:2, 2:4] = np.eye(2)
    np.testing.assert_array_equal(P, want_P)
    np.testing.assert_array_equal(Q, want_Q)


def test_theta_star_carries_the_step_alpha_softmax_td():
    cfg = _config("softmax-td", origin={"kind": "theta_star", "score_scale": 4.0})
    V = cfg.theta_star()["blocks.0.attn.V"]
    want = np.zeros((6, 6))
    want[5, 3:6] = [ALPHA, ALPHA, -ALPHA]  # row d+2: alpha (R + target - current)
    np.testing.assert_array_equal(V, want)
    A = cfg.theta_star()["blocks.0.attn.A"]
    np.testing.assert_array_equal(A, np.diag([4.0, 4.0, 4.0, 0.0, 0.0, 0.0]))


def test_theta_star_carries_the_step_alpha_sarsa():
    cfg = _config("sarsa")
    th = cfg.theta_star()
    V = th["blocks.0.attn.V"]
    want = np.zeros((20, 20))
    want[14:20, 0:6] = ALPHA * np.eye(6)  # rows w, cols phi: alpha I
    np.testing.assert_array_equal(V, want)
    P = th["blocks.0.attn.P"]
    assert P[12, 13] == 1.0 and np.all(P[13:, :] == 0.0)  # reward row -> the '1' column; lazy rows 0


def test_untied_theta_star_takes_each_layers_alpha():
    alphas = [0.1, 0.25, 0.5]
    cfg = _config("linear-td", origin={"kind": "theta_star", "alphas": alphas}, n_layers=3, tied=False)
    th = cfg.theta_star()
    assert [th[f"blocks.{l}.attn.P"][4, 4] for l in range(3)] == alphas
    same = _config("linear-td", n_layers=3, tied=False).theta_star()
    assert [same[f"blocks.{l}.attn.P"][4, 4] for l in range(3)] == [ALPHA] * 3  # no alphas: model.alpha


# ------------------------------------------------------------ layout row order
LAYOUTS = {
    "linear-td": (linear_td.layout(3), {"phi": (0, 3), "gamma_phi_next": (3, 6), "reward": (6, 7)}, "reward", -1),
    "softmax-td": (softmax_td.layout(3), {"x": (0, 3), "reward": (3, 4), "target_mem": (4, 5), "current_mem": (5, 6)},
                   "current_mem", 1),
    "sarsa": (sarsa.layout(2), {"phi": (0, 2), "gamma_phi_next": (2, 4), "reward": (4, 5), "param_one": (5, 6),
                                "w": (6, 8)}, "w", 1),
    "actor-critic": (actor_critic.layout(2, 3), {"phi": (0, 2), "gamma_phi_next": (2, 4), "reward": (4, 5),
                                                 "score": (5, 8), "param_one": (8, 9), "w": (9, 11), "lam": (11, 14)},
                     "w", 1),
}


@pytest.mark.parametrize("family", list(LAYOUTS))
def test_layout_rows_are_in_the_documented_order(family):
    lay, rows, readout, sign = LAYOUTS[family]
    assert [(name, a, b) for name, a, b in lay.blocks] == [(k, a, b) for k, (a, b) in rows.items()]
    assert {k: (lay.slice(k).start, lay.slice(k).stop) for k in rows} == rows
    assert lay.d_model == max(b for _, b in rows.values())
    assert (lay.readout_block, lay.readout_sign) == (readout, sign)
    # a layout read back from JSON whose keys come in another order is the same layout
    d = lay.to_dict()
    d["blocks"] = dict(reversed(list(d["blocks"].items())))
    assert PromptLayout.from_dict(d) == lay


def test_build_layout_stacks_blocks_in_the_given_order():
    lay = build_layout("sarsa", [("b", 2), ("a", 1), ("c", 3)], "c")
    assert lay.blocks == (("b", 0, 2), ("a", 2, 3), ("c", 3, 6))
    assert lay.slice("a") == slice(2, 3) and lay.d_model == 6


def test_prompt_values_sit_in_the_documented_rows():
    """A SARSA prompt: column i = [phi_i; gamma phi+_i; r_{i+1}; 0; 0], last column [0; 0; 0; 1; w]."""
    phi = np.array([[[1.0, 2.0]]])
    nxt = np.array([[[3.0, 4.0]]])
    z = sarsa.prompt(phi, nxt, np.array([[5.0]]), np.array([[6.0, 7.0]]), 0.5).z  # exact: copies and 0.5 * 3.0
    np.testing.assert_array_equal(z[0, 0], [1.0, 2.0, 1.5, 2.0, 5.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(z[0, 1], [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 6.0, 7.0])
