"""Liang & Lai (NeurIPS 2026): the ablation table and the in-context control table, several seeds.

    python reproductions/liang_lai.py ROW [--seeds 0 1 2] [--out /tmp/repro]     # train + evaluate + control
    python reproductions/liang_lai.py table [--out /tmp/repro] [--md FILE]        # aggregate into markdown

ROW is one row of the paper's ablation table (or our one-hot comparison):

    sarsa         full SARSA: random Gaussian features (d = 36), lazy blocks zero-initialised
    actor-critic  full actor-critic: the same features, actor step 32, critic step 0.01, the critic's error
                  weighted by (32 / 0.01)^2 and its V rows stepped at 0.01 / 32 of Adam's step (the fix)
    lazy          SARSA with the lazy blocks P22, V22 initialised like the rest and trained freely
    weak          SARSA on low-randomness features (rho = 0.1: sqrt(1 - rho^2) * one-hot + rho * Gaussian)
    onehot        SARSA on one-hot features (the blind direction u; not a paper row: the explanation)

and, not paper rows: ac-plain (actor-critic without the critic weight and step factor), ac-mix (with a lam scale
mixture), ac-onehot (one-hot actor-critic, critic step 0.25, with the fix), weak-0.3 / weak-0.03 / weak-0.01
(the rho trend of the weak row).

For each seed the row's training config is trained with the package's trainer (`icrl_interp.train.train`),
the final checkpoint is exported to OUT/ROW/seedK/model, and it is run in closed loop on 100 held-out MDPs
(`icrl_interp.train.control.evaluate`, rewards N(0, 1) as the paper's scale, t = 1000, the same MDPs for every
seed and row). Everything a row measured goes to OUT/ROW/seedK/result.json (metrics, times); the control
result to control.json. Times: wall and CPU of this process, training and control separately.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np

MDP = dict(n_states=9, n_actions=4, gamma=0.5, n=64, batch=64, eval_tasks=256, checkpoint_every=500, log_every=10,
           lr_decay=0.99, lr_decay_every=50)
SARSA = dict(MDP, sa_features="gaussian", d=36, alpha=2.0, lr=1e-2, steps=1500)
ROWS: dict[str, tuple[str, dict]] = {
    "sarsa": ("sarsa", SARSA),
    "actor-critic": ("actor-critic", dict(MDP, sa_features="gaussian", d=36, alpha=32.0, beta=0.01, lr=1e-2, steps=6000,
                                          lr_decay=0.98, critic_weight=(32.0 / 0.01) ** 2, critic_lr_factor=0.01 / 32.0)),
    "lazy": ("sarsa", dict(SARSA, lazy_ablation=True)),
    "weak": ("sarsa", dict(SARSA, sa_randomness=0.1)),
    "onehot": ("sarsa", dict(SARSA, sa_features="onehot", d=None)),
}
AC = ROWS["actor-critic"][1]
EXTRA: dict[str, tuple[str, dict]] = {  # what the actor-critic fix consists of, and the rho trend (seed 0; not paper rows)
    "ac-plain": ("actor-critic", {k: v for k, v in AC.items() if k not in ("critic_weight", "critic_lr_factor")}),
    "ac-mix": ("actor-critic", dict(AC, lam_std_max=3.0)),
    "ac-onehot": ("actor-critic", dict(AC, sa_features="onehot", d=None, beta=0.25, critic_weight=(32.0 / 0.25) ** 2,
                                       critic_lr_factor=0.25 / 32.0, lam_std_max=3.0)),
    "weak-0.3": ("sarsa", dict(SARSA, sa_randomness=0.3)),
    "weak-0.03": ("sarsa", dict(SARSA, sa_randomness=0.03)),
    "weak-0.01": ("sarsa", dict(SARSA, sa_randomness=0.01)),
}
ROWS.update(EXTRA)
PAPER = {  # the paper's ablation table: loss, rel. err P12, rel. err V21bar, lazy drift, control return
    "sarsa": ("exponential (→ 1e-6)", "< 0.015", "< 0.012", "0.000", "1.83"),
    "actor-critic": ("exponential (→ 1e-6)", "< 0.018", "< 0.014", "0.000", "1.91"),
    "lazy": ("sublinear / slow", "0.142", "0.128", "0.085", "1.62"),
    "weak": ("oscillating", "0.285", "0.261", "0.002", "1.24"),
    "onehot": ("–", "–", "–", "–", "–"),
    **{row: ("–", "–", "–", "–", "–") for row in EXTRA},
}
LABELS = {"sarsa": "full SARSA (random features)", "actor-critic": "full actor-critic (random features)",
          "lazy": "lazy blocks not frozen (SARSA)", "weak": "weak excitation, ρ = 0.1 (SARSA)",
          "onehot": "one-hot features (SARSA; not a paper row)",
          "ac-plain": "actor-critic, plain Adam (no critic weight, no critic step factor)",
          "ac-mix": "actor-critic, the fix + λ scale mixture (λ std log-uniform in [0.5, 3])",
          "ac-onehot": "actor-critic, one-hot, β = 0.25, the fix + λ mixture",
          "weak-0.3": "weak excitation, ρ = 0.3 (SARSA)", "weak-0.03": "weak excitation, ρ = 0.03 (SARSA)",
          "weak-0.01": "weak excitation, ρ = 0.01 (SARSA)"}
CONTROL = dict(mdps=100, iterations=1000, rewards="normal", seed=0, epsilon=0.1)


def lazy_norm(model) -> tuple[float, float]:
    """(||P22||_F, ||V22||_F) of the lazy blocks."""
    from icrl_interp.analyzers import weights
    from icrl_interp.train.util import param

    lazy = weights.lazy_blocks(param(model, 0, "P"), param(model, 0, "V"), model.layout)
    return lazy["P22"], lazy["V22"]


def loss_shape(run_dir: Path) -> dict:
    """The training-loss curve in numbers: first / last logged loss, the loss at each quarter of the run, the
    step where it first fell 1e6-fold, and 'rebounds': the share of logged steps in the second half whose loss is
    more than 2x the lowest loss logged before them (0 for a monotone decrease; high for oscillation)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps, loss = np.array([r["step"] for r in rows]), np.array([r["loss"] for r in rows])
    quarters = {f"q{q}": float(loss[min(len(loss) - 1, int(q / 4 * len(loss)) - 1 if q else 0)]) for q in range(5)}
    below = np.nonzero(loss <= 1e-6 * loss[0])[0]
    run_min = np.minimum.accumulate(loss)
    half = len(loss) // 2
    rebounds = float(np.mean(loss[half:] > 2 * run_min[half - 1:-1])) if half else 0.0
    return {"first": float(loss[0]), "last": float(loss[-1]), **quarters,
            "step_1e6_fold": int(steps[below[0]]) if below.size else None, "rebounds": rebounds}


