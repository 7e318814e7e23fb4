"""The training loop: a seeded, resumable run directory.

    RUN_DIR/config.json                    the full TrainConfig (+ run_id)
    RUN_DIR/metrics.jsonl                  one JSON line per `log_every` steps: step, loss, lr, wall_s (+ the
                                           recipe's `log_extras`)
    RUN_DIR/checkpoints/step_000100/       a model checkpoint (icrl_interp.models.checkpoint format) every
                                           `checkpoint_every` steps, plus the resume state:
                                           optimizer.safetensors (Adam moments) and trainer_state.json
    RUN_DIR/final_metrics.json             held-out evaluation of the final model

Determinism: the model init draws from `torch.Generator(seed)`, and the tasks of step t
from `numpy.random.default_rng([seed, 1, t])`, so a run resumed at step t sees exactly
the batches an uninterrupted run sees, and the same seed gives identical checkpoints.

Everything family-specific (model config, task stream, loss, init changes, update constraint,
evaluation) comes from the family's training recipe (`icrl_interp.train.recipe`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core import devices
from ..core.errors import UserError, check, one_line
from ..core.faults import kill_point
from ..core.files import atomic_dir, write_atomic
from ..core.resources import SNAPSHOTS
from .config import TrainConfig, config_from_dict
from .evaluate import EVAL_STREAM, evaluate_run  # noqa: F401  (EVAL_STREAM: re-exported, as before)
from .recipe import recipe_of

TRAIN_STREAM = 1


def step_rng(seed: int, step: int) -> np.random.Generator:
    """The task stream of optimizer step `step`."""
    return np.random.default_rng([seed, TRAIN_STREAM, step])


def sample_batch(cfg: TrainConfig, rng: np.random.Generator):
    """One training batch of the family (its recipe's `batch`)."""
    return recipe_of(cfg).batch(cfg, rng)


def run_id(cfg: TrainConfig) -> str:
    """Deterministic id: family, seed and a hash of the config (so same config -> same checkpoints)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    late = getattr(type(cfg), "LATE_FIELDS", ())
    blob = json.dumps({k: v for k, v in cfg.hashed_dict().items() if k not in ("steps", "checkpoint_every", "log_every")
                       and not (k in late and v == defaults.get(k))}, sort_keys=True)
    return f"{cfg.family}-s{cfg.seed}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


# ---------------------------------------------------------------- models
def model_config(cfg: TrainConfig):
    """The ModelConfig a training config trains."""
    return recipe_of(cfg).model_config(cfg)


def task_spec(cfg: TrainConfig) -> dict:
    """The checkpoint's `task` field (the keys of icrl_interp.tasks.sampling.TaskSpec)."""
    return recipe_of(cfg).task(cfg)


def build(cfg: TrainConfig):
    """A freshly initialised model and its gradient masks."""
    from ..models import build_model

    gen = torch.Generator().manual_seed(cfg.seed)
    model = build_model(model_config(cfg), seed=gen, gain=cfg.init_gain)
    masks = recipe_of(cfg).adjust_init(model, cfg, gen)
    return model, masks


# ------------------------------------------------------------- run files
def _step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def list_checkpoints(run_dir: Path | str) -> list[tuple[int, Path]]:
    """Completed checkpoints of a run (those with a trainer_state.json), by step."""
    root = Path(run_dir) / "checkpoints"
    out = []
    for d in sorted(root.glob("step_*")) if root.is_dir() else []:
        if d.is_dir() and (d / "trainer_state.json").is_file() and d.name[5:].isdigit():
            out.append((int(d.name[5:]), d))
    return out


def save_checkpoint(run_dir: Path, model, opt: torch.optim.Optimizer, cfg: TrainConfig, step: int, rid: str) -> Path:
    """Write the model checkpoint and the resume state of `step`, atomically (temp dir, then rename)."""
    from safetensors.torch import save_file

    from ..models import checkpoint

    final = _step_dir(run_dir, step)
    extras = {"origin": {"kind": "trained", "run_id": rid, "step": step}, "task": task_spec(cfg), "seed": cfg.seed,
              "training": cfg.to_dict()}
    names = {id(p): n for n, p in model.named_parameters()}
    tensors, counts = {}, {}
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state.get(p, {})
            if state:
                tensors[f"{names[id(p)]}.exp_avg"] = state["exp_avg"].contiguous().cpu()
                tensors[f"{names[id(p)]}.exp_avg_sq"] = state["exp_avg_sq"].contiguous().cpu()
                counts[names[id(p)]] = float(state["step"])
    with atomic_dir(final) as tmp:  # trainer_state.json marks a complete checkpoint: it is written last
        checkpoint.save(model, extras, tmp, overwrite=True)
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "adam_steps": counts, "run_id": rid}, indent=1))
    return final


