"""Falsification of the algorithm verdict (docs/verdict.md, "Does the verdict follow the training objective?").

Trains small plain-PyTorch transformers (examples/torch_model.py: nn.Linear embedding, pre-LN attention + MLP
blocks, a linear head) on the linear-td task (Boyan chains, d = 3 random features, n = 16 transitions, a query
state), each to mimic a DIFFERENT candidate algorithm run on the prompt's own context:

* ``td0``           batch TD(0), alpha = 1, 2 steps (the value of the query state);
* ``mc_regression`` gradient descent on the Monte-Carlo return regression, alpha = 1, 2 steps;
* ``lstd``          LSTD's closed form (the fixed point of batch TD(0));
* ``residual_gradient`` residual-gradient TD, alpha = 1, 2 steps.

Then records each model (`icrl_interp.record`, the example's probe spec) and runs the verdict on the
recording. If the verdict follows the objective, each row's verdict is its own objective; a verdict that
says TD for every row is a defect. CPU only, about a minute per model:

    python reproductions/verdict_falsification.py --steps 1500 --seeds 0 --out /tmp/falsification

Prints the measured table (docs/verdict.md quotes it) and writes each verdict JSON beside the models.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from torch_model import ValueTransformer  # noqa: E402

from icrl_interp.verdicts import candidates as C  # noqa: E402
from icrl_interp.verdicts import behaviour as VD  # noqa: E402
from icrl_interp.models.construct import task_config  # noqa: E402

TASK = "linear-td"
OPTIONS = {"d": 3, "n": 16, "layers": 2}
OBJECTIVES = {
    "td0": lambda tr: C.td_lambda(tr, 1.0, 2).outputs[:, 2],
    "mc_regression": lambda tr: C.mc_regression(tr, 1.0, 2).outputs[:, 2],
    "lstd": lambda tr: C.lstd(tr, {}, 0).outputs[:, 0],
    "residual_gradient": lambda tr: C.residual_gradient(tr, 1.0, 2).outputs[:, 2],
}
"""Objective -> the teacher's output on a batch of transitions (the model is trained to mimic it)."""


def transitions(config, z: np.ndarray) -> C.Transitions:
    """The candidates' view of prompts (as the verdict reads them)."""
    data = VD.VerdictData(z=z, layout=config.model.layout, gamma=config.model.gamma, task_id=np.arange(len(z)),
                          hints=None, readouts={}, output=np.zeros((len(z), 1)), readout_kind="layout")
    return VD.transitions(data)


def train(objective: str, steps: int, seed: int, batch: int = 256, lr: float = 3e-3) -> tuple[torch.nn.Module, dict]:
    config = task_config(TASK, OPTIONS)
    torch.manual_seed(seed)
    model = ValueTransformer(d_in=2 * OPTIONS["d"] + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    rng = np.random.default_rng([seed, 7])
    teacher = OBJECTIVES[objective]
    t0 = time.perf_counter()
    for step in range(steps):
        pb = config.sample(batch, rng)
        z = np.asarray(pb.prompt.z)
        y = teacher(transitions(config, z))
        y = np.clip(y, -50, 50)  # LSTD can be large on ill-conditioned contexts: keep the loss bounded
        loss = ((model(torch.tensor(z, dtype=torch.float32)) - torch.tensor(y, dtype=torch.float32)) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    pb = config.sample(1024, np.random.default_rng([seed, 99]))
    z = np.asarray(pb.prompt.z)
    y = np.clip(teacher(transitions(config, z)), -50, 50)
    with torch.no_grad():
        pred = model(torch.tensor(z, dtype=torch.float32)).numpy()
    r2 = 1 - float(((pred - y) ** 2).sum() / ((y - y.mean()) ** 2).sum())
    return model, {"train_s": time.perf_counter() - t0, "teacher_r2": r2}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    ap.add_argument("--tasks", type=int, default=512, help="tasks recorded for the verdict")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import icrl_interp

    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in args.seeds:
        for objective in args.objectives:
            model, info = train(objective, args.steps, seed)
            rec = args.out / f"{objective}-{seed}.h5"
            if rec.exists():
                rec.unlink()
            icrl_interp.record(model, TASK, rec, task_options=OPTIONS, probe=str(ROOT / "examples" / "torch_model.toml"),
                               tasks=args.tasks, progress=False)
            v = icrl_interp.verdict(rec, bootstrap=500)
            (args.out / f"{objective}-{seed}.verdict.json").write_text(json.dumps(v, indent=1, default=float))
            out = v["output"]["behaviour"]
            rows.append((objective, seed, info["teacher_r2"], v["verdict"], {c: out[c]["r2"] for c in OBJECTIVES}))
            print(f"{objective} seed {seed}: trained {info['train_s']:.0f} s, teacher R² {info['teacher_r2']:.3f}; "
                  f"verdict {v['verdict']['text']}", flush=True)
    print("\n| objective | seed | model vs teacher R² | verdict | margin [95% CI] | "
          + " | ".join(f"R² {c}" for c in OBJECTIVES) + " |")
    print("|---|---|---|---|---|" + "---|" * len(OBJECTIVES))
    for objective, seed, r2, verdict, scores in rows:
        ci = verdict["margin_ci"]
        margin = "—" if verdict["margin"] is None else (f"{verdict['margin']:.3f}" + (
            f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""))
        best = verdict["best"] or "none fits"
        print(f"| {objective} | {seed} | {r2:.3f} | {best} (runner-up {verdict['runner_up']}) | {margin} | "
              + " | ".join("—" if scores[c] is None else f"{scores[c]:.3f}" for c in OBJECTIVES) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
