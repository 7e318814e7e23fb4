"""Live analysis vs record-then-analyze vs the plain forward pass, measured side by side in one run.

    python benchmarks/bench_live.py [--family softmax-td] [--prompts 2048] [--n 32] [--batch-size 256]

Rows, on the same prompts (sampled from the family's task) and the same hooks (the shipped probe spec):
  (1) plain forward passes of prompts already in memory;
  (2) the prompt source alone: sampling the tasks and running the reference algorithm (float64);
  (3) live analysis: `analyze_model` (forward passes feeding the analyzers, nothing written);
  (4) record to HDF5, then `analyze` the file.
Then peak RSS of a live analysis of 1,000 ... 200,000 prompts at two chunk budgets (separate processes):
it grows until one analyzer chunk is held and the analyzers' per-task state is at its caps, then stays flat.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench_record import _best, _model_and_prompts, _peak_rss_kib, workload_parser
from icrl_interp.models import checkpoint
from icrl_interp.recording import probe_spec, recorder
from icrl_interp.analyzers.analyze import analyze
from icrl_interp.analyzers.analyze import analyze_model
from icrl_interp.models import theta_star_model


def bench(args) -> None:
    torch.set_num_threads(args.threads)
    model, config, z = _model_and_prompts(args)
    zt, B = torch.from_numpy(z), args.batch_size
    spec = probe_spec.shipped_spec(args.family)
    run = dict(tasks=args.prompts, batch_size=B, baseline="none", probe=spec)
    tmp = Path(tempfile.mkdtemp(prefix="bench_live_"))

    def plain():
        with torch.no_grad():
            for i in range(0, len(z), B):
                model(zt[i : i + B])

    def prompts():
        source = recorder.PromptSource(config=config, n_total=args.prompts)
        for index in range(-(-args.prompts // B)):
            source.batch(index, index * B, min((index + 1) * B, args.prompts))

    cost = {}

    def live():
        cost.update(analyze_model(model, config, **run)["live"])

    def record_then_analyze():
        out = tmp / "r.h5"
        out.unlink(missing_ok=True)
        recorder.record_model(model, config, out, progress=False, **run)
        analyze(out)

    times = {name: _best(fn, args.repeats) for name, fn in
             (("plain", plain), ("prompts", prompts), ("live", live), ("file", record_then_analyze))}
    print(f"\nlive-analysis benchmark: family {args.family}, {args.prompts} prompts of {z.shape[1]} positions, batch {B}, "
          f"torch threads {args.threads}; live ran {cost['forward_batches']} forward batches for {cost['batches']} "
          f"batches (the held-out pass runs them again once they left the cache)")
    rows = (("(1) plain forward", "plain"), ("(2) prompt source alone (tasks + reference)", "prompts"),
            ("(3) live analysis", "live"), ("(4) record to HDF5 + analyze", "file"))
    for label, key in rows:
        print(f"{label:46s} {times[key]:9.3f} s")
    print(f"\n(3)/(1) live analysis vs plain forward:             {times['live'] / times['plain']:.2f}x   (target <= 1.3x)")
    print(f"(3)/((1)+(2)) live vs forward + its prompt source:  {times['live'] / (times['plain'] + times['prompts']):.2f}x")
    print(f"(4)/(3) record-then-analyze vs live analysis:       {times['file'] / times['live']:.2f}x")
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()


def _rss_child(n_prompts: int, chunk_mib: float) -> None:
    from icrl_interp.analyzers.analyze import AnalyzeOptions

    model = theta_star_model("linear-td", d=4, n_layers=3, dtype="float32")
    config = checkpoint.make_config(model.config, {"task": {"kind": "boyan", "n": 30, "n_states": 10}, "origin": model.origin})
    analyze_model(model, config, tasks=n_prompts, batch_size=500, baseline="none",
                  options=AnalyzeOptions(chunk_mib=chunk_mib))
    print(_peak_rss_kib())


def bench_memory(sizes=(1_000, 10_000, 100_000, 200_000), budgets=(128.0, 16.0)) -> None:
    """Peak RSS by number of prompts, for two chunk budgets. It grows until one chunk of the analyzer
    (--chunk-mib) is held and the analyzers' own per-task state reaches its caps (the TD probes' 8192
    tasks, `--probe-tasks`; the 65,536 prompts Wang's metrics score), then stays flat."""
    print("\npeak RSS (MiB) of a live analysis of linear-td (d=4, L=3, n=30, batch 500), by prompts:")
    print(f"{'--chunk-mib':>12s} " + " ".join(f"{n:>10,d}" for n in sizes))
    for budget in budgets:
        rss = []
        for n in sizes:
            out = subprocess.run([sys.executable, __file__, "--rss-child", str(n), "--chunk-mib", str(budget)],
                                 capture_output=True, text=True, check=True)
            rss.append(int(out.stdout.strip().splitlines()[-1]) / 1024)
        print(f"{budget:12.0f} " + " ".join(f"{r:10.0f}" for r in rss) +
              f"   ({sizes[-1]:,} vs {sizes[-2]:,} prompts: {rss[-1] - rss[-2]:+.0f} MiB)")


def main() -> None:
    p = workload_parser(__doc__, prompts=2048, n=32, batch_size=256, repeats=2)
    p.add_argument("--chunk-mib", type=float, default=128.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rss_child:
        _rss_child(args.rss_child, args.chunk_mib)
        return
    bench(args)
    if not args.skip_memory:
        bench_memory()


if __name__ == "__main__":
    main()
