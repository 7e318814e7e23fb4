"""`icrl-interp sweep GRID.toml --out DIR`: train a grid of configs x seeds, then report over the runs.

    DIR/sweep.json     the plan (schema icrl_interp.sweep/1): the grid as read, each point's run directory and config
    DIR/runs/<point>/  one training run directory per point (`icrl-interp train`'s, resumable)
    DIR/report/        the batch report over the runs (`icrl-interp report`'s: summary.json, figures, index.html)

The runs and the report's analyses run on `--scheduler` (docs/cluster.md); a re-run skips finished
runs, resumes unfinished ones and takes the report's analyses from its cache.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

from ..core.cli_fields import add_fields, parsed


@dataclass
class SweepOptions:
    """Where the sweep goes and what it runs."""

    out: str = field(metadata={"metavar": "DIR"})
    """Sweep directory (a re-run continues it)."""
    scheduler: str | None = None
    """Where runs and analyses go: serial, local, local:N or tcp://HOST:PORT of a running Dask scheduler
    (None: local:WORKERS for more than one run, else serial)."""
    workers: int | None = None
    """Worker processes of the local Dask cluster (None: min(4, CPUs))."""
    eval: bool = True
    """Each run's held-out evaluation (--no-eval: skip it)."""
    report: bool = True
    """The batch report over the runs (--no-report: train only)."""
    progress: bool = True
    """Show progress bars on stderr."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("grid", metavar="GRID.toml", help="the sweep: family, seeds, [base] fields, [grid] lists of values "
                   "(format in docs/cluster.md)")
    add_fields(p, SweepOptions)


def _status(result: dict | None) -> str:
    if result is None:
        return "finished before (reused)"
    if "error" in result:
        return f"failed: {result['error']}"
    return f"resumed from step {result['resumed_from']}" if result["resumed_from"] else "trained"


def run(args) -> int:
    from pathlib import Path

    from ..core.cluster import choose_scheduler, open_engine
    from ..core.files import write_json
    from ..core.outputs import output_dir
    from ..train import sweep
    from .train import check_size

    o = parsed(args, SweepOptions)
    s = sweep.read_sweep(args.grid)  # a grid of too many runs is refused here, before torch is imported
    report_config = _report_config(s.report, args.grid, o.progress) if o.report else None
    workers = o.workers if o.workers is not None else min(4, os.cpu_count() or 1)
    chosen = choose_scheduler(o.scheduler, len(s.points), workers)
    seen = set()
    for point in s.points:  # sizes that do not fit fail before anything is made
        key = sweep.config_hash(point.config)
        if key not in seen:
            seen.add(key)
            check_size(point.config)
    out = Path(output_dir(o.out, "--out", inputs=[args.grid], owned=sweep.is_sweep_dir, what="sweep directory"))
    runs_dir = out.resolve() / "runs"
    report_dir = out / "report"
    if o.report and out.is_dir():  # an earlier sweep's report is replaced, anything else refused
        from ..report.batch import claim_out_dir

        claim_out_dir(report_dir, flag="the report directory")
    evaluate = o.eval
    todo = [p for p in s.points if not sweep.is_finished(runs_dir / p.name, p.config, evaluate)]
    _check_disk(todo, out)
    n_failed = 0
    # an unreachable scheduler fails first, before anything is written; then the sweep directory is locked
    with open_engine(chosen) as engine, sweep.writing_sweep(out):
        write_json(out / "sweep.json", sweep.plan(s, runs_dir))
        runs_dir.mkdir(exist_ok=True)
        jobs = [(p.config.to_dict(), str(runs_dir / p.name), evaluate) for p in todo]
        done = engine.map(sweep.train_point, jobs, desc="training", progress=o.progress,
                          lost=lambda why: {"error": f"worker died: {why}"})
        results = {point.name: result for point, result in zip(todo, done)}
        for point in s.points:
            line = _status(results.get(point.name))
            n_failed += line.startswith("failed")
            print(f"{point.name}: {line}")
        print(f"{len(s.points)} runs: {len(s.points) - len(todo)} reused, {len(todo) - n_failed} trained or resumed, "
              f"{n_failed} failed; runs in {runs_dir}")
        if not o.report:
            return 1 if n_failed else 0
        finished = [runs_dir / p.name for p in s.points if "error" not in results.get(p.name, {})]
        if not finished:
            print("no finished run to report on", file=sys.stderr)
            return 1
        return max(_report(finished, report_dir, report_config, engine), 1 if n_failed else 0)


def _check_disk(points, out) -> None:
    """Refuse runs whose checkpoints and metrics would not fit on the disk of the sweep directory."""
    from ..core.errors import UserError
    from ..core.outputs import human
    from ..core.outputs import free_bytes
    from .train import run_bytes

    need, free = sum(run_bytes(p.config) for p in points), free_bytes(out)
    if need > free:
        raise UserError(f"the sweep's {len(points)} runs to train write ~{human(need)} of checkpoints and metrics; "
                        f"the disk of {out} has {human(free)} free: sweep fewer points or steps, or raise "
                        "checkpoint_every")


def _report_config(fields: dict, grid: str, progress: bool):
    """The batch report's ReportConfig: the grid file's [report] fields, checked before any training."""
    from ..core.errors import UserError
    from ..report import ReportConfig

    config = ReportConfig(progress=progress, **fields)
    try:
        config.control()
    except UserError as e:
        raise UserError(f"{grid}: report.{e}") from None
    if config.max_recordings < 0:
        raise UserError(f"{grid}: report.max_recordings must be non-negative, got {config.max_recordings}")
    return config


def _report(run_dirs, report_dir, config, engine) -> int:
    from ..report import build_report
    from ..report.batch import write_figure_manifest
    from ..report.headline import text_table

    outcome = build_report([str(d) for d in run_dirs], report_dir, config, engine=engine)
    write_figure_manifest(report_dir, outcome.figures)
    print(text_table(outcome.results))
    reused = sum(r.cached for r in outcome.results)
    print(f"\nreport: {len(outcome.results)} checkpoints, {outcome.n_failed} failed ({reused} analyses from cache): "
          f"{report_dir / 'index.html'}")
    return 1 if outcome.n_failed else 0
