"""Train an example model to predict the value of the query state on the linear-td task.

The task is the one `icrl-interp record --task linear-td --d 4 --n 30 --n-layers 3` records on
(`icrl_interp.models.construct.task_config`): randomized Boyan chains with 10 states, random features in
R^4, gamma 0.9, n = 30 context transitions and a query state. Every prompt z[batch, 31, 9] is one
fresh chain; the last position holds the query state's features.

Target: the TRUE value of the query state, v_pi(s_q) = tasks["values"][b, s_q] with
s_q = prompt.states[b, -1] (exact, from (I - gamma P)^-1 r), not the reference algorithm's output
(batch TD after `layers` steps, which is itself a poor estimate of v_pi on these tasks).

    python examples/train_example.py torch --steps 1200 --out torch_model.safetensors
    python examples/train_example.py tl    --steps 1200 --out tl_model.safetensors
    python examples/train_example.py torch --target reward --steps 1200 --out decoy_model.safetensors

`--target reward` trains the decoy: the same architecture on the query state's IMMEDIATE reward r(s_q)
(= tasks["r"][b, s_q]), a model of TD with discount 0, which runs no bootstrapping at all. The toolkit must
not call it TD: its verdict must be "none fits" or "reward regression", its causal conclusion not "yes".

Each model module (`torch_model.py`, `tl_model.py`) has `make()` (the untrained module) and
`train(steps, seed, out)`, which call `fit` below.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

TASK = "linear-td"
TASK_OPTIONS = {"d": 4, "n": 30, "n_layers": 3}
"""The task the examples are trained and recorded on (the flags --d 4 --n 30 --n-layers 3)."""
HELD_OUT_SEED = 20_000
"""Seed of the held-out tasks the value error is measured on (training uses other streams)."""
TARGETS = {"value": "values", "reward": "r"}
"""What a model is trained to predict at the query state s_q: its true value v_pi(s_q), or (the decoy) its
immediate reward r(s_q); the key of the task's table (`tasks[...]`, [batch, states])."""


def task():
    """The linear-td task as a checkpoint config without weights (`.sample(batch, rng)`)."""
    from icrl_interp.models.construct import task_config

    return task_config(TASK, TASK_OPTIONS)


def batch(config, size: int, rng, target: str = "value") -> tuple[torch.Tensor, torch.Tensor, dict]:
    """`size` fresh tasks: prompts z [size, pos, d_model] (float32), the target at each query state [size, 1]
    (`TARGETS`: the true value, or the immediate reward), and the batch's reference run (batch TD after
    `layers` steps) for comparison."""
    pb = config.sample(size, rng)
    query = pb.prompt.states[:, -1]
    v_query = pb.tasks[TARGETS[target]][np.arange(size), query]
    z = torch.from_numpy(np.ascontiguousarray(pb.prompt.z, dtype=np.float32))
    target = torch.from_numpy(v_query.astype(np.float32)).unsqueeze(-1)
    return z, target, pb.reference


@torch.no_grad()
def value_error(model: nn.Module, z: torch.Tensor, target: torch.Tensor, chunk: int = 1024) -> dict:
    """Held-out error of the model's prediction against v_pi(s_q): RMSE, MSE, mean absolute error (what
    the analyzers' readouts report as value error), and the fraction of the target's variance left
    unexplained (1 - R^2; predicting the mean scores 1)."""
    was = model.training
    model.eval()
    try:
        pred = torch.cat([model(z[i:i + chunk]).reshape(-1, 1) for i in range(0, len(z), chunk)])
    finally:
        model.train(was)
    mse = float(((pred - target) ** 2).mean())
    return {"rmse": math.sqrt(mse), "mse": mse, "mae": float((pred - target).abs().mean()),
            "unexplained": mse / float(target.var(unbiased=False))}


def held_out(size: int = 2048, target: str = "value"):
    """The held-out tasks (fixed seed): z, the target at s_q, and the reference run's output on them."""
    z, target, ref = batch(task(), size, np.random.default_rng(HELD_OUT_SEED), target)
    return z, target, torch.from_numpy(np.asarray(ref["output"], dtype=np.float32))


def fit(make, steps: int = 1200, seed: int = 0, out=None, *, batch_size: int = 256, lr: float = 3e-3,
        held_out_size: int = 2048, log_every: int = 250, quiet: bool = False, target: str = "value") -> dict:
    """Train `make()` by Adam on the squared error to v_pi(s_q), fresh tasks every step, with a short
    warm-up and a cosine decay; save the weights (safetensors state dict) to `out` when given.

    Returns {"before", "after", "reference", "mean_predictor", "steps", "wall_s", "cpu_s", "out"}: the
    held-out value errors of the model at initialization and after training, of the reference
    algorithm's output (batch TD, `layers` steps), and of predicting the mean (RMSE = std of v_pi(s_q)).
    """
    from safetensors.torch import save_file

    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    torch.manual_seed(seed)
    model = make()
    config = task()
    z_test, v_test, ref_test = held_out(held_out_size, target)
    before = value_error(model, z_test, v_test)
    reference = float(((ref_test - v_test) ** 2).mean()) ** 0.5
    mean_rmse = float(v_test.std(unbiased=False))
    say(f"held-out value error before training: RMSE {before['rmse']:.3f} (unexplained {before['unexplained']:.2f}); "
        f"predicting the mean: {mean_rmse:.3f}; batch TD ({TASK_OPTIONS['n_layers']} steps): {reference:.3f}")

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    rng = np.random.default_rng([seed, 1])
    chunk = max(batch_size, 4096 // batch_size * batch_size)  # sample many tasks at once: numpy is faster in bulk
    pool: list = []
    wall0, cpu0 = time.perf_counter(), time.process_time()
    model.train()
    running = None
    for step in range(steps):
        if not pool:
            z_all, v_all, _ = batch(config, chunk, rng, target)
            pool = list(zip(z_all.split(batch_size), v_all.split(batch_size)))
        z, v = pool.pop()
        loss = ((model(z).reshape(-1, 1) - v) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        value = float(loss.detach())
        running = value if running is None else 0.98 * running + 0.02 * value
        if log_every and (step + 1) % log_every == 0:
            say(f"  step {step + 1:>5}/{steps}  train MSE {running:.3f}  ({time.perf_counter() - wall0:.0f} s)")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    model.eval()
    after = value_error(model, z_test, v_test)
    say(f"held-out value error after {steps} steps: RMSE {after['rmse']:.3f} (unexplained {after['unexplained']:.2f}); "
        f"training took {wall:.1f} s wall, {cpu:.1f} s CPU")
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(out))
        say(f"weights: {out}")
    return {"before": before, "after": after, "reference": reference, "mean_predictor": mean_rmse, "steps": steps,
            "wall_s": wall, "cpu_s": cpu, "out": None if out is None else str(out), "model": model}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("which", choices=("torch", "tl"), help="torch: torch_model.py; tl: tl_model.py (TransformerLens)")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="weights file (default: <which>_model.safetensors)")
    p.add_argument("--json", help="also write the numbers as JSON here")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice)")
    p.add_argument("--target", choices=tuple(TARGETS), default="value",
                   help="what to predict at the query state: its true value (default), or its immediate reward "
                        "(the decoy: no RL algorithm, TD with discount 0)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    module = importlib.import_module(f"{args.which}_model")
    default = f"{args.which}_model.safetensors" if args.target == "value" else "decoy_model.safetensors"
    result = module.train(args.steps, args.seed, args.out or default, target=args.target)
    if args.json:
        result = {k: v for k, v in result.items() if k != "model"}
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
