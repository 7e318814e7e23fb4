"""`icrl-interp control CHECKPOINT_DIR`: in-context control (Algorithm 1) on held-out random MDPs.

The evaluation flags are the fields of `control.ControlConfig` (with their docstrings as help).
"""
from __future__ import annotations

import argparse

from ..core import devices


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..core.cli_fields import add_fields
    from ..train.control import ControlConfig

    p.add_argument("checkpoint", metavar="CHECKPOINT_DIR",
                   help="a checkpoint of a family with a control rule (sarsa, actor-critic): theta*, trained or user")
    p.add_argument("--json", metavar="OUT", help="write the full result (table, tracking, curves) as JSON, atomically")
    p.add_argument("--figure", metavar="PNG", help="also plot return vs update (teacher, transformer, random, oracle)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    devices.add_argument(p, "the model's forward passes run")
    p.set_defaults(_fields=add_fields(p, ControlConfig, aliases={"iterations": ("--steps",)}))


def run(args) -> int:
    from pathlib import Path

    from ..train import control
    from ..core.cli_fields import build, given
    from ..core.errors import UserError
    from ..core.files import atomic_path
    from ..core.outputs import check_finite, mark_png, output_file

    cfg = build(control.ControlConfig, given(args, args._fields))
    check_finite(cfg)
    if cfg.seed < 0:
        raise UserError(f"--seed must be a non-negative integer, got {cfg.seed}")
    inputs = [args.checkpoint]
    if args.json is not None:
        output_file(args.json, "--json", inputs=inputs)
    if args.figure is not None:
        output_file(args.figure, "--figure", inputs=inputs, suffixes=(".png",))
        if args.json is not None and Path(args.json).resolve() == Path(args.figure).resolve():
            raise UserError("--json and --figure name the same file; give two names")
    devices.resolve(args.device)  # refused before any work
    result = control.run_checkpoint(args.checkpoint, cfg, progress=not args.no_progress, device=args.device)
    print(control.format_table(result))
    if args.json:
        print(f"wrote {control.write_json(result, args.json)}")
    if args.figure:
        with atomic_path(args.figure, suffix=".png") as tmp:  # marked as ours, then moved into place
            mark_png(control.plot_returns([result], tmp))
        print(f"wrote {args.figure}")
    return 0
