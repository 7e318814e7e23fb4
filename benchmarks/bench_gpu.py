"""Recording and training on a GPU, measured side by side in one run (docs/benchmarks.md, "GPU").

    python benchmarks/bench_gpu.py [--prompts 16384] [--batch-size 1024] [--steps 200]

Needs a CUDA GPU: without one it prints that it skipped, and why, and exits with status 0 (so `make
bench` runs on any machine); nothing is measured on the CPU and called a GPU number. Rows, on the same GPU, the same prompts and the same hooks (the family's
shipped probe spec):

  recording  (1) plain forward passes on the GPU (prompts copied in per batch, outputs left there)
             (2) `recorder.record(..., device="cuda")`: activations copied into pinned host buffers by
                 non-blocking copies, streamed to HDF5 by the writer thread
             (3) TransformerLens `run_with_cache` on the GPU, the cache moved to the CPU, `torch.save`
  training   the reproduction configurations (`bench_train.REPRO`, `--steps` steps each) with
             `train(..., device="cuda")` vs `device="cpu"` (one CPU thread, as the CLI's default)

and prints the ratios (2)/(1), (2)/(3) and CPU/GPU training time per family.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from icrl_interp.models import checkpoint
from icrl_interp.recording import probe_spec, recorder
from icrl_interp.models import theta_star_model
from icrl_interp.train import config_for, train

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import REPRO  # noqa: E402  (the same configurations as the CPU training benchmark)


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_recording(args, tmp: Path) -> None:
    model = theta_star_model(args.family, d=args.d, n_layers=args.layers, dtype="float32")
    task = {"kind": "boyan", "n": args.n, "n_states": 10,
            **({"features": "onehot"} if args.family == "softmax-td" else {})}
    config = checkpoint.make_config(model.config, {"task": task, "origin": model.origin})
    z = config.sample(args.prompts, 0).prompt.z.astype(np.float32)
    spec = probe_spec.shipped_spec(args.family)
    names = list(spec.resolve(list(model.hook_dict), dict(model.named_parameters()))[0])
    B, zt = args.batch_size, torch.from_numpy(z)
    gpu = model.to("cuda")

    def plain():
        with torch.no_grad():
            for i in range(0, len(z), B):
                gpu(zt[i : i + B].to("cuda"))

    def ours():
        out = tmp / "ours.h5"
        out.unlink(missing_ok=True)
        src = recorder.PromptSource(config=None, arrays={"prompts/z": z}, n_total=len(z))
        return recorder.record(gpu, out, spec, src, batch_size=B, progress=False, device="cuda")

    def tl_cache():
        parts: dict[str, list] = {n: [] for n in names}
        with torch.no_grad():
            for i in range(0, len(z), B):
                _, cache = gpu.run_with_cache(zt[i : i + B].to("cuda"), names_filter=names)
                for n in names:
                    parts[n].append(cache[n].cpu())
        torch.save({n: torch.cat(v) for n, v in parts.items()}, tmp / "tl.pt")

    mib = ours().bytes_written / 2**20  # also warms up CUDA and the allocator
    t_plain, t_ours, t_tl = (_best(f, args.repeats) for f in (plain, ours, tl_cache))
    print(f"\nrecording on {torch.cuda.get_device_name()}: {args.family} (d={args.d}, L={args.layers}, "
          f"n={args.n}), {len(z)} prompts, batch {B}, {len(names)} hooks, {mib:.0f} MiB of activations")
    print(f"{'':44s} {'seconds':>9s} {'MiB/s':>9s}")
    for label, t in (("(1) plain forward on the GPU", t_plain), ("(2) recorder --device cuda -> HDF5", t_ours),
                     ("(3) TL run_with_cache + .cpu() + torch.save", t_tl)):
        print(f"{label:44s} {t:9.3f} {'' if label.startswith('(1)') else format(mib / t, '9.0f'):>9s}")
    print(f"(2)/(1) recorder vs plain forward: {t_ours / t_plain:.2f}x")
    print(f"(2)/(3) recorder vs TL cache + save: {t_ours / t_tl:.2f}x")


def bench_training(args, tmp: Path) -> None:
    print(f"\ntraining, {args.steps} steps per family (no evaluation), GPU vs CPU (1 thread)")
    print(f"{'family':<11} {'cpu s':>8} {'cuda s':>8} {'cpu/cuda':>9}")
    for family, kw in REPRO.items():
        cfg = config_for(family, **{**kw, "steps": args.steps, "checkpoint_every": args.steps})
        seconds = {}
        for device in ("cpu", "cuda"):
            t0 = time.perf_counter()
            train(cfg, tmp / f"{family}-{device}", progress=False, evaluate=False, threads=1, device=device)
            seconds[device] = time.perf_counter() - t0
        print(f"{family:<11} {seconds['cpu']:8.2f} {seconds['cuda']:8.2f} {seconds['cpu'] / seconds['cuda']:9.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="softmax-td", choices=["linear-td", "softmax-td"])
    p.add_argument("--prompts", type=int, default=16384)
    p.add_argument("--n", type=int, default=64, help="context length")
    p.add_argument("--d", type=int, default=10)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=200, help="training steps per family")
    p.add_argument("--skip-training", action="store_true")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print(f"bench_gpu: skipped: torch {torch.__version__} sees no CUDA GPU on this machine, so nothing was "
              "measured (run it on a machine with one)", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as d:
        bench_recording(args, Path(d))
        if not args.skip_training:
            bench_training(args, Path(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
