"""Metrics over training: evaluate every checkpoint of a run, and plot them with the loss.

    python -m icrl_interp.train.trends RUN_DIR --png docs/figures/NAME.png [--json OUT.json] [--eval-tasks 64]

Every checkpoint is evaluated on the same held-out tasks (the run's evaluation stream),
so the curves show the model changing, not the sample.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from .. import checkpoint
from .evaluate import evaluate
from .trainer import EVAL_STREAM, list_checkpoints, load_run_config


def run_trend(run_dir, eval_tasks: int = 64) -> list[dict]:
    """[{step, **evaluate(...)}] for every checkpoint of the run, in step order."""
    from tqdm import tqdm

    cfg = dataclasses.replace(load_run_config(run_dir), eval_tasks=eval_tasks)
    rows = []
    for step, path in tqdm(list_checkpoints(run_dir), desc="checkpoints"):
        model = checkpoint.load(path)
        rows.append({"step": step, **evaluate(model, cfg, np.random.default_rng([cfg.seed, EVAL_STREAM]))})
    return rows


def _series(rows: list[dict], family: str) -> dict[str, list[float]]:
    if family == "linear-td":
        return {k: [r[k] for r in rows] for k in ("SS", "IWS", "VD")}
    if family == "softmax-td":
        lay = [r["layers"][0] for r in rows]
        return {"kernel diag mean": [x["kernel_diag_mean"] for x in lay], "kernel diag min": [x["kernel_diag_min"] for x in lay],
                "value-row cosine to (1,1,-1)": [x["value_row_cosine"] for x in lay],
                "value error (last layer)": [r["value_error_inf_by_depth"][-1] for r in rows]}
    return {"rel err P12": [r["rel_err_P12"] for r in rows], "rel err V21": [r["rel_err_V21"] for r in rows],
            "rel err P12 mod u": [r["mod_null"]["rel_err_P12"] for r in rows],
            "rel err V21 mod u": [r["mod_null"]["rel_err_V21"] for r in rows],
            "lazy |P22|+|V22|": [r["lazy_P22"] + r["lazy_V22"] for r in rows]}


def plot_run(run_dir, png, rows: list[dict]) -> None:
    """Loss curve (left) and the family's metrics over checkpoints (right), written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir, png = Path(run_dir), Path(png)
    cfg = load_run_config(run_dir)
    log = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.semilogy([x["step"] for x in log], [x["loss"] for x in log])
    a.set(xlabel="optimizer step", ylabel="training loss (log)", title=f"{cfg.family}: training loss")
    steps = [r["step"] for r in rows]
    log_scale = cfg.family == "sarsa"
    for name, values in _series(rows, cfg.family).items():
        values = np.asarray(values, dtype=float)
        (b.semilogy if log_scale else b.plot)(steps, np.maximum(values, 1e-16) if log_scale else values, marker="o", label=name)
    if cfg.family == "softmax-td":
        b.axhline((1 + cfg.gamma) / 2, color="k", ls="--", lw=1, label="Assumption 5.1 threshold (1+gamma)/2")
    if cfg.family == "linear-td":
        b.axhline(0.9, color="k", ls="--", lw=1, label="target SS, IWS >= 0.9")
    b.set(xlabel="optimizer step (checkpoint)", ylabel="held-out metric", title=f"{cfg.family}: metrics over training")
    b.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    tmp = png.with_name(png.stem + ".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, png)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="evaluate and plot every checkpoint of a training run")
    ap.add_argument("run_dir")
    ap.add_argument("--png", required=True)
    ap.add_argument("--json")
    ap.add_argument("--eval-tasks", type=int, default=64)
    args = ap.parse_args(argv)
    rows = run_trend(args.run_dir, args.eval_tasks)
    plot_run(args.run_dir, args.png, rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
