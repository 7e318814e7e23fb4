"""Training throughput per family at the reproduction configurations (not a timed test).

    .venv/bin/python benchmarks/bench_train.py            # all families, short runs
    .venv/bin/python benchmarks/bench_train.py --full     # the complete Wang run (4000 tasks) + held-out VD/SS/IWS

Prints tasks/s and optimizer steps/s. Wang et al.'s public code runs one 9 x 31 prompt at a
time (65 forward passes per optimizer step, one task per 5 steps): about 0.32 s per task,
~21 minutes for 4000 tasks. Here one step batches all windows of `tasks_per_step` tasks.
"""
from __future__ import annotations

import argparse
import tempfile
import time

from icrl_interp.train import config_for, train

# The reproduction configurations (docs/reproductions.md); steps shortened unless --full.
REPRO = {
    "linear-td": dict(steps=400, tasks_per_step=10, lr=2e-2, lr_decay=0.99, lr_decay_every=10, eval_tasks=256),
    "softmax-td": dict(steps=2000, eval_tasks=256),
    "sarsa": dict(steps=1500, batch=64, lr=3e-3, lr_decay=0.99, lr_decay_every=50, eval_tasks=256),
}


def tasks_per_step(cfg) -> int:
    return cfg.tasks_per_step if cfg.family == "linear-td" else cfg.batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="run the whole Wang configuration and evaluate it")
    ap.add_argument("--steps", type=int, default=40, help="steps per family for the throughput runs")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import icrl_interp.models.build  # noqa: F401  (import the models before timing)
    print(f"{'family':<11} {'steps':>6} {'tasks':>6} {'seconds':>8} {'steps/s':>8} {'tasks/s':>8}")
    families = ["linear-td"] if args.full else list(REPRO)
    for family in families:
        kw = dict(REPRO[family])
        if not args.full:
            kw["steps"] = args.steps
        cfg = config_for(family, **kw, checkpoint_every=10**6, log_every=10**6)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            run = train(cfg, tmp, progress=False, evaluate=False, threads=args.threads)
            secs = time.perf_counter() - t0
        n_tasks = cfg.steps * tasks_per_step(cfg)
        print(f"{family:<11} {cfg.steps:>6} {n_tasks:>6} {secs:>8.2f} {cfg.steps / secs:>8.1f} {n_tasks / secs:>8.1f}")
        if args.full:
            from icrl_interp.train import evaluate as E
            import numpy as np

            m = E.evaluate(run.model, cfg, np.random.default_rng([cfg.seed, 2]))
            print(f"held-out ({cfg.eval_tasks} tasks): VD {m['VD']:.4f}  SS {m['SS']:.3f}  IWS {m['IWS']:.3f}   "
                  f"(Wang et al.'s code: ~1260 s for 4000 tasks; reported SS/IWS 0.9-0.95, VD 0.02-0.05)")


if __name__ == "__main__":
    main()
