"""Recorder overhead and write throughput, measured side by side in one run.

    python benchmarks/bench_record.py [--prompts 8192] [--n 64] [--batch-size 512]

Rows, on the same prompts and the same hooks (the family's shipped probe spec):
  (1) plain forward passes;
  (2) forward + our recorder streaming to HDF5;
  (3) TransformerLens run_with_cache of the same hooks, then torch.save of the cache;
  (4) raw sequential write of the same activation bytes (numpy.ndarray.tofile).
Then peak RSS of a recording of 1,000 vs 100,000 prompts (separate processes).
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from icrl_interp.models import checkpoint
from icrl_interp.recording import probe_spec, recorder
from icrl_interp.models import theta_star_model


def _model_and_prompts(args):
    model = theta_star_model(args.family, d=args.d, n_layers=args.layers, dtype="float32")
    config = checkpoint.make_config(model.config, {"task": {"kind": "boyan", "n": args.n, "n_states": 10,
                                                            **({"features": "onehot"} if args.family == "softmax-td" else {})},
                                                   "origin": model.origin})
    z = config.sample(args.prompts, 0).prompt.z.astype(np.float32)
    return model, config, z


def _best(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench(args) -> None:
    torch.set_num_threads(args.threads)
    model, config, z = _model_and_prompts(args)
    spec = probe_spec.shipped_spec(args.family)
    hooks, _ = spec.resolve(list(model.hook_dict), dict(model.named_parameters()))
    names = list(hooks)
    zt = torch.from_numpy(z)
    B = args.batch_size
    tmp = Path(tempfile.mkdtemp(prefix="bench_record_"))

    def plain():
        with torch.no_grad():
            for i in range(0, len(z), B):
                model(zt[i : i + B])

    def ours():
        out = tmp / "ours.h5"
        out.unlink(missing_ok=True)
        src = recorder.PromptSource(config=None, arrays={"prompts/z": z}, n_total=len(z))
        return recorder.record(model, out, spec, src, batch_size=B, progress=False)

    def tl_cache():
        parts: dict[str, list] = {n: [] for n in names}
        with torch.no_grad():
            for i in range(0, len(z), B):
                _, cache = model.run_with_cache(zt[i : i + B], names_filter=names)
                for n in names:
                    parts[n].append(cache[n])
        torch.save({n: torch.cat(v) for n, v in parts.items()}, tmp / "tl.pt")

    summary = ours()
    act_bytes = summary.bytes_written
    blob = np.empty(act_bytes // 4, dtype=np.float32)
    blob[:] = 1.0

    def raw():
        with open(tmp / "raw.bin", "wb") as f:
            blob.tofile(f)
            f.flush()
            os.fsync(f.fileno())

    t_plain = _best(plain, args.repeats)
    t_ours = _best(ours, args.repeats)
    t_tl = _best(tl_cache, args.repeats)
    t_raw = _best(raw, args.repeats)
    mb = act_bytes / 2**20
    print(f"\nrecorder benchmark: family {args.family}, {len(z)} prompts of {z.shape[1]} positions, batch {B}, "
          f"{len(names)} hooks, {mb:.1f} MiB of activations, torch threads {args.threads}")
    print(f"{'':38s} {'seconds':>9s} {'MiB/s':>9s}")
    for label, t in (("(1) plain forward", t_plain), ("(2) forward + recorder -> HDF5", t_ours),
                     ("(3) TL run_with_cache + torch.save", t_tl), ("(4) raw ndarray.tofile (same bytes)", t_raw)):
        rate = "" if label.startswith("(1)") else f"{mb / t:9.1f}"
        print(f"{label:38s} {t:9.3f} {rate:>9s}")
    write_only = max(t_ours - t_plain, 1e-9)
    print(f"\n(2)/(1) recorder overhead vs plain forward: {t_ours / t_plain:.2f}x   (target <= 1.5x)")
    print(f"(2)/(3) recorder vs TL cache + torch.save:   {t_ours / t_tl:.2f}x   (target <= 1.0x)")
    print(f"recorder write throughput (bytes / time beyond the forward): {mb / write_only:.0f} MiB/s "
          f"= {100 * (mb / write_only) / (mb / t_raw):.0f}% of raw {mb / t_raw:.0f} MiB/s   (target >= 70%)")
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()


def _rss_child(n_prompts: int) -> None:
    model = theta_star_model("linear-td", d=4, n_layers=3, dtype="float32")
    config = checkpoint.make_config(model.config, {"task": {"kind": "boyan", "n": 30, "n_states": 10}, "origin": model.origin})
    with tempfile.TemporaryDirectory() as d:
        recorder.record(model, Path(d) / "r.h5", probe_spec.shipped_spec("linear-td"),
                        recorder.PromptSource(config=config, n_total=n_prompts), batch_size=500, progress=False)
    print(_peak_rss_kib())


def _peak_rss_kib() -> int:
    """Peak RSS of this process image. VmHWM, unlike ru_maxrss, is not inherited across exec."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def bench_memory() -> None:
    rss = {}
    for n in (1_000, 100_000):
        out = subprocess.run([sys.executable, __file__, "--rss-child", str(n)], capture_output=True, text=True, check=True)
        rss[n] = int(out.stdout.strip().splitlines()[-1]) / 1024
    print(f"\npeak RSS recording linear-td (d=4, L=3, n=30, batch 500): 1,000 prompts {rss[1_000]:.0f} MiB, "
          f"100,000 prompts {rss[100_000]:.0f} MiB (difference {rss[100_000] - rss[1_000]:+.0f} MiB)")


def workload_parser(doc: str, prompts: int, n: int, batch_size: int, repeats: int) -> argparse.ArgumentParser:
    """The options of a θ* workload benchmark (this one and bench_live.py): model, prompts, repeats,
    threads, and the hidden per-process memory measurement."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="softmax-td", choices=["linear-td", "softmax-td"])
    p.add_argument("--prompts", type=int, default=prompts)
    p.add_argument("--n", type=int, default=n, help="context length")
    p.add_argument("--d", type=int, default=10)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--rss-child", type=int, help=argparse.SUPPRESS)
    return p


def main() -> None:
    p = workload_parser(__doc__, prompts=8192, n=64, batch_size=512, repeats=3)
    args = p.parse_args()
    if args.rss_child:
        _rss_child(args.rss_child)
        return
    bench(args)
    if not args.skip_memory:
        bench_memory()


if __name__ == "__main__":
    main()
