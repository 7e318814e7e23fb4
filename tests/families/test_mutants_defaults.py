"""The construct defaults are the papers' settings that docs/formats.md lists, and the control rule of an
actor-critic checkpoint refuses features its policy cannot use (one-line mutants of the family homes)."""
from __future__ import annotations

import pytest

from icrl_interp.models import construct
from icrl_interp.core.errors import UserError
from icrl_interp.families import actor_critic, linear_td, sarsa, softmax_td  # noqa: F401  (their Construct defaults)
from icrl_interp.models.config import CheckpointConfig, ModelConfig
from icrl_interp.tasks.sampling import TaskSpec


@pytest.mark.parametrize("family, model, task", [
    ("linear-td", {"d": 4, "n_layers": 3, "gamma": 0.9}, {"kind": "boyan", "n": 30, "n_states": 10,
                                                         "features": "random"}),
    ("softmax-td", {"d": 5, "n_layers": 6, "gamma": 0.9}, {"kind": "boyan", "n": 40, "n_states": 5,
                                                          "features": "onehot"}),
    ("sarsa", {"d": 36, "n_layers": 1, "gamma": 0.5}, {"kind": "mdp", "n": 64, "n_states": 9, "n_actions": 4}),
    ("actor-critic", {"d": 36, "m": 36, "n_layers": 1, "gamma": 0.5}, {"kind": "mdp", "n": 64, "n_states": 9,
                                                                      "n_actions": 4}),
])
def test_construct_defaults_are_the_documented_settings(family, model, task):
    """docs/formats.md: linear-td d 4, n 30, L 3, gamma 0.9, Boyan(10 states, random features); softmax-td
    d = states = 5, one-hot, n 40, L 6, gamma 0.9; sarsa 9 states x 4 actions, d 36, n 64, L 1, gamma 0.5;
    actor-critic the same MDPs with d = m = 36."""
    plan = construct.options(family, {}).plan()
    assert {k: plan.model[k] for k in model} == model
    assert {k: plan.task[k] for k in task} == task
    assert plan.model["alpha"] == 1.0


def test_actor_critic_control_refuses_a_policy_of_another_width():
    def config(m):
        return CheckpointConfig(model=ModelConfig(family="actor-critic", d=6, m=m, n_layers=1, gamma=0.5, alpha=1.0),
                                task=TaskSpec.from_dict({"family": "actor-critic", "kind": "mdp", "n": 8,
                                                         "n_states": 3, "n_actions": 2}),
                                origin={"kind": "theta_star", "beta": 1.0})

    assert actor_critic.control(config(6)).n_states == 3
    with pytest.raises(UserError, match="d = m = n_states"):
        actor_critic.control(config(5))