def run_row(row: str, seeds: list[int], out: Path, control_kw: dict) -> None:
    from icrl_interp.models import checkpoint
    from icrl_interp.train import control
    from icrl_interp.train import config_for, train
    from icrl_interp.train.trainer import build, export_final

    family, kw = ROWS[row]
    for seed in seeds:
        base = out / row / f"seed{seed}"
        run_dir = base / "run"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        base.mkdir(parents=True, exist_ok=True)
        cfg = config_for(family, seed=seed, **{k: v for k, v in kw.items() if v is not None})
        init_lazy = lazy_norm(build(cfg)[0])
        t0, c0 = time.perf_counter(), time.process_time()
        res = train(cfg, run_dir, progress=False)
        train_wall, train_cpu = time.perf_counter() - t0, time.process_time() - c0
        model_dir = export_final(run_dir, base / "model")
        model = checkpoint.load(model_dir)
        P22, V22 = lazy_norm(model)
        config, _ = checkpoint.read(model_dir)
        t0, c0 = time.perf_counter(), time.process_time()
        with control.torch_threads(1):
            ctl = control.evaluate(model, config, control.ControlConfig(**control_kw), progress=False,
                                   source=str(model_dir))
        ctl_wall, ctl_cpu = time.perf_counter() - t0, time.process_time() - c0
        control.write_json(ctl, base / "control.json")
        m = res.final_metrics
        result = {
            "row": row, "family": family, "seed": seed, "config": cfg.to_dict(), "final_metrics": m,
            "loss_curve": loss_shape(run_dir),
            "lazy": {"P22": P22, "V22": V22, "init_P22": init_lazy[0], "init_V22": init_lazy[1]},
            "control": {"returns": ctl["returns"], "transformer_minus_teacher": ctl["transformer_minus_teacher"],
                        "tracking": ctl["tracking"], "divergence_mdps": ctl["divergence"]["mdps"],
                        "settings": ctl["settings"]},
            "times": {"train_wall_s": train_wall, "train_cpu_s": train_cpu, "control_wall_s": ctl_wall,
                      "control_cpu_s": ctl_cpu},
        }
        (base / "result.json").write_text(json.dumps(result, indent=1))
        r = ctl["returns"]
        print(f"{row} seed {seed}: loss {m['loss']:.2e} (rel {m['loss_relative_to_update']:.2e}), "
              f"P12 {m['rel_err_P12']:.4f}, V21 {m['rel_err_V21']:.4f}, lazy {P22:.3g}/{V22:.3g}, "
              f"return tf {r['transformer']['mean']:.3f} teacher {r['teacher']['mean']:.3f}, "
              f"agreement {ctl['tracking']['greedy_agreement']['mean']:.4f}; train {train_wall:.0f}s wall "
              f"{train_cpu:.0f}s CPU, control {ctl_wall:.0f}s wall {ctl_cpu:.0f}s CPU", flush=True)


