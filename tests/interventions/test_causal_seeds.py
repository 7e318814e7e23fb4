"""The causal test's seeds each draw their own part (`causal --prompt-seed / --split-seed / --direction-seed`):
the tasks, the held-out split with its bootstrap resamples, and the random directions. `seed` is the default
of each, so a run that gives all three at `seed`'s value is the run of `seed` alone, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.interventions import causal
from icrl_interp.models import construct, theta_star_model

TASKS = 16
KW = dict(tasks=TASKS, random_draws=3, bootstrap=20, steer=(1.0,), baseline="none", refits=0)


@pytest.fixture(scope="module")
def star():
    options = {"d": 2, "n": 8, "n_layers": 2}
    plan = construct.options("linear-td", options).plan()
    return theta_star_model("linear-td", **plan.model, **plan.constants), construct.task_config("linear-td", options)


def test_the_prompt_seed_draws_the_tasks_and_the_split_seed_splits_them(star):
    model, cfg = star
    base = causal.prepare(model, cfg, 0, tasks=TASKS, seed=1)
    resplit = causal.prepare(model, cfg, 0, tasks=TASKS, seed=1, split_seed=2)
    redrawn = causal.prepare(model, cfg, 0, tasks=TASKS, seed=3, split_seed=1)
    z = {s: np.asarray(cfg.sample(TASKS, np.random.default_rng([s, 0x7A5C])).prompt.z) for s in (1, 3)}
    for setup, s in ((base, 1), (resplit, 1), (redrawn, 3)):  # the held-out prompts are the seed's tasks
        np.testing.assert_array_equal(setup.z_test, z[s][setup.test_index])  # exact: the same draws, selected
    assert not np.array_equal(base.test_index, resplit.test_index)  # another split of the same tasks
    np.testing.assert_array_equal(base.test_index, redrawn.test_index)  # the same split of other tasks
    assert not np.array_equal(z[1], z[3])


def test_each_seed_is_recorded_and_defaults_to_seed(star):
    model, cfg = star
    one = causal.causal_test(model, cfg, 0, seed=1, **KW)
    spelled = causal.causal_test(model, cfg, 0, prompt_seed=1, split_seed=1, direction_seed=1, seed=7, **KW)
    assert one == spelled  # exact: the same draws; `seed` only fills the seeds not given
    assert (one["tasks"]["prompt_seed"], one["tasks"]["split_seed"], one["direction_seed"]) == (1, 1, 1)
    other = causal.causal_test(model, cfg, 0, seed=1, direction_seed=5, **KW)
    assert other["direction_seed"] == 5 and other["tasks"] == one["tasks"]
    td, rnd = (lambda s: s["erasure"]["output_change"]["td"]), (lambda s: s["erasure"]["output_change"]["random"])
    assert td(other) == td(one)  # exact: the TD direction does not depend on the directions' seed
    assert rnd(other)["draws"] != rnd(one)["draws"]  # the random directions do
