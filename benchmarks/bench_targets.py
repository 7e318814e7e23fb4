"""The speed and memory targets (docs/benchmarks.md, "Targets"), each printed as a ratio.

    python benchmarks/bench_targets.py [--repeats 5] [--only live,record,analyze,construct,threads,rss]

Every figure is a ratio of two measurements taken side by side: in each of --repeats rounds both sides
run back to back, in alternating order from round to round, so a change in the machine's load hits
both; the figure printed is the median of the rounds' ratios (min and max beside it). Every figure is
measured twice: with one BLAS and torch thread (threadpoolctl limits in this process, the usual
environment variables in child processes) and with the package's default settings.

figures (target):
  live       live analysis / (plain forward + the prompt source)        <= 3x
             (softmax-td theta*, d 10, L 4, n 32, 2048 prompts, no random-init baseline); the rest of
             the live time is printed as a breakdown
  record     record to HDF5 / plain forward (softmax-td theta*, 12 hooks)  <= 1.3x
             (beside it the floor no recorder can beat on this machine: max(forward, raw write) / forward,
             and max(forward, the disk's fsync time, CPU of forward + page-cache copy / cores) / forward)
  hdf5       HDF5 write speed (activation bytes / (record - forward)) / raw tofile + fsync of the same
             bytes                                                        >= 80 %
  analyze    analyze a recording / read its datasets once, page cache evicted before each  <= 2x
  construct  CPU time of `icrl-interp construct linear-td` / `python -c "import torch"`  <= 1.5x
  threads    an analysis confined to one core (sched_setaffinity): default settings / one thread  <= 1x
  rss        peak RSS of `analyze --live` (linear-td) at 100k prompts / at 1k prompts (one run each:
             a 100k-prompt run takes minutes)                              <= 1.2x
"""
from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

ONE_THREAD_ENV = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "ICRL_INTERP_THREADS")}
"""The environment of a child process limited to one BLAS/OpenMP thread."""
FIGURES = ("live", "record", "hdf5", "analyze", "construct", "threads", "rss")
TARGETS = {"live": ("<=", 3.0), "record": ("<=", 1.3), "hdf5": (">=", 0.80), "analyze": ("<=", 2.0),
           "construct": ("<=", 1.5), "threads": ("<=", 1.0), "rss": ("<=", 1.2)}


