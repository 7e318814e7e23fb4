"""Fan-out on dask.distributed: a sweep serial vs on a LocalCluster, and a report's analyses over
many inputs with 1, 2 and 4 workers (not a timed test; docs/benchmarks.md, docs/cluster.md).

    .venv/bin/python benchmarks/bench_cluster.py                   # 8 runs x 8 checkpoints = 64 report inputs
    .venv/bin/python benchmarks/bench_cluster.py --runs 4 --checkpoints 4 --steps 8

For each scheduler the table gives the start-up (a LocalCluster of N workers started and every worker
made to import the package's models and torch: what a fresh cluster pays once) and
the work on the warm cluster, reached as an existing one (`--scheduler tcp://...`). `serial` runs in
this process, which imported the same modules before timing.

1. Sweep: `--runs` short linear-td runs (seeds 0..runs-1), serial against local:2 and local:4; every
   scheduler must give byte-identical checkpoints (checked).
2. Report: the runs' checkpoints (`--runs` x `--checkpoints` inputs) analyzed by `run_batch` without
   the cache, serial against local:1, local:2 and local:4; the summaries must be byte-identical
   (checked). Ratios: serial work time / work time, and serial / (start-up + work).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def grid_text(runs: int, steps: int, checkpoints: int) -> str:
    return f"""family = "linear-td"
seeds = {list(range(runs))}
[base]
d = 3
n_states = 5
n = 10
n_layers = 2
windows = 8
trajectories_per_task = 2
tasks_per_step = 4
eval_tasks = 16
steps = {steps}
checkpoint_every = {max(1, steps // checkpoints)}
log_every = {max(1, steps // checkpoints)}
[grid]
lr = [0.01]
"""


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name.endswith(".safetensors"):
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def sweep(grid: Path, out: Path, scheduler: str) -> float:
    import contextlib
    import io

    from icrl_interp import cli

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(["sweep", str(grid), "--out", str(out), "--scheduler", scheduler, "--no-report",
                         "--no-progress", "--no-eval"])
    assert code == 0, f"sweep on {scheduler} failed"
    return time.perf_counter() - t0


def analyses(inputs: list[str], out: Path, engine) -> tuple[float, str]:
    from icrl_interp.report.batch import collect_inputs, run_batch, summary_json

    t0 = time.perf_counter()
    results = run_batch(collect_inputs(inputs), out, engine=engine, use_cache=False, progress=False, control=None)
    secs = time.perf_counter() - t0
    assert all(r.status in ("ok", "partial") for r in results), "an analysis failed"
    return secs, summary_json(results).replace(str(out), "OUT")


def _warm_up() -> None:
    import icrl_interp.analyzers.analyze  # noqa: F401
    import icrl_interp.models.build  # noqa: F401
    import icrl_interp.train.trainer  # noqa: F401


def started(workers: int):
    """(engine context, seconds to start it and import the models on every worker); serial for 0."""
    from icrl_interp.core.cluster import open_engine

    t0 = time.perf_counter()
    ctx = open_engine(f"local:{workers}" if workers else "serial", announce=None)
    engine = ctx.__enter__()
    if workers:
        engine.client.run(_warm_up)
    return ctx, engine, time.perf_counter() - t0


def row(name: str, startup: float, work: float, base: float) -> str:
    return f"{name:<10} {startup:>9.2f} {work:>8.2f} {base / work:>11.2f} {base / (startup + work):>13.2f}"


HEADER = f"{'scheduler':<10} {'start-up':>9} {'work s':>8} {'serial/work':>11} {'serial/total':>13}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8, help="training runs of the sweep")
    ap.add_argument("--steps", type=int, default=16, help="steps per run")
    ap.add_argument("--checkpoints", type=int, default=8, help="checkpoints per run (report inputs = runs x this)")
    args = ap.parse_args()
    _warm_up()

    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        grid = tmp / "grid.toml"
        grid.write_text(grid_text(args.runs, args.steps, args.checkpoints))
        print(f"\nsweep: {args.runs} linear-td runs of {args.steps} steps")
        print(HEADER)
        base, ref = None, None
        for workers in (0, 2, 4):
            ctx, engine, startup = started(workers)
            try:
                where = engine.client.scheduler_info()["address"] if workers else "serial"
                out = tmp / f"sweep-{workers}"
                secs = sweep(grid, out, where)
            finally:
                ctx.__exit__(None, None, None)
            digest = tree_hash(out / "runs")
            ref = ref or digest
            assert digest == ref, f"local:{workers}: checkpoints differ from the serial sweep's"
            base = base or secs
            print(row(f"local:{workers}" if workers else "serial", startup, secs, base))
        inputs = [str(p) for p in sorted((tmp / "sweep-0" / "runs").glob("*/checkpoints/step_*"))]
        print(f"\nreport analyses: {len(inputs)} checkpoints, no cache")
        print(HEADER)
        base, ref = None, None
        for workers in (0, 1, 2, 4):
            ctx, engine, startup = started(workers)
            try:
                secs, text = analyses(inputs, tmp / f"report-{workers}", engine)
            finally:
                ctx.__exit__(None, None, None)
            ref = ref or text
            assert text == ref, f"local:{workers}: summary differs from the serial one"
            base = base or secs
            print(row(f"local:{workers}" if workers else "serial", startup, secs, base))
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end; every scheduler gave identical checkpoints and summaries")


if __name__ == "__main__":
    main()
