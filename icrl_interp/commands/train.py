"""`icrl-interp train FAMILY --out RUN_DIR`: pretrain a model (resumes if RUN_DIR holds the same run)."""
from __future__ import annotations

import argparse
import json

# flag -> (config field, type, help); only fields of the chosen family are accepted
_FLAGS = {
    "--steps": ("steps", int, "optimizer steps"),
    "--seed": ("seed", int, "seed of the init and the task stream"),
    "--lr": ("lr", float, "Adam learning rate"),
    "--lr-decay": ("lr_decay", float, "multiply the lr by this every --lr-decay-every steps"),
    "--lr-decay-every": ("lr_decay_every", int, "period of the lr decay (steps)"),
    "--weight-decay": ("weight_decay", float, "Adam L2 weight decay"),
    "--init-gain": ("init_gain", float, "Xavier-normal init gain"),
    "--dtype": ("dtype", str, "float32 or float64"),
    "--checkpoint-every": ("checkpoint_every", int, "checkpoint period (steps)"),
    "--log-every": ("log_every", int, "metrics.jsonl period (steps)"),
    "--eval-tasks": ("eval_tasks", int, "held-out tasks for the final evaluation"),
    "--d": ("d", int, "linear-td: feature dimension"),
    "--states": ("n_states", int, "states per task"),
    "--actions": ("n_actions", int, "sarsa: actions per state"),
    "--n": ("n", int, "context length"),
    "--layers": ("n_layers", int, "depth L (TD families)"),
    "--gamma": ("gamma", float, "discount factor"),
    "--alpha": ("alpha", float, "sarsa: teacher step size; actor-critic: actor step"),
    "--beta": ("beta", float, "softmax-td: one-hot feature scale; actor-critic: critic step"),
    "--form": ("form", str, "softmax-td: tsm or dual"),
    "--objective": ("objective", str, "linear-td: mstde|msve; softmax-td: neu|td"),
    "--batch": ("batch", int, "tasks per step (softmax-td, sarsa)"),
    "--tasks-per-step": ("tasks_per_step", int, "linear-td: tasks per step"),
    "--windows": ("windows", int, "linear-td: sliding windows per trajectory"),
    "--trajectories-per-task": ("trajectories_per_task", int, "linear-td: trajectories per task"),
    "--w-std": ("w_std", float, "sarsa: std of w in the prompts"),
    "--lam-std": ("lam_std", float, "actor-critic: std of lam in the prompts"),
    "--epsilon": ("epsilon", float, "sarsa: behaviour epsilon (1 = uniform)"),
}
_BOOLS = {
    "tied": "share weights across layers (TD families)",
    "masks": "softmax-td: train only inside the paper's sparsity masks",
    "lazy-ablation": "sarsa: initialise the lazy blocks randomly (ablation)",
    "span-projection": "sarsa: project Adam's updates onto the span of the prompts' transition columns",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("family", choices=["linear-td", "softmax-td", "sarsa", "actor-critic"], help="model family to train")
    p.add_argument("--out", required=True, help="run directory (resumed if it holds the same config)")
    p.add_argument("--config", help="JSON file with config fields (flags override it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation at the end")
    p.add_argument("--export", metavar="DIR", help="after training, copy the final checkpoint + metrics + config to DIR")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: fastest for these tiny matmuls)")
    for flag, (dest, typ, help_text) in _FLAGS.items():
        p.add_argument(flag, dest=dest, type=typ, default=None, help=help_text)
    for name, help_text in _BOOLS.items():
        p.add_argument(f"--{name}", dest=name.replace("-", "_"), action=argparse.BooleanOptionalAction, default=None,
                       help=help_text)


def run(args) -> int:
    from ..errors import UserError
    from ..train import config_for, train

    overrides = {}
    if args.config:
        try:
            with open(args.config) as f:
                overrides = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"cannot read config file {args.config}: {e}") from None
        if not isinstance(overrides, dict):
            raise UserError(f"config file {args.config} must hold a JSON object")
        if overrides.pop("family", args.family) != args.family:
            raise UserError(f"config file {args.config} is for another family than {args.family}")
        overrides.pop("run_id", None)
    names = [dest for dest, _, _ in _FLAGS.values()] + [n.replace("-", "_") for n in _BOOLS]
    overrides.update({k: getattr(args, k) for k in names if getattr(args, k) is not None})
    cfg = config_for(args.family, **overrides)
    result = train(cfg, args.out, progress=not args.no_progress, evaluate=not args.no_eval, threads=args.threads)
    if result.resumed_from:
        print(f"resumed from step {result.resumed_from}")
    print(f"run directory: {result.run_dir}")
    if result.final_metrics:
        print(json.dumps(result.final_metrics, indent=1))
    if args.export:
        from ..train.trainer import export_final

        print(f"exported to {export_final(result.run_dir, args.export)}")
    return 0
