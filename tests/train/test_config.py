"""Training configs: defaults, overrides, JSON round trip, validation errors."""
import dataclasses
import json

import pytest

from icrl_interp.families import registry
from icrl_interp.core.cli_fields import field_docs
from icrl_interp.core.errors import UserError
from icrl_interp.train import TrainConfig, config_classes, config_for, config_from_dict, recipe, training_families

FAMILIES = ["linear-td", "softmax-td", "sarsa", "actor-critic"]


def test_every_family_with_a_recipe_has_its_config_class():
    assert training_families() == registry.where(lambda f: f.training is not None) == FAMILIES
    classes = config_classes()
    for family in FAMILIES:
        cls = classes[family]
        assert issubclass(cls, TrainConfig) and cls is recipe(family).config_class and cls().family == family
        # every field has a docstring: it is the `icrl-interp train FAMILY --help` text
        assert set(field_docs(cls)) == {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_through_json(family):
    cfg = config_for(family, steps=7, seed=3)
    again = config_from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.steps == 7 and again.family == family


def test_paper_defaults():
    wang = config_for("linear-td")
    assert (wang.d, wang.n_states, wang.n, wang.n_layers, wang.gamma, wang.windows, wang.trajectories_per_task) == (4, 10, 30, 3, 0.9, 64, 5)
    ll = config_for("sarsa")
    assert (ll.n_states, ll.n_actions, ll.gamma, ll.init_gain, ll.lazy_ablation) == (9, 4, 0.5, 0.1, False)


def test_lr_schedule_is_a_step_decay():
    cfg = config_for("sarsa", lr=1e-3, lr_decay=0.5, lr_decay_every=10)
    # exact: Python floats halved, with no kernel involved
    assert cfg.lr_at(0) == cfg.lr_at(9) == 1e-3
    assert cfg.lr_at(10) == 5e-4 and cfg.lr_at(25) == 2.5e-4


def test_strings_from_json_or_cli_are_coerced():
    cfg = config_from_dict({"family": "softmax-td", "steps": "12", "masks": "false", "lr": "0.5"})
    assert cfg.steps == 12 and cfg.masks is False and cfg.lr == 0.5


@pytest.mark.parametrize("family, kw, words", [
    ("linear-td", {"bogus": 1}, "unknown linear-td training option"),
    ("sarsa", {"windows": 3}, "unknown sarsa training option"),
    ("linear-td", {"steps": 0}, "steps must be a positive"),
    ("linear-td", {"steps": 1.5}, "steps must be an integer"),
    ("softmax-td", {"gamma": 1.0}, "gamma must lie in"),
    ("softmax-td", {"objective": "mse"}, "objective must be"),
    ("sarsa", {"lr_decay": 1.5}, "lr_decay must lie"),
    ("linear-td", {"dtype": "float16"}, "dtype must be"),
    ("sarsa", {"lazy_ablation": "maybe"}, "lazy_ablation must be true or false"),
])
def test_bad_options_raise_user_error(family, kw, words):
    with pytest.raises(UserError, match=words):
        config_for(family, **kw)


def test_unknown_family():
    with pytest.raises(UserError, match="unknown training family"):
        config_for("rnn")
    with pytest.raises(UserError, match="family"):
        config_from_dict({"steps": 3})
