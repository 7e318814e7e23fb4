"""`icrl-interp report INPUTS... --out DIR`: batch analysis report over checkpoints, recordings and runs."""
from __future__ import annotations

import argparse
import os


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="checkpoint directories, recordings (.h5), training run directories, or folders holding them")
    p.add_argument("--out", default="icrl-report", help="report directory (default ./icrl-report)")
    p.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                   help="parallel analysis processes (default: min(4, CPUs))")
    p.add_argument("--no-cache", action="store_true", help="re-analyze every input instead of reusing <out>/cache/")
    p.add_argument("--svg", action="store_true", help="also write each figure as SVG")
    p.add_argument("--embed", action="store_true", help="inline the figures in index.html (a single-file page)")
    p.add_argument("--max-recordings", type=int, default=12,
                   help="per family, at most this many recordings get an attention / kernel figure (default 12)")
    p.add_argument("--title", default="icrl-interp report", help="page title")
    p.add_argument("--control-mdps", type=int, default=20, metavar="N",
                   help="in-context control of sarsa / actor-critic checkpoints: held-out MDPs (default 20; 0 disables)")
    p.add_argument("--control-steps", type=int, default=200, metavar="T",
                   help="in-context control: closed-loop updates per MDP (default 200)")
    p.add_argument("--analyzer", default=None, help=argparse.SUPPRESS)  # 'module:function', for tests


def run(args) -> int:
    from ..errors import UserError
    from ..report import ReportConfig, build_report
    from ..report.batch import DEFAULT_ANALYZER
    from ..report.headline import text_table

    if args.workers < 1:
        raise UserError(f"--workers must be at least 1, got {args.workers}")
    if args.max_recordings < 0:
        raise UserError(f"--max-recordings must be non-negative, got {args.max_recordings}")
    config = ReportConfig(workers=args.workers, analyzer=args.analyzer or DEFAULT_ANALYZER, use_cache=not args.no_cache,
                          svg=args.svg, embed=args.embed, max_recordings=args.max_recordings, title=args.title,
                          control_mdps=args.control_mdps, control_steps=args.control_steps)
    config.control()  # bad --control-* values fail before any work
    outcome = build_report(args.inputs, args.out, config)
    reused = sum(r.cached for r in outcome.results)
    print(text_table(outcome.results))
    print(f"\n{len(outcome.results)} inputs: {len(outcome.results) - outcome.n_failed} analyzed "
          f"({reused} from cache), {outcome.n_failed} failed; "
          f"{sum(bool(f.files) for f in outcome.figures)} figures")
    print(f"report: {os.path.join(outcome.out_dir, 'index.html')}")
    return 1 if outcome.n_failed else 0
