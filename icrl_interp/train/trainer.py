"""The training loop: a seeded, resumable run directory.

    RUN_DIR/config.json                    the full TrainConfig (+ run_id)
    RUN_DIR/metrics.jsonl                  one JSON line per `log_every` steps: step, loss, lr, wall_s (+ family extras)
    RUN_DIR/checkpoints/step_000100/       a model checkpoint (icrl_interp.checkpoint format) every
                                           `checkpoint_every` steps, plus the resume state:
                                           optimizer.safetensors (Adam moments) and trainer_state.json
    RUN_DIR/final_metrics.json             held-out evaluation of the final model

Determinism: the model init draws from `torch.Generator(seed)`, and the tasks of step t
from `numpy.random.default_rng([seed, 1, t])`, so a run resumed at step t sees exactly
the batches an uninterrupted run sees, and the same seed gives identical checkpoints.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError, check
from . import evaluate as E
from . import tasks as T
from .config import TrainConfig, config_from_dict
from .init import adjust_init, lazy_slice
from .objectives import objective_for
from .span import project_updates, transition_span_projector

TRAIN_STREAM, EVAL_STREAM = 1, 2


def step_rng(seed: int, step: int) -> np.random.Generator:
    """The task stream of optimizer step `step`."""
    return np.random.default_rng([seed, TRAIN_STREAM, step])


def sample_batch(cfg: TrainConfig, rng: np.random.Generator):
    """One training batch of the family."""
    if cfg.family == "linear-td":
        return T.sample_windows(cfg, rng)
    if cfg.family == "softmax-td":
        return T.sample_state_queries(cfg, rng)
    if cfg.family == "actor-critic":
        from ..actor_critic import train_batch

        return train_batch(cfg, rng)
    return T.sample_sarsa(cfg, rng)


def run_id(cfg: TrainConfig) -> str:
    """Deterministic id: family, seed and a hash of the config (so same config -> same checkpoints)."""
    blob = json.dumps({k: v for k, v in cfg.to_dict().items() if k not in ("steps", "checkpoint_every", "log_every")}, sort_keys=True)
    return f"{cfg.family}-s{cfg.seed}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


# ---------------------------------------------------------------- models
def model_config(cfg: TrainConfig):
    """The ModelConfig a training config trains."""
    from ..models import ModelConfig

    if cfg.family == "linear-td":
        return ModelConfig(family="linear-td", d=cfg.d, n_layers=cfg.n_layers, gamma=cfg.gamma, tied=cfg.tied, dtype=cfg.dtype)
    if cfg.family == "softmax-td":
        return ModelConfig(family="softmax-td", d=cfg.n_states, n_layers=cfg.n_layers, gamma=cfg.gamma, tied=cfg.tied,
                           form=cfg.form, dtype=cfg.dtype)
    if cfg.family == "actor-critic":  # tabular softmax policy: m = d
        d = cfg.n_states * cfg.n_actions
        return ModelConfig(family="actor-critic", d=d, m=d, n_layers=1, gamma=cfg.gamma, alpha=cfg.alpha, dtype=cfg.dtype)
    return ModelConfig(family="sarsa", d=cfg.n_states * cfg.n_actions, n_layers=1, gamma=cfg.gamma, alpha=cfg.alpha,
                       dtype=cfg.dtype)


def task_spec(cfg: TrainConfig) -> dict:
    """The checkpoint's `task` field (the keys of icrl_interp.sampling.TaskSpec)."""
    if cfg.family == "linear-td":
        return {"kind": "boyan", "n": cfg.n, "n_states": cfg.n_states, "features": "random", "rewards": "uniform"}
    if cfg.family == "softmax-td":
        return {"kind": "boyan", "n": cfg.n, "n_states": cfg.n_states, "features": "onehot", "beta": cfg.beta, "rewards": "uniform"}
    return {"kind": "mdp", "n": cfg.n, "n_states": cfg.n_states, "n_actions": cfg.n_actions,
            "concentration": cfg.concentration, "epsilon": cfg.epsilon, "w_scale": cfg.w_std}


