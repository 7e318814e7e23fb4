"""`icrl-interp control CHECKPOINT_DIR`: in-context control (Algorithm 1) on held-out random MDPs.

The evaluation flags are the fields of `control.ControlConfig` (with their docstrings as help).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..core import devices
from ..core.cli_fields import add_fields, parsed


@dataclass
class ControlOutputs:
    """What `control` writes."""

    json: str | None = field(default=None, metadata={"metavar": "OUT.json"})
    """Write the full result (table, tracking, curves) as JSON, atomically."""
    figure: str | None = field(default=None, metadata={"metavar": "OUT.png"})
    """Also plot return vs update (teacher, transformer, random, oracle)."""
    progress: bool = True
    """Show progress bars on stderr."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.control import ControlConfig

    p.add_argument("checkpoint", metavar="CHECKPOINT_DIR",
                   help="a checkpoint of a family with a control rule (sarsa, actor-critic): theta*, trained or user")
    add_fields(p, ControlOutputs)
    add_fields(p, devices.Device)
    add_fields(p, ControlConfig)


def run(args) -> int:
    from pathlib import Path

    from ..core.errors import UserError
    from ..core.files import atomic_path
    from ..core.outputs import check_finite, mark_png, output_file
    from ..train import control

    o, device = parsed(args, ControlOutputs), parsed(args, devices.Device).device
    cfg = parsed(args, control.ControlConfig)
    check_finite(cfg)
    if cfg.seed < 0:
        raise UserError(f"--prompt-seed must be a non-negative integer, got {cfg.seed}")
    inputs = [args.checkpoint]
    if o.json is not None:
        output_file(o.json, "--json", inputs=inputs)
    if o.figure is not None:
        output_file(o.figure, "--figure", inputs=inputs, suffixes=(".png",))
        if o.json is not None and Path(o.json).resolve() == Path(o.figure).resolve():
            raise UserError("--json and --figure name the same file; give two names")
    devices.resolve(device)  # refused before any work
    result = control.run_checkpoint(args.checkpoint, cfg, progress=o.progress, device=device)
    print(control.format_table(result))
    if o.json:
        print(f"wrote {control.write_json(result, o.json)}")
    if o.figure:
        with atomic_path(o.figure, suffix=".png") as tmp:  # marked as ours, then moved into place
            mark_png(control.plot_returns([result], tmp))
        print(f"wrote {o.figure}")
    return 0
