"""Forward time of the linear-attention TD model vs context length n, quadratic vs associative order.

    .venv/bin/python benchmarks/bench_linear_attention.py [--d 4] [--layers 3] [--batch 32]

The quadratic order builds the [pos, pos] kernel Z^T Q Z (O(n^2 D) per layer); the
associative order builds the [D, D] matrix Z M Z^T first (O(n D^2 + D^3)). The table
shows both times, their ratio, and how each grows when n doubles (4x = quadratic,
2x = linear). Not a test: timings depend on the machine.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from tqdm import tqdm

from icrl_interp.models import ModelConfig, associative_is_cheaper, build_model


def _time(model, z, repeats: int) -> float:
    """Median wall time of one forward pass, in milliseconds."""
    times = []
    with torch.no_grad():
        model(z)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            model(z)
            if z.is_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d", type=int, default=4, help="feature dimension (D = 2d + 1)")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--ns", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256, 512, 1024, 2048])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 = steadier numbers)")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = build_model(ModelConfig("linear-td", args.d, n_layers=args.layers, dtype=args.dtype), seed=0, gain=0.5)
    model.to(args.device)
    D = model.config.D
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in tqdm(args.ns, desc="context lengths", leave=False):
        z = (torch.rand(args.batch, n + 1, D, generator=gen, dtype=model.dtype) * 2 - 1).to(args.device)
        times, outs = {}, {}
        for path in ("quadratic", "associative"):
            model.set_attention_path(path)
            times[path] = _time(model, z, args.repeats)
            with torch.no_grad():
                outs[path] = model(z)
        diff = (outs["quadratic"] - outs["associative"]).abs().max().item()
        rows.append((n, times["quadratic"], times["associative"], diff, associative_is_cheaper(n + 1, D)))
    print(f"linear-td forward: d = {args.d} (D = {D}), {args.layers} layers, batch {args.batch}, {args.dtype}, "
          f"{args.device}, {args.threads} thread(s), median of {args.repeats}")
    print(f"{'n':>6} {'quadratic ms':>13} {'associative ms':>15} {'quad/assoc':>11} {'quad x':>7} {'assoc x':>8} "
          f"{'max |diff|':>11}  auto picks")
    prev = None
    for n, tq, ta, diff, assoc in rows:
        grow_q = f"{tq / prev[1]:7.2f}" if prev else f"{'':>7}"
        grow_a = f"{ta / prev[2]:8.2f}" if prev else f"{'':>8}"
        print(f"{n:6d} {tq:13.3f} {ta:15.3f} {tq / ta:11.2f} {grow_q} {grow_a} {diff:11.2e}  "
              f"{'associative' if assoc else 'quadratic'}")
        prev = (n, tq, ta)
    print("quad x / assoc x: time ratio to the previous row (n doubles: ~4 = quadratic growth, ~2 = linear)")


if __name__ == "__main__":
    main()