def build(cfg: TrainConfig):
    """A freshly initialised model and its gradient masks."""
    from ..models import build_model

    gen = torch.Generator().manual_seed(cfg.seed)
    model = build_model(model_config(cfg), seed=gen, gain=cfg.init_gain)
    masks = adjust_init(model, cfg, gen)
    return model, masks


# ------------------------------------------------------------- run files
def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
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

    from .. import checkpoint

    final = _step_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    extras = {"origin": {"kind": "trained", "run_id": rid, "step": step}, "task": task_spec(cfg), "seed": cfg.seed, "n": cfg.n,
              "training": cfg.to_dict()}
    checkpoint.save(model, extras, tmp)
    names = {id(p): n for n, p in model.named_parameters()}
    tensors, counts = {}, {}
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state.get(p, {})
            if state:
                tensors[f"{names[id(p)]}.exp_avg"] = state["exp_avg"].contiguous()
                tensors[f"{names[id(p)]}.exp_avg_sq"] = state["exp_avg_sq"].contiguous()
                counts[names[id(p)]] = float(state["step"])
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, "adam_steps": counts, "run_id": rid}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def load_resume_state(step_dir: Path, model, opt: torch.optim.Optimizer) -> int:
    """Load parameters and Adam moments of a checkpoint into `model` and `opt`; returns its step."""
    from safetensors.torch import load_file

    from .. import checkpoint

    loaded = checkpoint.load(step_dir)
    loaded_model = loaded[0] if isinstance(loaded, tuple) else loaded
    with torch.no_grad():
        src = dict(loaded_model.named_parameters())
        for name, p in model.named_parameters():
            check(name in src and src[name].shape == p.shape, f"checkpoint {step_dir} does not match the run's model ({name})")
            p.copy_(src[name])
    state = json.loads((step_dir / "trainer_state.json").read_text())
    tensors = load_file(str(step_dir / "optimizer.safetensors"))
    for name, p in model.named_parameters():
        if name in state["adam_steps"]:
            opt.state[p] = {
                "step": torch.tensor(state["adam_steps"][name]),
                "exp_avg": tensors[f"{name}.exp_avg"].to(p.dtype),
                "exp_avg_sq": tensors[f"{name}.exp_avg_sq"].to(p.dtype),
            }
    return int(state["step"])


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines past `step` (they came from the part of a killed run that is redone)."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    _atomic_write(path, "".join(line + "\n" for line in keep))


