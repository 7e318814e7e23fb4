"""`icrl-interp demo`: the end-to-end job on embedded defaults (what `make demo` runs)."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="icrl-report", help="report directory (default ./icrl-report)")
    p.add_argument("--quick", action="store_true", help="record 64 prompts per model instead of 256")
    p.add_argument("--workers", type=int, default=2, help="parallel analysis processes")


def run(args) -> int:
    from ..demo import DemoConfig, run_demo

    failed = run_demo(DemoConfig(out=Path(args.out), quick=args.quick, workers=args.workers))
    return 1 if failed else 0
