"""`icrl-interp report INPUTS... --out DIR`: batch analysis report over checkpoints, recordings and runs.

The options are the fields of `report.ReportConfig` (with their docstrings as help).
"""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class ReportOutput:
    """Where the report goes."""

    out: str = field(default="icrl-report", metadata={"metavar": "DIR"})
    """Report directory."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..core.cli_fields import add_fields
    from ..report import ReportConfig

    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="checkpoint directories, recordings (.h5), causal JSON files (icrl-interp causal --json), "
                   "training run directories, or folders holding them")
    add_fields(p, ReportOutput)
    p.set_defaults(_fields=add_fields(p, ReportConfig))


def run(args) -> int:
    from ..analyzers.inputs import discover
    from ..core.cli_fields import build, given, parsed
    from ..core.errors import UserError
    from ..report import ReportConfig, build_report
    from ..report.batch import claim_out_dir, write_figure_manifest
    from ..report.headline import text_table

    values = {"workers": min(4, os.cpu_count() or 1), **given(args, args._fields)}  # the CLI uses up to 4 cores
    config = build(ReportConfig, values)
    if config.workers < 1:
        raise UserError(f"--workers must be at least 1, got {config.workers}")
    if config.max_recordings < 0:
        raise UserError(f"--max-recordings must be non-negative, got {config.max_recordings}")
    config.control()  # bad --control-* values fail before any work
    if config.scheduler is not None:
        from ..core.cluster import parse_scheduler

        parse_scheduler(config.scheduler)  # a bad value fails before any work
    for found in discover(args.inputs, causal=True):
        if found.kind == "missing":
            raise UserError(f"input {found.path} {found.problem}; check the path (nothing was written)")
        if found.kind == "file":
            _check_named_file(found.path)
    out = claim_out_dir(parsed(args, ReportOutput).out, args.inputs)
    created = not os.path.exists(out)
    try:
        with _remote_engine(config.scheduler) as engine:  # an unreachable scheduler fails before anything is written
            outcome = build_report(args.inputs, out, config, engine=engine)
    except (UserError, OSError):
        if created:
            _remove_if_nothing_kept(out)
        raise
    write_figure_manifest(out, outcome.figures)
    reused = sum(r.cached for r in outcome.results)
    print(text_table(outcome.results, zoos=outcome.zoos))
    print(f"\n{len(outcome.results)} inputs: {len(outcome.results) - outcome.n_failed} analyzed "
          f"({reused} from cache), {outcome.n_failed} failed; "
          f"{sum(bool(f.files) for f in outcome.figures)} figures")
    print(f"report: {os.path.join(outcome.out_dir, 'index.html')}")
    for r in outcome.results:  # the page and summaries hold these rows; the error stream names them too
        if r.failed:
            what, why = ("error", r.error) if r.status == "failed" else (r.status, r.reasons)
            why = " ".join(str(why).split())
            where = "" if why.startswith(str(r.input.path)) else f"{r.input.path}: "
            print(f"icrl-interp report: {what}: {where}{why}", file=sys.stderr)
    return 1 if outcome.n_failed else 0


def _check_named_file(path) -> None:
    """A file named on the command line (not a causal JSON) is a recording or TL weights, and a recording
    opens (not truncated, not corrupt): else a one-line UserError before anything is written."""
    from ..analyzers.inputs import input_kind

    if input_kind(path) == "recording":
        from ..recording.format import Recording

        with Recording(path):
            pass


@contextmanager
def _remote_engine(scheduler: str | None):
    """The engine of a running Dask scheduler (tcp://...), connected now; None (build_report picks one) for
    the others, which need no connection (serial, or a local cluster started only when there is work)."""
    from ..core.cluster import open_engine, parse_scheduler

    if scheduler is None or parse_scheduler(scheduler).kind != "address":
        yield None
        return
    with open_engine(parse_scheduler(scheduler)) as engine:
        yield engine


def _remove_if_nothing_kept(out) -> None:
    """Undo the report directory this command created, unless it holds finished analyses (cache/), which a
    re-run reuses."""
    import shutil

    cache = os.path.join(out, "cache")
    if not (os.path.isdir(cache) and any(os.scandir(cache))):
        shutil.rmtree(out, ignore_errors=True)
