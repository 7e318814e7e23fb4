"""Recording an AD model over learning histories vs its plain forward pass, side by side in one run.

    python benchmarks/bench_episodes.py [--histories 1000] [--steps 500] [--repeats 3]

The issue-27 target: recording a 4-layer AD transformer (d 64, `ad-step`, context 100) over 1,000 learning
histories of 500 steps runs within 2x its forward pass (encoding the documented tokens + the model, no
hooks, nothing written), with flat memory. Each round runs both sides back to back in alternating order
(`bench_targets.rounds`); the figure is the median ratio. Memory: peak RSS of a recording of
`--histories` vs a tenth of them, each in its own process.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def setup(histories: int, steps: int):
    import torch

    from icrl_interp.models import episode_tokens as et
    from icrl_interp.models.ad_transformer import ADConfig, ADTransformer
    from icrl_interp.tasks.collect import collect

    torch.manual_seed(0)
    ep = collect("icrl_interp/DarkRoom-v0", "q-learning", histories=histories, steps=steps,
                 env_kwargs={"size": 5, "horizon": 10}, alpha=0.5, gamma=0.9, beta=10.0)
    fmt = et.format_for(ep, "ad-step", 100)
    model = ADTransformer(ADConfig(fmt.to_dict(), d_model=64, n_layers=4, n_heads=4, d_mlp=256)).eval()
    return ep, fmt, model


def forward(ep, fmt, model, batch: int):
    import numpy as np
    import torch

    from icrl_interp.models import episode_tokens as et

    def run():
        t0 = time.perf_counter()
        with torch.no_grad():
            for lo in range(0, ep.n_histories, batch):
                tokens, _ = et.encode(ep.select(np.arange(lo, min(lo + batch, ep.n_histories))), fmt)
                model(torch.from_numpy(tokens))
        return time.perf_counter() - t0
    return run


def record(ep, model, batch: int, out: Path):
    from icrl_interp.recording.episodes import record_episodes

    def run():
        out.unlink(missing_ok=True)
        t0 = time.perf_counter()
        record_episodes(model, ep, out, baseline="none", batch_size=batch, progress=False)
        return time.perf_counter() - t0
    return run


def peak_rss_mib(histories: int, steps: int, batch: int) -> tuple[float, float]:
    """(peak RSS with the histories collected and the model built, peak RSS after recording them), MiB."""
    out = subprocess.run([sys.executable, __file__, "--child", str(histories), str(steps), str(batch)],
                         capture_output=True, text=True, check=True)
    before, after = out.stdout.strip().splitlines()[-1].split()
    return int(before) / 1024, int(after) / 1024


def child(histories: int, steps: int, batch: int) -> None:
    from bench_record import _peak_rss_kib

    ep, fmt, model = setup(histories, steps)
    before = _peak_rss_kib()
    with tempfile.TemporaryDirectory() as tmp:
        record(ep, model, batch, Path(tmp) / "r.h5")()
    print(before, _peak_rss_kib())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--histories", type=int, default=1000, help="learning histories recorded")
    ap.add_argument("--steps", type=int, default=500, help="steps per history")
    ap.add_argument("--batch-size", type=int, default=25, help="histories per batch")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (each runs both sides)")
    ap.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    if args.child:
        return child(*args.child)
    import torch

    from bench_targets import rounds

    torch.set_num_threads(1)  # the recorder's writer thread gets the other core, as in bench_targets' "one"
    print(f"{args.histories} histories x {args.steps} steps, 4-layer AD (d 64, ad-step, context 100), "
          f"{os.cpu_count()} CPUs, {args.repeats} rounds")
    if args.repeats > 0:
        ep, fmt, model = setup(args.histories, args.steps)
        with tempfile.TemporaryDirectory() as tmp:
            pairs = rounds(forward(ep, fmt, model, args.batch_size),
                           record(ep, model, args.batch_size, Path(tmp) / "r.h5"), args.repeats)
        ratios = [r / f for f, r in pairs]
        f_med, r_med = (statistics.median(x) for x in zip(*pairs))
        print(f"record / forward: {statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}] "
              f"(target <= 2x): forward {f_med:.1f} s, record {r_med:.1f} s")
    small = max(1, args.histories // 10)
    rss = {n: peak_rss_mib(n, args.steps, args.batch_size) for n in (small, args.histories)}
    growth = {n: after - before for n, (before, after) in rss.items()}
    print(f"peak RSS (histories in memory -> after recording): {small} histories {rss[small][0]:.0f} -> "
          f"{rss[small][1]:.0f} MiB, {args.histories} histories {rss[args.histories][0]:.0f} -> {rss[args.histories][1]:.0f} "
          f"MiB; the recording's own peak {growth[small]:.0f} vs {growth[args.histories]:.0f} MiB "
          f"({growth[args.histories] / growth[small]:.2f}x), whole process {rss[args.histories][1] / rss[small][1]:.2f}x")


if __name__ == "__main__":
    main()