def load_resume_state(step_dir: Path, model, opt: torch.optim.Optimizer) -> int:
    """Load parameters and Adam moments of a checkpoint into `model` and `opt`; returns its step.

    A corrupt or foreign trainer_state.json / optimizer.safetensors is a one-line UserError."""
    from safetensors.torch import load_file

    from ..models import checkpoint

    loaded = checkpoint.load(step_dir)
    loaded_model = loaded[0] if isinstance(loaded, tuple) else loaded
    with torch.no_grad():
        src = dict(loaded_model.named_parameters())
        for name, p in model.named_parameters():
            check(name in src and src[name].shape == p.shape, f"checkpoint {step_dir} does not match the run's model ({name})")
            p.copy_(src[name])
    fix = f"delete {step_dir} to resume from the checkpoint before it, or use a fresh --out"
    try:
        state = json.loads((step_dir / "trainer_state.json").read_text())
        step, adam_steps = int(state["step"]), dict(state["adam_steps"])
    except Exception as e:  # noqa: BLE001 - any defect of the file is the same user error
        raise UserError(f"cannot resume: {step_dir}/trainer_state.json is corrupt ({one_line(e)}); {fix}") from None
    try:
        tensors = load_file(str(step_dir / "optimizer.safetensors"))
        moments = {}
        for name, p in model.named_parameters():
            if name in adam_steps:
                avg, sq = tensors[f"{name}.exp_avg"], tensors[f"{name}.exp_avg_sq"]
                check(avg.shape == p.shape and sq.shape == p.shape, f"moments of {name} have the wrong shape")
                moments[p] = {"step": torch.tensor(float(adam_steps[name])), "exp_avg": avg.to(p.device, p.dtype),
                              "exp_avg_sq": sq.to(p.device, p.dtype)}
    except Exception as e:  # noqa: BLE001
        raise UserError(f"cannot resume: {step_dir}/optimizer.safetensors is corrupt ({one_line(e)}); {fix}") from None
    opt.state.update(moments)
    return step


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines past `step` (they came from the part of a killed run that is redone)."""
    if not path.exists():
        return
    keep = []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            if line.strip() and int(json.loads(line)["step"]) <= step:
                keep.append(line)
        except Exception as e:  # noqa: BLE001 - a torn or edited line
            raise UserError(f"cannot resume: {path} line {i} is not a metrics line ({one_line(e)}); "
                            "repair or delete that file, or use a fresh --out") from None
    write_atomic(path, "".join(line + "\n" for line in keep))


@dataclass
class RunResult:
    """What `train` returns."""

    run_dir: Path
    """The run directory."""
    model: torch.nn.Module
    """The final model."""
    final_metrics: dict
    """Held-out evaluation of the final model (also in final_metrics.json)."""
    resumed_from: int
    """Step the run resumed from (0 for a fresh run)."""


def train(cfg: TrainConfig, run_dir, progress: bool = True, evaluate: bool = True, stop_after: int | None = None,
          threads: int | None = 1, device="cpu") -> RunResult:
    """Train `cfg` into `run_dir`, resuming from its last checkpoint if it holds the same config.

    `stop_after` ends the loop early after that many steps of this call (for tests of resume).
    `threads`: torch intra-op threads during the run (restored after; None = leave as is). One
    thread is the default because these models are many tiny matmuls: on a shared 2-core
    machine, intra-op threading made a step 3-8x slower (measured).
    `device`: where the steps run ('cpu', 'cuda', 'auto'; `icrl_interp.core.devices`). The init and the task
    stream are drawn on the CPU as always, so a run on a GPU starts from the same parameters and sees the
    same batches; checkpoints and the evaluation are made from a CPU copy.
    """
    from tqdm import tqdm

    cfg.validate()
    device = devices.resolve(device)
    run_dir = Path(run_dir)
    rid = run_id(cfg)
    cfg_path = run_dir / "config.json"
    if cfg_path.exists():
        try:
            old = config_from_dict({k: v for k, v in json.loads(cfg_path.read_text()).items() if k != "run_id"})
        except (ValueError, TypeError, AttributeError, RecursionError, OSError) as e:
            raise UserError(f"{cfg_path} is not a training config ({one_line(e)}); use a fresh --out") from None
        differ = sorted(k for k, v in cfg.to_dict().items() if k != "steps" and old.to_dict().get(k) != v)
        check(not differ, f"{run_dir} holds a run with a different config ({', '.join(differ)}); use a fresh --out")

    deterministic, old_threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    if device.type == "cuda":
        devices.deterministic_cuda()
    torch.use_deterministic_algorithms(True)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model, masks = build(cfg)
        model.to(device)
        masks = {name: mask.to(device) for name, mask in masks.items()}
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        start = 0
        ckpts = list_checkpoints(run_dir)
        if ckpts:
            start = load_resume_state(ckpts[-1][1], model, opt)
        metrics_path = run_dir / "metrics.jsonl"
        _truncate_metrics(metrics_path, start)
        # everything that can refuse the run has run: only now is the run directory made
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(cfg_path, json.dumps({**cfg.to_dict(), "run_id": rid}, indent=1))
        recipe = recipe_of(cfg)
        objective = recipe.objective(cfg)
        named = dict(model.named_parameters())
        constrain = recipe.update_constraint(model, cfg) if recipe.update_constraint is not None else None
        end = cfg.steps if stop_after is None else min(cfg.steps, start + stop_after)
        t0 = time.perf_counter()
        bar = tqdm(range(start, end), desc=f"train {cfg.family}", disable=not progress, initial=start, total=cfg.steps)
        with open(metrics_path, "a") as log:
            for step in bar:
                lr = cfg.lr_at(step)
                for group in opt.param_groups:
                    group["lr"] = lr
                batch = recipe.batch(cfg, step_rng(cfg.seed, step))
                if device.type != "cpu":
                    batch = devices.to_device(batch, device)
                opt.zero_grad(set_to_none=True)
                loss = objective(model, batch)
                value = loss.item()
                if not math.isfinite(value):
                    raise UserError(f"training diverged at step {step} (loss {value}); lower --lr")
                loss.backward()
                for name, mask in masks.items():
                    named[name].grad.mul_(mask)
                before = {k: p.detach().clone() for k, p in named.items()} if constrain is not None else None
                opt.step()
                if constrain is not None:  # e.g. span.py: Adam would drift along directions no prompt excites
                    constrain(named, before)
                done = step + 1
                if done % cfg.log_every == 0 or done == cfg.steps:
                    line = {"step": done, "loss": value, "lr": lr, "wall_s": round(time.perf_counter() - t0, 3)}
                    log.write(json.dumps({**line, **recipe.log_extras(model, cfg)}) + "\n")
                    log.flush()
                    bar.set_postfix(loss=f"{value:.3e}")
                if done % cfg.checkpoint_every == 0 or done == cfg.steps:
                    save_checkpoint(run_dir, model, opt, cfg, done, rid)
                    if done < cfg.steps:
                        kill_point("train.checkpoint")
        final = {}
        if device.type != "cpu":
            model.to("cpu")  # the evaluation, and what the caller gets, run on the CPU
        if evaluate and end == cfg.steps:
            final = evaluate_run(model, cfg)
            final = {"step": cfg.steps, "run_id": rid, **final}
            write_atomic(run_dir / "final_metrics.json", json.dumps(final, indent=1))
        return RunResult(run_dir=run_dir, model=model, final_metrics=final, resumed_from=start)
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(old_threads)


def is_run_dir(path) -> bool:
    """A training run directory: its config.json is a training config with the trainer's run_id."""
    try:
        data = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and isinstance(data.get("run_id"), str) and isinstance(data.get("family"), str)