# ------------------------------------------------------------------ tables
def _ms(values, fmt="{:.3f}") -> str:
    """mean ± std over seeds ('err': 4 decimals, or 2 significant digits below 1e-3)."""
    v = np.array([x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))], dtype=float)
    if v.size == 0:
        return "–"
    if fmt == "err":
        fmt = "{:.1e}" if abs(v.mean()) < 1e-3 else "{:.4f}"
    if v.size == 1:
        return fmt.format(v[0])
    return f"{fmt.format(v.mean())} ± {fmt.format(v.std())}"


def load(out: Path) -> dict[str, list[dict]]:
    rows = {}
    for row in ROWS:
        files = sorted((out / row).glob("seed*/result.json"))
        if files:
            rows[row] = [json.loads(f.read_text()) for f in files]
    return rows


def ablation_table(rows: dict[str, list[dict]]) -> str:
    lines = ["| row | seeds | held-out loss (rel. to update) | loss curve: first → last, rebounds | "
             "rel. err P12 | rel. err V̄21 | lazy ‖P22‖+‖V22‖ end (init) | return t = 1000 (teacher) | paper: loss, P12, V̄21, drift, return |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row, res in rows.items():
        fm = [r["final_metrics"] for r in res]
        lc = [r["loss_curve"] for r in res]
        drift = [r["lazy"]["P22"] + r["lazy"]["V22"] for r in res]
        init = [r["lazy"]["init_P22"] + r["lazy"]["init_V22"] for r in res]
        ret = [r["control"]["returns"]["transformer"]["mean"] for r in res]
        teacher = res[0]["control"]["returns"]["teacher"]["mean"]
        lines.append(
            f"| {LABELS[row]} | {len(res)} | {_ms([m['loss'] for m in fm], '{:.1e}')} "
            f"({_ms([m['loss_relative_to_update'] for m in fm], '{:.1e}')}) | "
            f"{_ms([c['first'] for c in lc], '{:.1e}')} → {_ms([c['last'] for c in lc], '{:.1e}')}, "
            f"{_ms([c['rebounds'] for c in lc], '{:.2f}')} | {_ms([m['rel_err_P12'] for m in fm], 'err')} | "
            f"{_ms([m['rel_err_V21'] for m in fm], 'err')} | {_ms(drift, '{:.3f}')} ({_ms(init, '{:.3f}')}) | "
            f"{_ms(ret)} ({teacher:.3f}) | {', '.join(PAPER[row])} |")
    return "\n".join(lines)


def control_table(rows: dict[str, list[dict]]) -> str:
    lines = ["| model | seeds | random | teacher | transformer | oracle | transformer − teacher | greedy agreement (min) | "
             "rel. param. distance (max) | diverged MDPs |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row, res in rows.items():
        c = [r["control"] for r in res]

        def ret(key):
            return f"{c[0]['returns'][key]['mean']:.3f} ± {c[0]['returns'][key]['std']:.3f}"

        tf = _ms([x["returns"]["transformer"]["mean"] for x in c])
        lines.append(
            f"| {LABELS[row]} | {len(res)} | {ret('random')} | {ret('teacher')} | {tf} (± {c[0]['returns']['transformer']['std']:.3f} over MDPs) "
            f"| {ret('oracle')} | {_ms([x['transformer_minus_teacher']['mean'] for x in c], '{:+.4f}')} | "
            f"{_ms([100 * x['tracking']['greedy_agreement']['mean'] for x in c], '{:.2f}')}% "
            f"({min(100 * x['tracking']['greedy_agreement_min'] for x in c):.1f}%) | "
            f"{_ms([x['tracking']['rel_param_distance']['mean'] for x in c], '{:.1e}')} "
            f"({max(x['tracking']['rel_param_distance_max'] for x in c):.1e}) | "
            f"{', '.join(str(x['divergence_mdps']) for x in c)} |")
    return "\n".join(lines)


def times_table(rows: dict[str, list[dict]]) -> str:
    lines = ["| row | train wall / CPU per seed (s) | control wall / CPU per seed (s) |", "|---|---|---|"]
    for row, res in rows.items():
        t = [r["times"] for r in res]
        lines.append(f"| {row} | {_ms([x['train_wall_s'] for x in t], '{:.0f}')} / {_ms([x['train_cpu_s'] for x in t], '{:.0f}')} | "
                     f"{_ms([x['control_wall_s'] for x in t], '{:.0f}')} / {_ms([x['control_cpu_s'] for x in t], '{:.0f}')} |")
    return "\n".join(lines)


def onehot_table(rows: dict[str, list[dict]]) -> str:
    if "onehot" not in rows:
        return ""
    fm = [r["final_metrics"] for r in rows["onehot"]]
    return ("| one-hot SARSA | raw P12 / V̄21 | modulo u | floor (θ* without its u-part) | share of the P12 error along u |\n"
            "|---|---|---|---|---|\n"
            f"| {len(fm)} seeds | {_ms([m['rel_err_P12'] for m in fm], '{:.3f}')} / {_ms([m['rel_err_V21'] for m in fm], '{:.3f}')} | "
            f"{_ms([m['mod_null']['rel_err_P12'] for m in fm], '{:.1e}')} / {_ms([m['mod_null']['rel_err_V21'] for m in fm], '{:.1e}')} | "
            f"{fm[0]['null_floor']['rel_err_P12']:.3f} / {fm[0]['null_floor']['rel_err_V21']:.3f} | "
            f"{_ms([m['null_direction_share_P12'] for m in fm], '{:.3f}')} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("row", choices=[*ROWS, "table"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="/tmp/repro")
    ap.add_argument("--mdps", type=int, default=CONTROL["mdps"], help="held-out MDPs of the control run")
    ap.add_argument("--iterations", type=int, default=CONTROL["iterations"], help="closed-loop updates t")
    ap.add_argument("--md", help="with 'table': also write the tables to this markdown file")
    args = ap.parse_args()
    out = Path(args.out)
    if args.row == "table":
        rows = load(out)
        text = "\n\n".join(t for t in (ablation_table(rows), onehot_table(rows), control_table(rows), times_table(rows)) if t)
        print(text)
        if args.md:
            Path(args.md).write_text(text + "\n")
        return
    t0, c0 = time.perf_counter(), time.process_time()
    run_row(args.row, args.seeds, out, {**CONTROL, "mdps": args.mdps, "iterations": args.iterations})
    print(f"row {args.row}: {time.perf_counter() - t0:.0f} s wall, {time.process_time() - c0:.0f} s CPU in all")


if __name__ == "__main__":
    main()
