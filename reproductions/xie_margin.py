"""Xie et al. (a): where does the training objective want the kernel, against Assumption 5.1's margin?

    python reproductions/xie_margin.py CHECKPOINT_OR_RUN [--scales 0.5 1 2 4 8] [--n 120 400]
                                       [--layers 6 20] [--refit-steps 150] [--tasks 256] [--json out.json]

Diagonality has one knob in a trained softmax-td model: the scale of its score matrices A (M(s, s) rises
with it). For each scale s the model's A is multiplied by s and frozen, its value rows (V, V_target: the
paper's sparsity pattern) are re-fitted by Adam on the checkpoint's own training objective for
`--refit-steps` steps (fresh Boyan chains each step), and the objective, NEU, the last layer's value error
and the population kernel's diagonal (mean, min, margin over (1 + gamma)/2) are measured on held-out chains.
If the best objective sits at a scale whose kernel is below the margin, and the objective rises as the scale
pushes the kernel past it, the margin is not where this objective's optimum is at this context length,
so longer training cannot reach it; running the same at a longer context `--n`, or with more layers
`--layers` (tied models: the same score applied more times, the value rows scaled by L0 / L before the refit), shows what moves the optimum past the margin. Seeds are fixed: the same command prints the same numbers.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from icrl_interp.models import checkpoint
from icrl_interp.train.recipes import softmax_td as X
from icrl_interp.models.build import empty_model
from icrl_interp.train import config_from_dict, list_checkpoints


def _load(path: Path, layers: int | None = None):
    """(model, training config) of a checkpoint directory or the last checkpoint of a run directory; with
    `layers`, the same tied weights applied that many times."""
    if (path / "checkpoints").is_dir():
        path = list_checkpoints(path)[-1][1]
    model = checkpoint.load(path)
    training = json.loads((path / "config.json").read_text())["training"]
    cfg = config_from_dict({k: v for k, v in training.items() if k != "run_id"})
    if layers is not None and layers != model.config.n_layers:
        if not model.config.tied:
            raise SystemExit("--layers needs a tied model (one set of weights for every layer)")
        deeper = empty_model(dataclasses.replace(model.config, n_layers=layers))
        state = model.state_dict()
        for name in state:  # the same total step over more layers: the value rows start at L0 / L of theirs
            if name.rsplit(".", 1)[-1] in ("V", "V_target"):
                state[name] = state[name] * (model.config.n_layers / layers)
        deeper.load_state_dict(state)
        model, cfg = deeper, dataclasses.replace(cfg, n_layers=layers)
    return model, cfg


def _refit_values(model, cfg, steps: int, seed: int) -> None:
    """Adam on the value rows only (A frozen), within the paper's sparsity masks."""
    objective = X.OBJECTIVES[cfg.objective]
    masks = X.adjust_init(model, dataclasses.replace(cfg, masks=True), torch.Generator().manual_seed(seed))
    free = {n: p for n, p in model.named_parameters() if n.rsplit(".", 1)[-1] in ("V", "V_target")}
    for name, p in model.named_parameters():
        p.requires_grad_(name in free)
    opt = torch.optim.Adam(list(free.values()), lr=1e-2)
    rng = np.random.default_rng([seed, 1])
    for _ in range(steps):
        loss = objective(model, X.sample_state_queries(cfg, rng))
        opt.zero_grad()
        loss.backward()
        for name, p in free.items():
            if name in masks:
                p.grad.mul_(masks[name])
        opt.step()


def scan(path: Path, scales: list[float], contexts: list[int], depths: list[int | None], refit_steps: int, tasks: int,
         seed: int = 0) -> list[dict]:
    torch.manual_seed(seed)
    rows = []
    for L, n, s in [(L, n, s) for L in depths for n in contexts for s in scales]:
        model, cfg = _load(path, L)
        cfg = dataclasses.replace(cfg, n=n, eval_tasks=tasks)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.rsplit(".", 1)[-1] == "A":
                    p.mul_(s)
        _refit_values(model, cfg, refit_steps, seed)
        model.eval()
        held = X.sample_state_queries(cfg, np.random.default_rng([seed, 2]), tasks)
        with torch.no_grad():
            obj = float(X.OBJECTIVES[cfg.objective](model, held))
        m = X.evaluate(model, cfg, np.random.default_rng([seed, 3]))
        layer = m["layers"][0]
        rows.append({"n": n, "layers": cfg.n_layers, "scale": s, "objective": cfg.objective, "objective_value": obj,
                     "neu": m["neu"],
                     "value_error_last": m["value_error_inf_by_depth"][-1], "diag_mean": layer["kernel_diag_mean"],
                     "diag_min": layer["kernel_diag_min"], "margin": layer["margin"],
                     "fraction_past": layer["assumption_5_1_fraction"], "value_row": layer["value_row"]})
        print(f"L {cfg.n_layers:3d}  n {n:4d}  scale {s:6.2f}  {cfg.objective} {obj:.3e}  NEU {m['neu']:.3e}  "
              f"v.err {rows[-1]['value_error_last']:.3f}  diag mean/min {layer['kernel_diag_mean']:.3f}/"
              f"{layer['kernel_diag_min']:.3f}  margin {layer['margin']:+.3f}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="a softmax-td checkpoint directory or training run directory")
    ap.add_argument("--scales", type=float, nargs="+", default=[0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    ap.add_argument("--n", type=int, nargs="+", default=None, help="context lengths (default: the checkpoint's)")
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="depths (tied models; default: the checkpoint's)")
    ap.add_argument("--refit-steps", type=int, default=150)
    ap.add_argument("--tasks", type=int, default=256)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0, c0 = time.perf_counter(), time.process_time()
    contexts = args.n or [_load(args.source)[1].n]
    rows = scan(args.source, args.scales, contexts, args.layers or [None], args.refit_steps, args.tasks)
    print(f"wall {time.perf_counter() - t0:.0f} s, CPU {time.process_time() - c0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
