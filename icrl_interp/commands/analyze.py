"""`icrl-interp analyze INPUT...`: analysis of checkpoints, recordings and TL weights as a table and JSON."""
from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="checkpoint directory, HDF5 recording, TL .safetensors weights, or a directory of them")
    p.add_argument("--json", metavar="OUT.json", help="write the analysis here (one object, or a list for several inputs)")
    p.add_argument("--workers", type=int, default=None, help="parallel processes (default: one per input, at most the CPUs)")
    p.add_argument("--layout", metavar="LAYOUT.json", help="prompt layout for TL weights or generic recordings")
    p.add_argument("--family", choices=["linear-td", "softmax-td", "sarsa"],
                   help="construction to compare TL weights against (with --layout)")
    p.add_argument("--head", type=int, default=0, help="attention head of TL weights")
    p.add_argument("--chunk-mib", type=float, default=128.0, help="memory budget per chunk of prompts (MiB)")
    p.add_argument("--seed", type=int, default=0, help="seed of the probes' task split")
    p.add_argument("--probe-tasks", type=int, default=8192,
                   help="at most about this many tasks (hashed subset) feed the TD probes; 0 = all")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _fmt(x, spec=".3g") -> str:
    return "-" if x is None else (x if isinstance(x, str) else format(x, spec))


def table(rows: list[dict]) -> str:
    """A readable summary: one block per input, one line per layer."""
    lines = []
    for r in rows:
        lines.append(f"== {r.get('source')}")
        if "error" in r:
            lines.append(f"   ERROR: {r['error']}")
            continue
        w = r.get("weights") or {}
        bs, mf = w.get("block_sparsity") or {}, w.get("manifold") or {}
        rel = ", ".join(f"{k} {_fmt(v)}" for k, v in (mf.get("rel_err") or {}).items())
        lines.append(f"   {r.get('family')} ({r.get('kind')}), layers {r.get('n_layers')}, gamma {_fmt(r.get('gamma'))}")
        if w:
            lines.append(f"   weights: in-support energy {_fmt(bs.get('in_support_energy'), '.4f')}, "
                         f"lazy drift {_fmt(bs.get('lazy_drift'))}, scale c {_fmt(mf.get('scale'), '.4g')}, "
                         f"rel err [{rel}], gauge cosine {_fmt(mf.get('gauge_cosine'), '.4f')}, "
                         f"sign pattern {_fmt(w.get('sign_pattern'))}")
        acts = r.get("activations")
        if acts:
            lines.append(f"   {'layer':>5}  {'diag mean':>9}  {'diag min':>8}  {'margin':>8}  {'probe R2':>8}  "
                         f"{'shuffled':>8}  {'value err':>9}  {'ref err':>8}")
            for L in acts["layers"]:
                kd = L.get("kernel_diagonality") or {}
                lines.append(f"   {L['layer']:>5}  {_fmt(kd.get('mean')):>9}  {_fmt(kd.get('min')):>8}  "
                             f"{_fmt(kd.get('margin')):>8}  {_fmt(L.get('td_probe_r2'), '.4f'):>8}  "
                             f"{_fmt(L.get('td_probe_r2_shuffled'), '.2g'):>8}  {_fmt(L.get('value_error')):>9}  "
                             f"{_fmt(L.get('reference_value_error')):>8}")
            wm = acts.get("wang_metrics")
            if wm:
                lines.append(f"   VD {_fmt(wm['VD'])}, SS {_fmt(wm['SS'], '.4f')}, IWS {_fmt(wm['IWS'], '.4f')}")
        for k, why in (r.get("skipped") or {}).items():
            lines.append(f"   skipped {k}: {why}")
    return "\n".join(lines)


def write_json_atomic(path, payload) -> None:
    """Write JSON to a temporary file beside `path`, then rename it into place."""
    import json
    import os
    import tempfile
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def run(args) -> int:
    from ..analyzers import AnalyzeOptions, analyze_many
    from ..analyzers.inputs import read_layout_file
    from ..errors import UserError

    if args.workers is not None and args.workers < 1:
        raise UserError("--workers must be at least 1")
    if not args.chunk_mib > 0:
        raise UserError("--chunk-mib must be positive")
    if (args.family is None) != (args.layout is None):
        raise UserError("--family and --layout go together (they say how to read TL weights)")
    layout = read_layout_file(args.layout).to_dict() if args.layout else None
    if args.probe_tasks < 0:
        raise UserError("--probe-tasks must be >= 0 (0 = all tasks)")
    opts = AnalyzeOptions(chunk_mib=args.chunk_mib, seed=args.seed, probe_max_tasks=args.probe_tasks,
                          layout=layout, family=args.family, head=args.head,
                          progress=not args.no_progress and sys.stderr.isatty())
    rows = analyze_many(args.inputs, workers=args.workers, options=opts)
    print(table(rows))
    if args.json:
        write_json_atomic(args.json, rows[0] if len(rows) == 1 and len(args.inputs) == 1 else rows)
    failed = [r for r in rows if "error" in r]
    for r in failed:
        print(f"icrl-interp analyze: error: {r['source']}: {r['error']}", file=sys.stderr)
    return 2 if failed else 0
