"""Batch reports: analyze many checkpoints / recordings / training runs, gather causal test results
(causal JSON files of `icrl-interp causal --json`), and write a report directory.

`build_report(inputs, out_dir)` writes `<out>/summary.json`, `<out>/summary.csv`, the TD probes'
`<out>/td_probes.csv` and `<out>/td_probe_tasks.csv`,
`<out>/figures/*.png` and `<out>/index.html`, caching analyses in `<out>/cache/`.
Checkpoints of the sarsa / actor-critic families also get a small in-context control
evaluation (closed loop on held-out MDPs, `control_eval`), stored in their analysis. Each causal
JSON is a row of kind 'causal' with its figure (`report.causal.write_figure`) in a "Causal tests"
section of the page.
This package does not import transformer_lens (nor torch).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import check
from ..core.files import write_atomic
from .batch import DEFAULT_ANALYZER, ReportInput, Result, collect_inputs, run_batch, write_summaries, writing_report
from .control_eval import ControlSettings


@dataclass
class ReportOutcome:
    """What `build_report` produced."""

    results: list[Result]
    """One per input, in input order."""
    figures: list = field(default_factory=list)
    """FigureInfo per figure drawn (or attempted)."""
    out_dir: Path = Path(".")
    """The report directory."""
    zoos: list = field(default_factory=list)
    """(path, document) of each known-answer zoo among the inputs (`known_answers.find`)."""

    @property
    def n_failed(self) -> int:
        """Inputs that failed or where nothing was analyzed (status 'partial' counts as analyzed)."""
        return sum(r.failed for r in self.results)


@dataclass
class ReportConfig:
    """Options of `build_report` (the CLI flags)."""

    workers: int = 1
    """Parallel analysis processes (1 = in this process; the CLI's default is min(4, CPUs)): without
    --scheduler, more than one input to analyze runs on a local Dask cluster of this many worker processes."""
    scheduler: str | None = None
    """Where the analyses run: serial, local, local:N or tcp://HOST:PORT of a running Dask scheduler
    (docs/cluster.md); default: local:WORKERS when more than one input is left to analyze, else serial."""
    analyzer: str = field(default=DEFAULT_ANALYZER, metadata={"hidden": True})
    """'module:function' taking a path and returning an icrl_interp.analysis/1 dict (a flag for tests)."""
    use_cache: bool = True
    """Reuse `<out>/cache/<sha256>.json` analyses of unchanged inputs."""
    svg: bool = False
    """Also write every figure as SVG."""
    embed: bool = False
    """Inline the PNGs in index.html (one self-contained file) instead of referencing figures/."""
    max_recordings: int = 12
    """Per family, at most this many recordings get their own attention / M̂ figure."""
    title: str = "icrl-interp report"
    """Page title."""
    progress: bool = True
    """Show tqdm progress bars on stderr."""
    control_mdps: int = ControlSettings.mdps
    """Held-out MDPs of the in-context control evaluation of checkpoints of control families (sarsa,
    actor-critic); 0 disables it."""
    control_iterations: int = ControlSettings.iterations
    """Closed-loop updates per MDP of that evaluation."""
    live_tasks: int = 256
    """Checkpoints are also run on this many prompts of their own task and their activations analyzed
    live, nothing written (docs/analyzers.md, "Live analysis"); 0 = their weights only. Applies to the
    default analyzer; a checkpoint you recorded is better given as its recording."""

    def control(self) -> ControlSettings:
        """The control settings, validated (UserError on a bad value)."""
        for name in ("control_mdps", "control_iterations"):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                  f"{name.replace('_', '-')} must be a non-negative integer, got {value!r}")
        check(isinstance(self.live_tasks, int) and not isinstance(self.live_tasks, bool) and self.live_tasks >= 0,
              f"live-tasks must be a non-negative integer, got {self.live_tasks!r}")
        check(self.control_iterations >= 1 or self.control_mdps == 0,
              f"control-iterations must be at least 1 (or disable control with control-mdps 0), "
              f"got {self.control_iterations}")
        return ControlSettings(mdps=self.control_mdps, iterations=self.control_iterations)


def build_report(inputs: list, out_dir, config: ReportConfig | None = None, engine=None) -> ReportOutcome:
    """Collect, analyze (cached, on `engine` when the caller holds one open, else on the config's
    scheduler), then write summaries, figures and the page."""
    from .figures import make_figures
    from .html import render
    from .known_answers import find, without_zoos
    from .td_probes import write_tables as write_probe_tables

    config = config or ReportConfig()
    control = config.control()
    with writing_report(out_dir) as out_dir:  # locked and marked first: a killed report is resumed here
        zoos = find(inputs)  # shown as confusion matrices, not analyzed
        items = collect_inputs(without_zoos(inputs))
        results = run_batch(items, out_dir, workers=config.workers, analyzer=config.analyzer,
                            use_cache=config.use_cache, progress=config.progress, control=control,
                            scheduler=config.scheduler, engine=engine,
                            checkpoint_options={"live_tasks": config.live_tasks}
                            if config.live_tasks and config.analyzer == DEFAULT_ANALYZER else None)
        write_summaries(results, out_dir)
        write_probe_tables(results, out_dir)  # td_probes.csv, td_probe_tasks.csv
        figures = make_figures(results, out_dir, svg=config.svg, max_recordings=config.max_recordings,
                               log=lambda msg: print(f"warning: {msg}", file=sys.stderr))
        write_atomic(out_dir / "index.html", render(results, figures, out_dir, title=config.title, embed=config.embed,
                                                   zoos=zoos))
    return ReportOutcome(results, figures, out_dir, zoos)


__all__ = ["ReportConfig", "ReportInput", "ReportOutcome", "Result", "build_report", "collect_inputs", "run_batch"]