def export_final(run_dir, out_dir, snapshots: bool = True) -> Path:
    """Copy a finished run's last checkpoint (model + config, no optimizer state), its training
    config and final metrics into `out_dir` (e.g. data/checkpoints/<family>/); with `snapshots`, every
    earlier checkpoint too, under `out_dir/snapshots/step_NNNNNN/` (model + config: what a report needs to
    draw each metric against training step). Atomic: the whole folder appears at once."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    ckpts = list_checkpoints(run_dir)
    check(bool(ckpts), f"{run_dir} has no checkpoints to export")
    check((run_dir / "final_metrics.json").is_file(), f"{run_dir} has no final_metrics.json (is the run finished?)")
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg.pop("run_id", None)
    with atomic_dir(out_dir) as tmp:
        final = ckpts[-1][1]
        for _, src in ckpts if snapshots else ckpts[-1:]:
            dst = tmp if src == final else tmp / SNAPSHOTS / src.name
            dst.mkdir(parents=True, exist_ok=True)
            for name in ("model.safetensors", "config.json"):
                shutil.copy2(src / name, dst / name)
        shutil.copy2(run_dir / "final_metrics.json", tmp / "final_metrics.json")
        (tmp / "train_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return out_dir


def load_run_config(run_dir) -> TrainConfig:
    """The TrainConfig stored in a run directory."""
    path = Path(run_dir) / "config.json"
    check(path.is_file(), f"{run_dir} is not a training run directory (no config.json)")
    data = json.loads(path.read_text())
    data.pop("run_id", None)
    return config_from_dict(data)
