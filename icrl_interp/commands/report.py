"""`icrl-interp report INPUTS... --out DIR`: batch analysis report over checkpoints, recordings and runs.

The options are the fields of `report.ReportConfig` (with their docstrings as help).
"""
from __future__ import annotations

import argparse
import os


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli_fields import add_fields
    from ..report import ReportConfig

    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="checkpoint directories, recordings (.h5), causal JSON files (icrl-interp causal --json), "
                   "training run directories, or folders holding them")
    p.add_argument("--out", default="icrl-report", help="report directory (default ./icrl-report)")
    p.add_argument("--analyzer", default=None, help=argparse.SUPPRESS)  # 'module:function', for tests
    p.set_defaults(_fields=add_fields(p, ReportConfig, skip=("analyzer",), aliases={"use_cache": ("--cache",)}))


def run(args) -> int:
    from ..analyzers.inputs import discover
    from ..cli_fields import build, given
    from ..errors import UserError
    from ..report import ReportConfig, build_report
    from ..report.batch import claim_out_dir, write_figure_manifest
    from ..report.headline import text_table

    values = {"workers": min(4, os.cpu_count() or 1), **given(args, args._fields)}  # the CLI uses up to 4 cores
    if args.analyzer:
        values["analyzer"] = args.analyzer
    config = build(ReportConfig, values)
    if config.workers < 1:
        raise UserError(f"--workers must be at least 1, got {config.workers}")
    if config.max_recordings < 0:
        raise UserError(f"--max-recordings must be non-negative, got {config.max_recordings}")
    config.control()  # bad --control-* values fail before any work
    if config.scheduler is not None:
        from ..cluster import parse_scheduler

        parse_scheduler(config.scheduler)  # a bad value fails before any work
    for found in discover(args.inputs, causal=True):
        if found.kind == "missing":
            raise UserError(f"input {found.path} {found.problem}; check the path (nothing was written)")
    out = claim_out_dir(args.out, args.inputs)
    outcome = build_report(args.inputs, out, config)
    write_figure_manifest(out, outcome.figures)
    reused = sum(r.cached for r in outcome.results)
    print(text_table(outcome.results))
    print(f"\n{len(outcome.results)} inputs: {len(outcome.results) - outcome.n_failed} analyzed "
          f"({reused} from cache), {outcome.n_failed} failed; "
          f"{sum(bool(f.files) for f in outcome.figures)} figures")
    print(f"report: {os.path.join(outcome.out_dir, 'index.html')}")
    return 1 if outcome.n_failed else 0