def family_extras(model, cfg: TrainConfig) -> dict:
    """Cheap per-log-line diagnostics (SARSA: max |lazy block entry|; softmax: value row of layer 0)."""
    if cfg.family in ("sarsa", "actor-critic"):
        two = lazy_slice(model.layout)
        return {"lazy_max_abs": max(float(p.detach()[two, two].abs().max()) for p in model.parameters())}
    if cfg.family == "softmax-td":
        return {"value_row": E.value_row(model, 0).tolist()}
    return {}


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
          threads: int | None = 1) -> RunResult:
    """Train `cfg` into `run_dir`, resuming from its last checkpoint if it holds the same config.

    `stop_after` ends the loop early after that many steps of this call (for tests of resume).
    `threads`: torch intra-op threads during the run (restored after; None = leave as is). One
    thread is the default because these models are many tiny matmuls: on a shared 2-core
    machine, intra-op threading made a step 3-8x slower (measured).
    """
    from tqdm import tqdm

    cfg.validate()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rid = run_id(cfg)
    cfg_path = run_dir / "config.json"
    if cfg_path.exists():
        try:
            old = config_from_dict({k: v for k, v in json.loads(cfg_path.read_text()).items() if k != "run_id"})
        except (json.JSONDecodeError, UserError) as e:
            raise UserError(f"{cfg_path} is not a training config ({e}); use a fresh --out") from None
        differ = sorted(k for k, v in cfg.to_dict().items() if k != "steps" and old.to_dict().get(k) != v)
        check(not differ, f"{run_dir} holds a run with a different config ({', '.join(differ)}); use a fresh --out")
    _atomic_write(cfg_path, json.dumps({**cfg.to_dict(), "run_id": rid}, indent=1))

    deterministic, old_threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model, masks = build(cfg)
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        start = 0
        ckpts = list_checkpoints(run_dir)
        if ckpts:
            start = load_resume_state(ckpts[-1][1], model, opt)
        metrics_path = run_dir / "metrics.jsonl"
        _truncate_metrics(metrics_path, start)
        objective = objective_for(cfg)
        named = dict(model.named_parameters())
        span = transition_span_projector(cfg, model.layout) if getattr(cfg, "span_projection", False) else None
        end = cfg.steps if stop_after is None else min(cfg.steps, start + stop_after)
        t0 = time.perf_counter()
        bar = tqdm(range(start, end), desc=f"train {cfg.family}", disable=not progress, initial=start, total=cfg.steps)
        with open(metrics_path, "a") as log:
            for step in bar:
                lr = cfg.lr_at(step)
                for group in opt.param_groups:
                    group["lr"] = lr
                batch = sample_batch(cfg, step_rng(cfg.seed, step))
                opt.zero_grad(set_to_none=True)
                loss = objective(model, batch)
                value = loss.item()
                if not math.isfinite(value):
                    raise UserError(f"training diverged at step {step} (loss {value}); lower --lr")
                loss.backward()
                for name, mask in masks.items():
                    named[name].grad.mul_(mask)
                before = {k: p.detach().clone() for k, p in named.items()} if span is not None else None
                opt.step()
                if span is not None:  # see span.py: Adam would drift along directions no prompt excites
                    project_updates(named, before, span, model.layout)
                done = step + 1
                if done % cfg.log_every == 0 or done == cfg.steps:
                    line = {"step": done, "loss": value, "lr": lr, "wall_s": round(time.perf_counter() - t0, 3)}
                    log.write(json.dumps({**line, **family_extras(model, cfg)}) + "\n")
                    log.flush()
                    bar.set_postfix(loss=f"{value:.3e}")
                if done % cfg.checkpoint_every == 0 or done == cfg.steps:
                    save_checkpoint(run_dir, model, opt, cfg, done, rid)
        final = {}
        if evaluate and end == cfg.steps:
            final = E.evaluate(model, cfg, np.random.default_rng([cfg.seed, EVAL_STREAM]))
            final = {"step": cfg.steps, "run_id": rid, **final}
            _atomic_write(run_dir / "final_metrics.json", json.dumps(final, indent=1))
        return RunResult(run_dir=run_dir, model=model, final_metrics=final, resumed_from=start)
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(old_threads)


def export_final(run_dir, out_dir) -> Path:
    """Copy a finished run's last checkpoint (model + config, no optimizer state), its training
    config and final metrics into `out_dir` (e.g. data/checkpoints/<family>/); atomic."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    ckpts = list_checkpoints(run_dir)
    check(bool(ckpts), f"{run_dir} has no checkpoints to export")
    check((run_dir / "final_metrics.json").is_file(), f"{run_dir} has no final_metrics.json (is the run finished?)")
    src = ckpts[-1][1]
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("model.safetensors", "config.json"):
        shutil.copy2(src / name, tmp / name)
    shutil.copy2(run_dir / "final_metrics.json", tmp / "final_metrics.json")
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg.pop("run_id", None)
    (tmp / "train_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return out_dir


def load_run_config(run_dir) -> TrainConfig:
    """The TrainConfig stored in a run directory."""
    path = Path(run_dir) / "config.json"
    check(path.is_file(), f"{run_dir} is not a training run directory (no config.json)")
    data = json.loads(path.read_text())
    data.pop("run_id", None)
    return config_from_dict(data)
