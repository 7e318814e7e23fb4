"""Training the trained zoo entries (`mimics.SPECS`): a model learns to match a teacher's output on the
entry's task, optionally with an auxiliary loss at a chosen layer (docs/training.md, "Trained zoo models").

A *target* is a callable PromptBatch -> float64 array: the output [B, k] the model must match, or an
intermediate quantity [B, n] (one scalar per context column) that a linear readout of
`blocks.{layer}.hook_resid_post` at the context columns must match. The loss is the output's squared error
plus `Intermediate.weight` times the readout's, each divided by its target's variance on the first pool
of tasks (so neither dominates by scale). Adam with a warm-up and a cosine decay, fresh tasks for every
step from `train.trainer.step_rng` streams, one torch thread; the held-out fit (R^2 of the output to the
teacher, and of the readout to the intermediate quantity) on `HELD_OUT` tasks of the stream
[seed, EVAL_STREAM], the trainer's held-out stream.

A model whose held-out R^2 to its teacher stays below `mimics.MIN_R2` is trained again from its seeded init with
twice, then four times the steps (`LADDER`). Retrain and ship every entry (about 15-30 CPU minutes on one core for
one seed, depending on how many climb the ladder):

    nice -n 10 python -m icrl_interp.zoo.training --out data/zoo --seeds 0
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from .._version import __version__
from ..core.errors import UserError, check
from ..core.files import atomic_dir
from ..models.modes import eval_mode
from ..train.evaluate import EVAL_STREAM
from ..train.trainer import step_rng
from . import decoys, mimics, teachers

HELD_OUT = 1024
"""Held-out tasks of the recorded fit (R^2 of the output to the teacher)."""
POOL = 4096
"""Tasks sampled at once (numpy is faster in bulk), split into batches."""

Target = Callable[[object], np.ndarray]


# ------------------------------------------------------------------ targets
class Capture:
    """The output of one module during a forward pass (a forward hook, removed by `close`)."""

    def __init__(self, module):
        self.value = None
        self.handle = module.register_forward_hook(self._keep)

    def _keep(self, module, inputs, output):
        self.value = output[0] if isinstance(output, tuple) else output

    def close(self):
        self.handle.remove()


def teacher_module(teacher: dict):
    """The float64 module z -> [B, k] a teacher description names: an exact teacher (`teachers.make`, with
    'algorithm', 'n_layers' and its parameters) or a decoy (`decoys.<decoy>`); None for 'query_reward'."""
    if "algorithm" in teacher:
        params = {k: v for k, v in teacher.items() if k not in ("algorithm", "n_layers")}
        return teachers.make(teacher["algorithm"], n_layers=teacher["n_layers"], task=mimics.task_options(), **params)
    if "decoy" in teacher:
        config = mimics.task_config()
        return getattr(decoys, teacher["decoy"])(config.model.layout, float(config.model.gamma))
    check(teacher.get("task_data") == "query_reward", f"unknown teacher {teacher!r}")
    return None


def _run(module, batch, layer: int | None = None):
    """(the module's output [B, k], its `blocks.{layer}.hook_resid_post` error row at the context columns or None)."""
    z = torch.as_tensor(np.asarray(batch.prompt.z, dtype=np.float64))
    capture = Capture(module.blocks[layer].hook_resid_post) if layer is not None else None
    try:
        with torch.no_grad():
            out = module(z).double().numpy().reshape(len(z), -1)
        return out, None if capture is None else capture.value[:, :-1, module.ERR].double().numpy()
    finally:
        if capture is not None:
            capture.close()


def target(teacher: dict) -> Target:
    """The output target [B, k] of a teacher description (`MimicSpec.teacher`)."""
    module = teacher_module(teacher)
    if module is None:  # the decoy C: the true immediate reward r(s_q) of the query state, from the task data
        return lambda batch: np.take_along_axis(batch.tasks["r"], batch.prompt.states[:, -1:], 1).astype(np.float64)
    return lambda batch: _run(module, batch)[0]


def intermediate_target(teacher: dict, inter: mimics.Intermediate) -> Target:
    """The teacher's own error row (TD errors at the parameters after layer `inter.layer`) at the context
    columns of its `blocks.{layer}.hook_resid_post`, [B, n]: what the mimic's readout of that layer must match."""
    module = teacher_module(teacher)
    check(module is not None and hasattr(module, "ERR"),
          f"teacher {teacher!r} has no error row for an intermediate target")
    return lambda batch: _run(module, batch, inter.layer)[1]


# ------------------------------------------------------------------ training
def r2(pred: np.ndarray, truth: np.ndarray) -> float:
    """1 - SSE / SST over every entry (truth's mean over prompts as the baseline)."""
    truth = np.asarray(truth, dtype=np.float64).reshape(len(truth), -1)
    pred = np.asarray(pred, dtype=np.float64).reshape(truth.shape)
    return float(1.0 - ((pred - truth) ** 2).sum() / ((truth - truth.mean(0)) ** 2).sum())


def _dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def forward(model, aux, layer: int | None, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(prediction [B, k], aux readout at the context columns [B, n] or None)."""
    if aux is None:
        return mimics.predict(model, z), None
    capture = Capture(mimics.resid_module(model, layer))
    try:
        out = mimics.predict(model, z)
        return out, aux(capture.value[:, :-1]).squeeze(-1)
    finally:
        capture.close()


def fit(model, aux, spec: mimics.MimicSpec, seed: int, tasks: int = HELD_OUT) -> dict:
    """Held-out R^2 of the model's output to its teacher (and of the aux readout to the intermediate quantity)
    on `tasks` tasks of the stream [seed, EVAL_STREAM]; the models' train/eval modes are restored."""
    batch = mimics.task_config().sample(tasks, np.random.default_rng([seed, EVAL_STREAM]))
    layer = spec.intermediate.layer if spec.intermediate is not None else None
    with eval_mode(model, *([aux] if aux is not None else [])), torch.no_grad():
        out, inter = forward(model, aux, layer, torch.as_tensor(batch.prompt.z, dtype=_dtype(model)))
    result = {"held_out_r2": r2(out.double().numpy(), target(spec.teacher)(batch)), "held_out_tasks": tasks,
              "held_out_stream": [seed, EVAL_STREAM]}
    if spec.intermediate is not None:
        want = intermediate_target(spec.teacher, spec.intermediate)(batch)
        result["intermediate_r2"] = r2(inter.double().numpy(), want)
    return result


def train(spec: mimics.MimicSpec, seed: int = 0, steps: int | None = None, log=print) -> tuple:
    """Train `spec` from its seeded init: (model, aux readout or None, training record)."""
    steps = spec.steps if steps is None else int(steps)
    config = mimics.task_config()
    out_target = target(spec.teacher)
    inter = spec.intermediate
    inter_target = intermediate_target(spec.teacher, inter) if inter is not None else None
    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many tiny matmuls: one thread is fastest on a shared machine (docs/training.md)
    try:
        model = mimics.build(spec, seed)
        dtype = _dtype(model)
        aux = None
        if inter is not None:
            probe_z = torch.as_tensor(config.sample(2, np.random.default_rng([seed, 0])).prompt.z, dtype=dtype)
            capture = Capture(mimics.resid_module(model, inter.layer))
            try:
                with torch.no_grad():
                    mimics.predict(model, probe_z)
                width = capture.value.shape[-1]
            finally:
                capture.close()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                squeezed = inter.bottleneck is not None
                aux = (mimics.CodeReadout(model.squeeze[0]) if squeezed else torch.nn.Linear(width, 1)).to(dtype)
        # a CodeReadout shares the squeeze with the model: each parameter once
        params = list({id(p): p for p in [*model.parameters(), *(aux.parameters() if aux is not None else [])]}
                      .values())
        opt = torch.optim.Adam(params, lr=spec.lr)
        warmup = max(1, steps // 20)
        per_pool = max(1, min(POOL // spec.batch, steps))  # a short run (tests) samples only what it uses
        scales = None
        wall0, cpu0 = time.perf_counter(), time.process_time()
        model.train()
        running = None
        for step in range(steps):
            if step % per_pool == 0:
                pb = config.sample(per_pool * spec.batch, step_rng(seed, step // per_pool))
                z_pool = torch.as_tensor(pb.prompt.z, dtype=dtype)
                y_pool = torch.as_tensor(out_target(pb), dtype=dtype)
                i_pool = torch.as_tensor(inter_target(pb), dtype=dtype) if inter is not None else None
                if scales is None:  # fixed from the first pool: the loss is comparable across steps
                    scales = (float(y_pool.var()), float(i_pool.var()) if inter is not None else 1.0)
            rows = slice((step % per_pool) * spec.batch, (step % per_pool + 1) * spec.batch)
            lr = spec.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
            for group in opt.param_groups:
                group["lr"] = lr
            out, readout = forward(model, aux, inter.layer if inter else None, z_pool[rows])
            loss = ((out - y_pool[rows]) ** 2).mean() / scales[0]
            if inter is not None:
                loss = loss + inter.weight * ((readout - i_pool[rows]) ** 2).mean() / scales[1]
            value = float(loss.detach())
            if not math.isfinite(value):
                raise UserError(f"training {spec.name} diverged at step {step} (loss {value})")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            running = value if running is None else 0.98 * running + 0.02 * value
            if log and (step + 1) % 250 == 0:
                log(f"  {spec.name} s{seed} step {step + 1}/{steps}: loss {running:.4f} "
                    f"({time.perf_counter() - wall0:.0f} s)")
        model.eval()
        if isinstance(aux, mimics.CodeReadout):
            aux = aux.as_linear()  # the shipped readout: one linear map of the target layer's stream
        if aux is not None:
            aux.eval()
        record = {"steps": steps, "batch": spec.batch, "lr": spec.lr, "optimizer": "Adam, warm-up 5%, cosine decay, "
                  "gradient norm clipped at 1", "loss_scales": list(scales), "final_loss": running,
                  "wall_s": round(time.perf_counter() - wall0, 1), "cpu_s": round(time.process_time() - cpu0, 1)}
        return model, aux, record
    finally:
        torch.set_num_threads(old_threads)


# ------------------------------------------------------------------ shipping
def save(folder, spec: mimics.MimicSpec, seed: int, model, aux, record: dict, fit_result: dict) -> Path:
    """Write the entry's folder atomically: weights (a checkpoint for the package's architecture), the aux
    readout, and zoo.json with the ground truth, fit, training record, versions and each file's sha256."""
    from safetensors.torch import save_file

    folder = Path(folder)
    with atomic_dir(folder) as tmp:
        if spec.architecture == mimics.OWN:
            from ..models import checkpoint

            checkpoint.save(model, {"task": mimics.task_config().task.to_dict(), "seed": seed,
                                    "origin": {"kind": "trained", "run_id": mimics.folder_name(spec.name, seed)}},
                            tmp, overwrite=True)
        else:
            save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(tmp / mimics.WEIGHTS))
        if aux is not None:
            save_file({k: v.detach().contiguous() for k, v in aux.state_dict().items()}, str(tmp / mimics.AUX))
        files = {p.name: {"bytes": p.stat().st_size, "sha256": mimics.sha256(p)} for p in sorted(tmp.iterdir())}
        meta = {
            "format": mimics.FORMAT, "name": spec.name, "seed": seed, "architecture": spec.architecture,
            "roles": mimics.roles(spec), "task": {"family": mimics.LINEAR_TD, **mimics.TASK, "gamma": mimics.GAMMA},
            "teacher": spec.teacher, "truth": dataclasses.asdict(spec.truth),
            "intermediate": None if spec.intermediate is None else {
                "layer": spec.intermediate.layer, "hook": f"blocks.{spec.intermediate.layer}.hook_resid_post",
                "positions": "context", "quantity": "the teacher's error row after that layer (TD errors)",
                "weight": spec.intermediate.weight, "readout": mimics.AUX,
                "bottleneck": spec.intermediate.bottleneck},
            "fit": fit_result, "shipped": fit_result["held_out_r2"] >= mimics.MIN_R2, "training": record,
            "versions": {"icrl_interp": __version__, "torch": torch.__version__, "python": platform.python_version(),
                         "numpy": np.__version__},
            "files": files,
        }
        (tmp / mimics.META).write_text(json.dumps(meta, indent=1) + "\n")
    return folder


LADDER = (1, 2, 4)
"""Training lengths tried, as multiples of the entry's steps: a model whose held-out R^2 to its teacher is below
`mimics.MIN_R2` is trained again from the same seeded init with the next multiple (a fixed rule, decided before any
model is scored: a known answer must have learned its teacher, and no result but that fit picks the length)."""


def train_to_bar(spec: mimics.MimicSpec, seed: int, steps: int | None = None, ladder=LADDER, log=print) -> tuple:
    """Train `spec` for `steps` (default its own) times each multiple of `ladder` in turn until the held-out R^2 to
    its teacher reaches `mimics.MIN_R2`: (model, aux, training record with every attempt, held-out fit of the kept
    one). The last attempt is kept when none reaches the bar (it is then saved as not shipped)."""
    base = spec.steps if steps is None else int(steps)
    attempts = []
    for factor in ladder:
        model, aux, record = train(spec, seed, base * factor, log=log)
        result = fit(model, aux, spec, seed)
        attempts.append({"steps": record["steps"], "held_out_r2": result["held_out_r2"], "cpu_s": record["cpu_s"]})
        if result["held_out_r2"] >= mimics.MIN_R2:
            break
        if log:
            log(f"  {spec.name} s{seed}: held-out R2 {result['held_out_r2']:.4f} < {mimics.MIN_R2} after "
                f"{record['steps']} steps")
    record["attempts"] = attempts
    record["ladder"] = list(ladder)
    return model, aux, record, result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Train the trained zoo entries and write them to --out.")
    ap.add_argument("--out", type=Path, default=Path("data/zoo"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--only", nargs="+", choices=list(mimics.SPECS), help="these entries (default: all)")
    ap.add_argument("--steps", type=int, help="override every entry's steps (quick trials)")
    ap.add_argument("--ladder", type=int, nargs="+", default=list(LADDER),
                    help="multiples of the steps tried in turn until the held-out R2 reaches mimics.MIN_R2")
    args = ap.parse_args(argv)
    rows = []
    for seed in args.seeds:
        for name in args.only or list(mimics.SPECS):
            spec = mimics.SPECS[name]
            model, aux, record, result = train_to_bar(spec, seed, args.steps, tuple(args.ladder))
            folder = save(args.out / mimics.folder_name(name, seed), spec, seed, model, aux, record, result)
            size = sum(p.stat().st_size for p in folder.iterdir())
            rows.append((name, seed, result, record, size))
            print(f"{name} s{seed}: held-out R2 {result['held_out_r2']:.4f}"
                  + (f", intermediate R2 {result['intermediate_r2']:.4f}" if "intermediate_r2" in result else "")
                  + f", {record['cpu_s']:.0f} CPU s, {size / 1024:.0f} KB", flush=True)
    print("\n| entry | seed | held-out R² to teacher | intermediate R² | CPU s | size |\n|---|---|---|---|---|---|")
    for name, seed, result, record, size in rows:
        inter = f"{result['intermediate_r2']:.3f}" if "intermediate_r2" in result else "—"
        print(f"| {name} | {seed} | {result['held_out_r2']:.4f} | {inter} | {record['cpu_s']:.0f} "
              f"| {size / 1024:.0f} KB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
