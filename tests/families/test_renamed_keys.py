"""One name per meaning inside a checkpoint's config: `beta` is only ever the task's feature scale
(`task.beta`); the actor-critic's critic step is `critic_step` (in `origin` for theta*, in `training` for a
trained run), and tasks per optimizer step are `tasks_per_step`. Checkpoints and run configs written by
icrl_interp 0.1 (`origin.beta`, `training.beta`, `training.batch`) are read under the new names
(`registry.Family.renamed`), the shipped files are left as they are, and run ids do not move."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from icrl_interp import cli
from icrl_interp.families import registry
from icrl_interp.models import checkpoint
from icrl_interp.models.config import CheckpointConfig
from icrl_interp.train import config_from_dict
from icrl_interp.train.trainer import run_id

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "data" / "checkpoints"
FORMAT_V1 = REPO / "tests" / "fixtures" / "format_v1"


def paths_of(key: str, tree, at: tuple = ()) -> list[tuple]:
    """Every path (section, ..., key) at which `key` occurs in a nested JSON object: the lookup a reader of
    config.json does when it searches for a name."""
    if isinstance(tree, dict):
        found = [(*at, key)] if key in tree else []
        return found + [p for k, v in tree.items() for p in paths_of(key, v, (*at, k))]
    if isinstance(tree, list):
        return [p for i, v in enumerate(tree) for p in paths_of(key, v, (*at, i))]
    return []


@pytest.mark.parametrize("path, where, step", [
    (SHIPPED / "actor-critic", "training", 0.01),  # trained, written with training.beta
    (FORMAT_V1 / "ckpt-actor-critic", "origin", 0.5),  # theta*, format 1, written with origin.beta
])
def test_a_nested_lookup_of_beta_finds_only_the_feature_scale(path, where, step):
    raw = json.loads((path / "config.json").read_text())
    assert (where, "beta") in paths_of("beta", raw)  # the file as shipped: two meanings under one name
    config = checkpoint.read(path)[0]
    data = config.to_dict()
    assert paths_of("beta", data) in ([], [("task", "beta")])  # read: beta is the feature scale or nothing
    assert paths_of("critic_step", data) == [(where, "critic_step")]
    assert data[where]["critic_step"] == step == config.constants["critic_step"]  # exact: the stored number
    assert json.loads((path / "config.json").read_text()) == raw  # the shipped file is untouched


def test_a_new_actor_critic_checkpoint_writes_critic_step_and_no_other_beta(tmp_path):
    out = tmp_path / "ac"
    assert cli.main(["construct", "actor-critic", "--out", str(out), "--n-states", "2", "--n-actions", "2", "--n", "6",
                     "--alpha", "2", "--critic-step", "0.25"]) == 0
    raw = json.loads((out / "config.json").read_text())
    assert paths_of("beta", raw) == [("task", "beta")] and raw["origin"]["critic_step"] == 0.25


def test_renamed_keys_keep_the_new_value_when_both_are_written():
    ac = registry.get("actor-critic")
    raw = json.loads((FORMAT_V1 / "ckpt-actor-critic" / "config.json").read_text())
    both = {**raw, "origin": {**raw["origin"], "critic_step": 0.75}}
    assert CheckpointConfig.from_dict(both).constants["critic_step"] == 0.75
    assert ac.current_config({"origin": {"kind": "x", "beta": 0.5}, "task": {"beta": 2.0}}) == {
        "origin": {"kind": "x", "critic_step": 0.5}, "task": {"beta": 2.0}}  # task.beta is not the critic step
    assert registry.get("softmax-td").current_config({"training": {"beta": 2.0, "batch": 3}}) == {
        "training": {"beta": 2.0, "tasks_per_step": 3}}  # softmax-td's beta is its feature scale: kept


@pytest.mark.parametrize("family", ["linear-td", "softmax-td", "sarsa", "actor-critic"])
def test_shipped_run_configs_load_under_the_new_names_with_their_run_ids(family):
    data = json.loads((SHIPPED / family / "train_config.json").read_text())
    cfg = config_from_dict(data)
    assert "batch" not in cfg.to_dict() and (family == "softmax-td" or "beta" not in cfg.to_dict())
    assert run_id(cfg) == json.loads((SHIPPED / family / "config.json").read_text())["origin"]["run_id"]
    if family == "actor-critic":
        assert cfg.critic_step == data["beta"] and cfg.tasks_per_step == data["batch"]  # exact: copied numbers
        assert run_id(cfg) != run_id(dataclasses.replace(cfg, critic_step=2 * cfg.critic_step))  # still hashed
