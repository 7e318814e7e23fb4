"""`icrl-interp demo`: the end-to-end job on embedded defaults (what `make demo` runs).

The options are the fields of `demo.DemoConfig` (with their docstrings as help).
"""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..core.cli_fields import add_fields
    from ..report.demo import DemoConfig

    p.set_defaults(_fields=add_fields(p, DemoConfig, skip=("families",)))


def run(args) -> int:
    from pathlib import Path

    from ..core.cli_fields import build, given
    from ..core.errors import UserError
    from ..report.demo import DemoConfig, run_demo

    values = given(args, args._fields)
    if "out" in values:
        if not values["out"].strip():
            raise UserError("--out is empty; give a path")
        values["out"] = Path(values["out"])
    failed = run_demo(build(DemoConfig, values))
    return 1 if failed else 0
