"""Metrics over training: evaluate every checkpoint of a run, and plot them with the loss.

    python -m icrl_interp.train.trends RUN_DIR --png docs/figures/NAME.png [--json OUT.json] [--eval-tasks 64]

Every checkpoint is evaluated on the same held-out tasks (the run's evaluation stream),
so the curves show the model changing, not the sample. Which metrics are plotted, on which
scale and with which reference lines comes from the family's recipe (`Recipe.trends`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from ..core.files import atomic_path, write_json
from ..models import checkpoint
from .evaluate import evaluate_run
from .recipe import recipe_of
from .trainer import list_checkpoints, load_run_config


def run_trend(run_dir, eval_tasks: int = 64) -> list[dict]:
    """[{step, **evaluate(...)}] for every checkpoint of the run, in step order."""
    from tqdm import tqdm

    cfg = dataclasses.replace(load_run_config(run_dir), eval_tasks=eval_tasks)
    rows = []
    for step, path in tqdm(list_checkpoints(run_dir), desc="checkpoints"):
        model = checkpoint.load(path)
        rows.append({"step": step, **evaluate_run(model, cfg)})
    return rows


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
    trends = recipe_of(cfg).trends
    log_scale = trends.log_scale
    for name, values in trends.series(rows).items():
        values = np.asarray(values, dtype=float)
        (b.semilogy if log_scale else b.plot)(steps, np.maximum(values, 1e-16) if log_scale else values, marker="o", label=name)
    for y, label in trends.lines(cfg):
        b.axhline(y, color="k", ls="--", lw=1, label=label)
    b.set(xlabel="optimizer step (checkpoint)", ylabel="held-out metric", title=f"{cfg.family}: metrics over training")
    b.legend(fontsize=7)
    fig.tight_layout()
    try:
        with atomic_path(png, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=90, format="png")
    finally:
        plt.close(fig)


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
        write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
