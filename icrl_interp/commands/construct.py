"""`icrl-interp construct FAMILY --out DIR`: write a theta* checkpoint."""
from __future__ import annotations

import argparse

# Per-family defaults: the setting each paper reports (constructions.md).
DEFAULTS = {
    "linear-td": {"d": 4, "n": 30, "layers": 3, "gamma": 0.9, "states": 10},
    "softmax-td": {"d": 5, "n": 40, "layers": 6, "gamma": 0.9, "states": 5},
    "sarsa": {"d": None, "n": 64, "layers": 1, "gamma": 0.5, "states": 9},
    "actor-critic": {"d": None, "n": 64, "layers": 1, "gamma": 0.5, "states": 9},
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("family", choices=sorted(DEFAULTS), help="which construction")
    p.add_argument("--out", required=True, help="checkpoint directory to create")
    p.add_argument("--d", type=int, default=None,
                   help="feature dimension (default 4 / 5 / n_states*n_actions; softmax one-hot needs d = --states)")
    p.add_argument("--n", type=int, default=None, help="context length of the recorded task (default 30 / 40 / 64)")
    p.add_argument("--layers", type=int, default=None, help="number of layers (default 3 / 6 / 1)")
    p.add_argument("--gamma", type=float, default=None, help="discount (default 0.9 / 0.9 / 0.5)")
    p.add_argument("--alpha", type=float, default=1.0, help="step size of theta*")
    p.add_argument("--scale", type=float, default=1.0, metavar="C",
                   help="gauge / scaling-manifold constant c (linear-td: (cP*, Q*/c); sarsa: (cP12*, V21*/c))")
    p.add_argument("--score-scale", type=float, default=1.0, help="softmax-td: multiplies A* (beta^2 for one-hot x beta)")
    p.add_argument("--form", choices=["tsm", "dual"], default="tsm", help="softmax-td form")
    p.add_argument("--untied", action="store_true", help="store one copy of the weights per layer")
    p.add_argument("--states", type=int, default=None, help="states of the task (default 10 / 5 / 9)")
    p.add_argument("--actions", type=int, default=4, help="sarsa: actions of the task MDPs")
    p.add_argument("--features", choices=["random", "onehot"], default=None,
                   help="Boyan features (default random for linear-td, onehot for softmax-td)")
    p.add_argument("--beta", type=float, default=1.0, help="scale of one-hot features")
    p.add_argument("--critic-step", type=float, default=1.0,
                   help="actor-critic: the critic's step (--alpha is the actor's step, as in reference.actor_critic_update)")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--seed", type=int, default=0, help="seed recorded for task sampling downstream")
    p.add_argument("--force", action="store_true", help="replace an existing checkpoint directory")


def _task(args, d_default) -> tuple[int, dict]:
    """(d, task) for the family; the task keys follow sampling.TaskSpec."""
    defaults = DEFAULTS[args.family]
    n = defaults["n"] if args.n is None else args.n
    states = defaults["states"] if args.states is None else args.states
    if args.family == "sarsa":
        d = states * args.actions
        if args.d is not None and args.d != d:
            from ..errors import UserError

            raise UserError(f"sarsa features are state-action one-hot: d must be states*actions = {d}, got --d {args.d}")
        return d, {"kind": "mdp", "n": n, "n_states": states, "n_actions": args.actions}
    features = args.features or ("random" if args.family == "linear-td" else "onehot")
    d = args.d if args.d is not None else (states if features == "onehot" else d_default)
    if features == "onehot" and d != states:
        from ..errors import UserError

        raise UserError(f"one-hot features need d = number of states ({states}), got --d {d}")
    task = {"kind": "boyan", "n": n, "n_states": states, "features": features}
    if features == "onehot":
        task["beta"] = args.beta
    return d, task


def run(args) -> int:
    from .. import checkpoint
    from ..models import theta_star_model

    defaults = DEFAULTS[args.family]
    if args.family == "actor-critic":
        from .. import actor_critic

        out = actor_critic.save_theta_star(
            args.out, n_states=defaults["states"] if args.states is None else args.states, n_actions=args.actions,
            n=defaults["n"] if args.n is None else args.n, gamma=defaults["gamma"] if args.gamma is None else args.gamma,
            alpha=args.alpha, beta=args.critic_step, c=args.scale, dtype=args.dtype, overwrite=args.force)
        print(f"wrote theta* actor-critic checkpoint {out} (sha256 {checkpoint.sha256(out)[:16]})")
        return 0
    d, task = _task(args, defaults["d"])
    model = theta_star_model(
        args.family, d, n_layers=defaults["layers"] if args.layers is None else args.layers,
        gamma=defaults["gamma"] if args.gamma is None else args.gamma, alpha=args.alpha,
        c=args.scale, score_scale=args.score_scale, form=args.form, tied=not args.untied, dtype=args.dtype,
    )
    out = checkpoint.save(model, {"n": task["n"], "task": task, "seed": args.seed}, args.out, overwrite=args.force)
    print(f"wrote theta* {args.family} checkpoint {out} (sha256 {checkpoint.sha256(out)[:16]})")
    return 0
