"""`icrl-interp control CHECKPOINT_DIR`: in-context control (Algorithm 1) on held-out random MDPs."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="CHECKPOINT_DIR", help="a sarsa or actor-critic checkpoint (theta*, trained or user)")
    p.add_argument("--mdps", type=int, default=100, help="held-out random MDPs (default 100)")
    p.add_argument("--steps", type=int, default=1000, metavar="T", help="closed-loop updates t per MDP (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the MDPs and the sampling stream (default 0)")
    p.add_argument("--json", metavar="OUT", help="write the full result (table, tracking, curves) as JSON, atomically")
    p.add_argument("--figure", metavar="PNG", help="also plot return vs update (teacher, transformer, random, oracle)")
    p.add_argument("--n", type=int, default=None, help="steps per update (default: the checkpoint's context length)")
    p.add_argument("--epsilon", type=float, default=0.1, help="SARSA exploration: epsilon-greedy on w.phi (default 0.1)")
    p.add_argument("--rewards", choices=["uniform", "normal"], default="uniform",
                   help="R(s,a) ~ U(-1,1) (default, the training distribution) or N(0,1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args) -> int:
    from .. import control

    cfg = control.ControlConfig(mdps=args.mdps, iterations=args.steps, n=args.n, epsilon=args.epsilon, seed=args.seed,
                                rewards=args.rewards)
    result = control.run_checkpoint(args.checkpoint, cfg, progress=not args.no_progress)
    print(control.format_table(result))
    if args.json:
        print(f"wrote {control.write_json(result, args.json)}")
    if args.figure:
        print(f"wrote {control.plot_returns([result], args.figure)}")
    return 0
