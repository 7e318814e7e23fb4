"""`icrl-interp envs`: draw a few tasks and show their exact quantities."""
from __future__ import annotations

import argparse

import numpy as np


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=["boyan", "mdp"], help="Boyan chain MRPs or random tabular MDPs")
    p.add_argument("--tasks", type=int, default=3, help="number of tasks to draw")
    p.add_argument("--states", type=int, default=None, help="number of states (default 10 / 9)")
    p.add_argument("--actions", type=int, default=4, help="number of actions (MDPs)")
    p.add_argument("--gamma", type=float, default=None, help="discount (default 0.9 / 0.5)")
    p.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    from ..tasks import envs
    from ..core.errors import UserError
    from ..core.outputs import check_fits

    if args.seed < 0:
        raise UserError(f"--seed must be a non-negative integer, got {args.seed}")
    states = args.states or (10 if args.kind == "boyan" else 9)
    actions = args.actions if args.kind == "mdp" else 1
    if args.tasks >= 1 and states >= 1 and actions >= 1:  # smaller values: the samplers say what is wrong
        check_fits(lambda s: 8 * 8 * s["tasks"] * s["states"] ** 2 * s["actions"] + 8 * 2**10 * s["tasks"],
                   {"tasks": args.tasks, "states": states, "actions": actions},
                   {"tasks": "--tasks", "states": "--states", "actions": "--actions"}, "the tasks")
    np.set_printoptions(precision=3, suppress=True)
    if args.kind == "boyan":
        mrp = envs.sample_boyan_chains(args.tasks, args.states or 10, gamma=0.9 if args.gamma is None else args.gamma, rng=args.seed)
        v, mu = mrp.values(), mrp.stationary()
        for b in range(mrp.batch):
            print(f"task {b}: v = {v[b]}\n        mu = {mu[b]}")
    else:
        mdp = envs.sample_tabular_mdps(args.tasks, args.states or 9, args.actions, 0.5 if args.gamma is None else args.gamma, rng=args.seed)
        uniform = np.full(mdp.R.shape, 1.0 / mdp.n_actions)
        _, _, best = mdp.optimal()
        rand = mdp.discounted_return(uniform)
        for b in range(mdp.batch):
            print(f"task {b}: return of uniform policy {rand[b]:+.4f}, optimal {best[b]:+.4f}")
    return 0
