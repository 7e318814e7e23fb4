"""Excitation of the tabular-MDP feature maps (Liang & Lai's Assumption 1), measured.

    python reproductions/excitation.py [--prompts 2048] [--json out.json]

For each feature map, 2048 prompts of the SARSA training distribution (9 states x 4 actions, gamma 0.5,
n = 64, w ~ N(0, 0.25 I), uniform behaviour) and the smallest / largest eigenvalues of the second moments
`icrl_interp.tasks.sampling.excitation` measures: E[x x^T] of the transition columns, the Bellman regression
matrix E[R^T R] (R = (1/n) sum phi_i x_i^T), the TD target E[b b^T] (b = (1/n) sum x_i delta_i), and the
one-hot blind direction u^T E[x x^T] u / u^T u. With uniform behaviour w is independent of the trajectory,
so the Gauss-Newton curvature of the teacher-mimicking loss at theta* is alpha^2 E[R^T R] (x) E[w~ w~^T] on
P12 and E[b b^T] (x) I_d on V21bar: the smallest eigenvalues below are the curvatures of the slowest
directions (0: not identifiable).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from icrl_interp.tasks import sampling
from icrl_interp.train.recipes import sarsa as S
from icrl_interp.train import config_for

MAPS = [
    ("one-hot (d = 36)", dict(sa_features="onehot")),
    ("gaussian, d = 36", dict(sa_features="gaussian", d=36)),
    ("uniform, d = 36", dict(sa_features="uniform", d=36)),
    ("gaussian, d = 36, rho = 0.5", dict(sa_features="gaussian", d=36, sa_randomness=0.5)),
    ("gaussian, d = 36, rho = 0.2", dict(sa_features="gaussian", d=36, sa_randomness=0.2)),
    ("gaussian, d = 36, rho = 0.1", dict(sa_features="gaussian", d=36, sa_randomness=0.1)),
    ("gaussian, d = 36, rho = 0.05", dict(sa_features="gaussian", d=36, sa_randomness=0.05)),
    ("gaussian, d = 36, rho = 0 (fixed map = one-hot)", dict(sa_features="gaussian", d=36, sa_randomness=0.0)),
    ("gaussian, d = 8", dict(sa_features="gaussian", d=8)),
]


def measure(prompts: int, seed: int = 0) -> list[dict]:
    rows = []
    for label, kw in MAPS:
        cfg = config_for("sarsa", dtype="float64", **kw)
        batch = S.sample_sarsa(cfg, np.random.default_rng([seed, 7]), prompts)
        model_layout = S.TRAINING.model_config(cfg).layout
        ex = sampling.excitation(batch.z.numpy(), model_layout, cfg.gamma)
        rows.append({"map": label, **kw, **ex})
    return rows


def table(rows: list[dict]) -> str:
    head = ("| feature map | λmin E[xxᵀ] | λmin E[RᵀR] | λmin E[bbᵀ] | λmin E[w̃w̃ᵀ] | uᵀE[xxᵀ]u/uᵀu |\n"
            "|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['map']} | {r['columns']['min']:.2e} | {r['regression']['min']:.2e} | "
                     f"{r['td_target']['min']:.2e} | {r['params']['min']:.3f} | {r['blind_u']:.2e} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=2048)
    ap.add_argument("--json")
    args = ap.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    rows = measure(args.prompts)
    print(table(rows))
    print(f"wall {time.perf_counter() - t0:.1f} s, CPU {time.process_time() - c0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