# ------------------------------------------------------------------ thread settings
@contextlib.contextmanager
def threads(setting: str):
    """'one': one BLAS and torch thread in this process; 'default': whatever the package sets."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    if setting == "one":
        torch.set_num_threads(1)
        with threadpool_limits(limits=1):
            yield
        torch.set_num_threads(before)
    else:
        yield


def child_env(setting: str) -> dict:
    env = dict(os.environ)
    if setting == "one":
        env.update(ONE_THREAD_ENV)
    else:
        for k in ONE_THREAD_ENV:
            env.pop(k, None)
    return env


# ------------------------------------------------------------------ side-by-side timing
def rounds(a, b, repeats: int) -> list[tuple[float, float]]:
    """(value of a, value of b) per round; a and b swap order every round."""
    out = []
    for i in range(repeats):
        if i % 2 == 0:
            va = a()
            vb = b()
        else:
            vb = b()
            va = a()
        out.append((va, vb))
    return out


def wall(fn):
    def timed():
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return timed


def summary(ratios: list[float]) -> tuple[float, float, float]:
    return statistics.median(ratios), min(ratios), max(ratios)


# ------------------------------------------------------------------ the figures
def softmax_workload(prompts: int, n: int):
    from bench_record import _model_and_prompts

    args = argparse.Namespace(family="softmax-td", d=10, layers=4, n=n, prompts=prompts)
    return _model_and_prompts(args)


def plain_forward(model, z, batch: int):
    import torch

    zt = torch.from_numpy(z)

    def run():
        with torch.no_grad():
            for i in range(0, len(z), batch):
                model(zt[i : i + batch])
    return run


def fig_live(setting: str, repeats: int) -> dict:
    from icrl_interp.analyzers.analyze import analyze_model
    from icrl_interp.recording import probe_spec, recorder

    prompts, batch = 2048, 256
    model, config, z = softmax_workload(prompts, 32)
    spec = probe_spec.shipped_spec("softmax-td")
    plain = wall(plain_forward(model, z, batch))

    def source():
        s = recorder.PromptSource(config=config, n_total=prompts)
        for index in range(-(-prompts // batch)):
            s.batch(index, index * batch, min((index + 1) * batch, prompts))
    source_t = wall(source)
    live = wall(lambda: analyze_model(model, config, tasks=prompts, batch_size=batch, baseline="none", probe=spec))
    with threads(setting):
        live()  # warm-up: first-call imports and allocations are not the steady state
        parts = []
        for i in range(repeats):
            order = [plain, source_t, live] if i % 2 == 0 else [live, source_t, plain]
            t = {id(f): f() for f in order}
            parts.append((t[id(plain)], t[id(source_t)], t[id(live)]))
    ratios = [lv / (p + s) for p, s, lv in parts]
    med = np.median(np.array(parts), axis=0)
    return {"ratios": ratios, "detail": f"forward {med[0]:.3f} s, prompt source {med[1]:.3f} s, live {med[2]:.3f} s: "
                                        f"analysis beyond both {med[2] - med[0] - med[1]:.3f} s"}


def record_floors(forward: float, forward_cpu: float, raw: float, copy_cpu: float, disk: float,
                  cores: int) -> tuple[float, float]:
    """What no recorder can beat, as ratios to the forward's wall time: (1) the forward or the raw write of
    the same bytes (`tofile` + fsync, one after the other), whichever is longer; (2) the lower bounds the
    parts give when they overlap perfectly: the forward itself, the disk's own time for the bytes (the
    fsync after the copy), and the CPU work of the forward and of the copy into the page cache spread over
    the `cores` the process may use."""
    return max(forward, raw) / forward, max(forward, disk, (forward_cpu + copy_cpu) / cores) / forward


def fig_record(setting: str, repeats: int) -> tuple[dict, dict]:
    """(record / forward, HDF5 write speed / raw write speed): one run feeds both."""
    from icrl_interp.recording import probe_spec, recorder

    prompts, batch = 8192, 512
    model, config, z = softmax_workload(prompts, 64)
    spec = probe_spec.shipped_spec("softmax-td")
    tmp = Path(tempfile.mkdtemp(prefix="bench_targets_"))
    forward = plain_forward(model, z, batch)
    written, cpu = {}, {"forward": [], "record": []}  # CPU seconds of each call (every thread of this process)
    faults = []  # minor page faults of each recording (fresh pages the heap grows into: docs/benchmarks.md, "Recorder")

    def plain():
        c0 = time.process_time()
        forward()
        cpu["forward"].append(time.process_time() - c0)
    plain = wall(plain)

    def record_t():
        """Seconds of one recording; deleting the last round's file (739 MiB, ≈ 0.03 s) is not timed."""
        out = tmp / "r.h5"
        out.unlink(missing_ok=True)
        src = recorder.PromptSource(config=None, arrays={"prompts/z": z}, n_total=len(z))
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        c0, t0 = time.process_time(), time.perf_counter()
        written["bytes"] = recorder.record(model, out, spec, src, batch_size=batch, progress=False).bytes_written
        cpu["record"].append(time.process_time() - c0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        return time.perf_counter() - t0
    try:
        with threads(setting):
            record_t()
            blob = np.ones(written["bytes"] // 4, dtype=np.float32)

            raw_parts = []  # per call: (CPU of the copy into the page cache, wall of the fsync after it)

            def raw():
                with open(tmp / "raw.bin", "wb") as f:
                    c0 = time.process_time()
                    blob.tofile(f)
                    f.flush()
                    c1, t1 = time.process_time(), time.perf_counter()
                    os.fsync(f.fileno())
                    raw_parts.append((c1 - c0, time.perf_counter() - t1))
            raw_t = wall(raw)
            parts = []
            for i in range(repeats):
                order = [plain, record_t, raw_t] if i % 2 == 0 else [raw_t, record_t, plain]
                t = {id(f): f() for f in order}
                parts.append((t[id(plain)], t[id(record_t)], t[id(raw_t)]))
    finally:
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()
    mib = written["bytes"] / 2**20
    med = np.median(np.array(parts), axis=0)
    cores = len(os.sched_getaffinity(0))
    floors = [record_floors(p, fc, w, copy, disk, cores)
              for (p, _, w), fc, (copy, disk) in zip(parts, cpu["forward"], raw_parts)]
    floor_raw, floor_parts = [f for f, _ in floors], [f for _, f in floors]
    record = {"ratios": [r / p for p, r, _ in parts],
              "detail": f"forward {med[0]:.3f} s, record {med[1]:.3f} s, {mib:.0f} MiB of activations; "
                        f"CPU forward {np.median(cpu['forward']):.3f} s, record {np.median(cpu['record'][1:]):.3f} s; "
                        f"record minor faults {np.median(faults[1:]):.0f}; "
                        f"floor max(forward, raw)/forward {np.median(floor_raw):.2f}x, "
                        f"max(forward, disk {np.median([d for _, d in raw_parts]):.3f} s, CPU of forward + copy "
                        f"{np.median([c for c, _ in raw_parts]):.3f} s over {cores} cores)/forward "
                        f"{np.median(floor_parts):.2f}x"}
    hdf5 = {"ratios": [w / max(r - p, 1e-9) for p, r, w in parts],
            "detail": f"HDF5 beyond the forward {mib / max(med[1] - med[0], 1e-9):.0f} MiB/s, raw tofile+fsync "
                      f"{mib / med[2]:.0f} MiB/s"}
    return record, hdf5


def fig_analyze(setting: str, repeats: int, gb: float) -> dict:
    from bench_analyze import evict, make_recording, read_everything
    from icrl_interp.analyzers.analyze import analyze

    with tempfile.TemporaryDirectory(prefix="bench_targets_") as tmp:
        path = Path(tmp) / "big.h5"
        make_recording(path, gb)

        def cold(fn):
            def run():
                evict(path)
                t0 = time.perf_counter()
                fn()
                return time.perf_counter() - t0
            return run
        with threads(setting):
            pairs = rounds(cold(lambda: analyze(path)), cold(lambda: read_everything(path, 128.0)), repeats)
        size = os.path.getsize(path) / 1e9
    med_a, med_r = np.median(np.array(pairs), axis=0)
    return {"ratios": [a / r for a, r in pairs],
            "detail": f"{size:.2f} GB: read {med_r:.2f} s, analyze {med_a:.2f} s (cache evicted before each)"}


def child_cpu(cmd: list[str], env: dict, affinity: set | None = None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of a child process (user + system, from RUSAGE_CHILDREN)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    pre = (lambda: os.sched_setaffinity(0, affinity)) if affinity else None
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, preexec_fn=pre)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, time.perf_counter() - t0


def fig_construct(setting: str, repeats: int) -> dict:
    env = child_env(setting)
    cli = str(Path(sys.executable).with_name("icrl-interp"))
    with tempfile.TemporaryDirectory(prefix="bench_targets_") as tmp:
        construct = [cli, "construct", "linear-td", "--out", str(Path(tmp) / "ck"), "--force"]
        pairs = rounds(lambda: child_cpu(construct, env), lambda: child_cpu([sys.executable, "-c", "import torch"], env),
                       repeats)
    cpu_c = statistics.median(c[0] for c, _ in pairs)
    cpu_t = statistics.median(t[0] for _, t in pairs)
    return {"ratios": [c[0] / t[0] for c, t in pairs],
            "detail": f"CPU: construct {cpu_c:.2f} s, import torch {cpu_t:.2f} s (wall ratio "
                      f"{statistics.median(c[1] / t[1] for c, t in pairs):.2f})"}


def fig_threads(setting: str, repeats: int) -> dict:
    """An analysis confined to one core: the package's default thread settings vs one thread. `setting`
    is not used (this figure compares the two settings itself)."""
    with tempfile.TemporaryDirectory(prefix="bench_targets_") as tmp:
        rec = Path(tmp) / "r.h5"
        subprocess.run([sys.executable, __file__, "--child", "make-small", str(rec)], check=True)
        cmd = [sys.executable, __file__, "--child", "analyze", str(rec)]
        core = {min(os.sched_getaffinity(0))}
        pairs = rounds(lambda: child_cpu(cmd, child_env("default"), core)[1],
                       lambda: child_cpu(cmd, child_env("one"), core)[1], repeats)
    med = np.median(np.array(pairs), axis=0)
    return {"ratios": [d / o for d, o in pairs],
            "detail": f"one core: default {med[0]:.2f} s, one thread {med[1]:.2f} s (whole process, wall)"}


def fig_rss(setting: str, repeats: int, big: int) -> dict:
    env = child_env(setting)
    rss = {}
    for n in (1_000, big):
        out = subprocess.run([sys.executable, __file__, "--child", "rss", str(n)], env=env, capture_output=True,
                             text=True, check=True)
        rss[n] = int(out.stdout.strip().splitlines()[-1]) / 1024
    return {"ratios": [rss[big] / rss[1_000]],
            "detail": f"peak RSS: 1,000 prompts {rss[1_000]:.0f} MiB, {big:,} prompts {rss[big]:.0f} MiB (one run each)"}


# ------------------------------------------------------------------ children
def child(kind: str, arg: str) -> None:
    if kind == "make-small":
        from bench_analyze import make_recording

        make_recording(Path(arg), 0.1)
    elif kind == "analyze":
        from icrl_interp.analyzers.analyze import analyze

        analyze(Path(arg))
    elif kind == "rss":
        from bench_record import _peak_rss_kib
        from icrl_interp.analyzers.analyze import analyze_model
        from icrl_interp.models import checkpoint, theta_star_model

        model = theta_star_model("linear-td", d=4, n_layers=3, dtype="float32")
        config = checkpoint.make_config(model.config, {"task": {"kind": "boyan", "n": 30, "n_states": 10},
                                                       "origin": model.origin})
        analyze_model(model, config, tasks=int(arg), batch_size=500, baseline="none")
        print(_peak_rss_kib())


# ------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="rounds per figure (>= 5 for the documented numbers)")
    ap.add_argument("--only", default=",".join(FIGURES), help="comma-separated figures to measure")
    ap.add_argument("--gb", type=float, default=1.0, help="size of the analyze figure's recording")
    ap.add_argument("--rss-prompts", type=int, default=100_000, help="prompts of the rss figure's large run")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    only = [f for f in args.only.split(",") if f]
    unknown = sorted(set(only) - set(FIGURES))
    if unknown:
        ap.error(f"unknown figure(s) {', '.join(unknown)} (known: {', '.join(FIGURES)})")
    print(f"{os.cpu_count()} CPUs (this process may use {len(os.sched_getaffinity(0))}), load average "
          f"{os.getloadavg()[0]:.1f}; {args.repeats} rounds per figure, median [min, max] of the rounds' ratios")
    print(f"{'figure':10s} {'threads':8s} {'median':>8s} {'min':>8s} {'max':>8s}  target  met  detail")
    for setting in ("one", "default"):
        results = {}
        if "live" in only:
            results["live"] = fig_live(setting, args.repeats)
        if "record" in only or "hdf5" in only:
            results["record"], results["hdf5"] = fig_record(setting, args.repeats)
        if "analyze" in only:
            results["analyze"] = fig_analyze(setting, args.repeats, args.gb)
        if "construct" in only:
            results["construct"] = fig_construct(setting, args.repeats)
        if "threads" in only and setting == "default":
            results["threads"] = fig_threads(setting, args.repeats)
        if "rss" in only:
            results["rss"] = fig_rss(setting, args.repeats, args.rss_prompts)
        for name in FIGURES:
            if name not in results or name not in only:
                continue
            med, lo, hi = summary(results[name]["ratios"])
            op, target = TARGETS[name]
            met = med <= target if op == "<=" else med >= target
            label = "both" if name == "threads" else setting
            print(f"{name:10s} {label:8s} {med:8.2f} {lo:8.2f} {hi:8.2f}  {op}{target:<4g}  {'yes' if met else 'NO':3s}  "
                  f"{results[name]['detail']}", flush=True)


if __name__ == "__main__":
    main()
