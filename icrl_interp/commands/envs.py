"""`icrl-interp envs`: draw a few tasks and show their exact quantities."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from ..core.cli_fields import add_fields, parsed


@dataclass
class EnvsOptions:
    """The tasks drawn."""

    tasks: int = 3
    """Number of tasks drawn."""
    n_states: int | None = None
    """States of each task (None: 10 for Boyan chains, 9 for MDPs)."""
    n_actions: int = 4
    """Actions of each MDP."""
    gamma: float | None = None
    """Discount factor (None: 0.9 for Boyan chains, 0.5 for MDPs)."""
    prompt_seed: int = 0
    """Seed of the task sampler."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=["boyan", "mdp"], help="Boyan chain MRPs or random tabular MDPs")
    add_fields(p, EnvsOptions)


def run(args) -> int:
    from ..core.errors import UserError
    from ..core.outputs import check_fits
    from ..tasks import envs

    o = parsed(args, EnvsOptions)
    if o.prompt_seed < 0:
        raise UserError(f"--prompt-seed must be a non-negative integer, got {o.prompt_seed}")
    states = o.n_states or (10 if args.kind == "boyan" else 9)
    actions = o.n_actions if args.kind == "mdp" else 1
    if o.tasks >= 1 and states >= 1 and actions >= 1:  # smaller values: the samplers say what is wrong
        check_fits(lambda s: 8 * 8 * s["tasks"] * s["states"] ** 2 * s["actions"] + 8 * 2**10 * s["tasks"],
                   {"tasks": o.tasks, "states": states, "actions": actions},
                   {"tasks": "--tasks", "states": "--n-states", "actions": "--n-actions"}, "the tasks")
    np.set_printoptions(precision=3, suppress=True)
    if args.kind == "boyan":
        mrp = envs.sample_boyan_chains(o.tasks, states, gamma=0.9 if o.gamma is None else o.gamma, rng=o.prompt_seed)
        v, mu = mrp.values(), mrp.stationary()
        for b in range(mrp.batch):
            print(f"task {b}: v = {v[b]}\n        mu = {mu[b]}")
    else:
        mdp = envs.sample_tabular_mdps(o.tasks, states, o.n_actions, 0.5 if o.gamma is None else o.gamma,
                                       rng=o.prompt_seed)
        uniform = np.full(mdp.R.shape, 1.0 / mdp.n_actions)
        _, _, best = mdp.optimal()
        rand = mdp.discounted_return(uniform)
        for b in range(mdp.batch):
            print(f"task {b}: return of uniform policy {rand[b]:+.4f}, optimal {best[b]:+.4f}")
    return 0
