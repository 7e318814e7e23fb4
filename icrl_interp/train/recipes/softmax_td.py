"""Training softmax TD (Xie et al. (a)): the torch half of the softmax-td family.

* Batches: one context per Boyan chain (one-hot x beta features), repeated with every state in
  the query (`sample_state_queries`).
* Objectives ('neu' is the project definition; the paper's exact J_{L,n} was not available):
  with the query set to each state s under one context,
  dbar(s) = r(s) + gamma sum_s' P(s, s') v(s') - v(s) and J = E_task sum_s mu(s)^2 dbar(s)^2,
  i.e. ||D_mu dbar||^2, the squared norm of the expected TD update E[delta phi] for one-hot phi.
  Gradients flow through both v(s) and v(s'). 'td': the semi-gradient alternative,
  sum_s mu(s) (r(s) + gamma stopgrad(P v)(s) - v(s))^2.
* Init with `masks`: only the paper's sparsity pattern (App. F.2) stays non-zero and trainable:
  A's x-x block, and V's value row over (R, target, current) (the target row for the dual form's
  second head). A masked entry starts at 0.0 and its gradient is zeroed before each Adam step, so
  its Adam moments stay 0 and the entry stays exactly 0.0 (Adam's L2 term wd * p is 0 there too).
* Evaluation: NEU, ||v_l - v_pi||_inf per depth l, the value row and its sign pattern, and the
  population kernel's diagonality against Assumption 5.1's threshold (1 + gamma)/2.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from ...analyzers import convergence, kernel, weights
from ...core.errors import check
from ...families.softmax_td import NAME, prompt_from_mrp
from ...models import ModelConfig
from ...tasks import envs, layouts
from ..config import TrainConfig
from ..recipe import Recipe, Trends
from ..util import param, tensor, torch_dtype, values

Array = np.ndarray


@dataclass
class SoftmaxTDTrainConfig(TrainConfig):
    """Xie et al. (a): softmax ICTD transformer on randomized Boyan chains with one-hot x beta features.

    The trainable parameters are the full (A_l, V_l) unless `masks` is set, in which
    case only the paper's sparsity pattern trains (A's x-x block and V's value row
    over (R, target, current)); everything outside the mask is zero and stays so.
    """

    family: str = NAME
    n_states: int = 5
    """Boyan chain size; d = n_states with one-hot features."""
    beta: float = 1.0
    """Feature scale: x(s) = beta e_s (the kernel sharpness is beta^2 times A's scale)."""
    n: int = 40
    """Context length (columns 1..n hold S_{k-1}, R_k; column n+1 is the query)."""
    n_layers: int = 6
    """Transformer depth L."""
    gamma: float = 0.9
    """Discount factor."""
    tied: bool = True
    """One (A, V) shared by all layers."""
    form: str = "tsm"
    """'tsm' (single head + temporal shift module) or 'dual' (two heads)."""
    objective: str = "neu"
    """'neu' (norm of the expected update, project definition) or 'td' (semi-gradient expected TD error)."""
    masks: bool = True
    """Train only inside the paper's fixed sparsity masks (App. F.2)."""
    tasks_per_step: int = 64
    """Tasks (chains, one context each) per optimizer step."""
    steps: int = 1000
    lr: float = 1e-2

    def validate(self) -> "SoftmaxTDTrainConfig":
        super().validate()
        check(self.objective in OBJECTIVES,
              f"{NAME} objective must be {' or '.join(map(repr, OBJECTIVES))}, got {self.objective!r}")
        check(self.form in ("tsm", "dual"), f"form must be 'tsm' or 'dual', got {self.form!r}")
        for name in ("n", "n_layers", "tasks_per_step"):
            check(int(getattr(self, name)) >= 1, f"{name} must be a positive integer, got {getattr(self, name)}")
        check(self.n_states >= 3, f"a Boyan chain needs at least 3 states, got n_states={self.n_states}")
        check(self.beta > 0, f"beta must be positive, got {self.beta}")
        return self


def model_config(cfg: SoftmaxTDTrainConfig) -> ModelConfig:
    return ModelConfig(family=NAME, d=cfg.n_states, n_layers=cfg.n_layers, gamma=cfg.gamma, tied=cfg.tied,
                       form=cfg.form, dtype=cfg.dtype)


def task(cfg: SoftmaxTDTrainConfig) -> dict:
    return {"family": NAME, "kind": "boyan", "n": cfg.n, "n_states": cfg.n_states, "features": "onehot",
            "beta": cfg.beta, "rewards": "uniform"}


# ------------------------------------------------------------------ batches
@dataclass
class StateQueryBatch:
    """One context per task, repeated with the query column set to every state in turn."""

    z: Float[Tensor, "batch states pos d_model"]
    """Prompts: z[b, s] is task b's context with x(s) in the query column."""
    P: Float[Tensor, "batch states states"]
    """Transition matrices."""
    r: Float[Tensor, "batch states"]
    """Rewards r(s)."""
    mu: Float[Tensor, "batch states"]
    """Stationary distributions."""
    v_true: Float[Tensor, "batch states"]
    """Exact values (I - gamma P)^{-1} r."""
    gamma: float
    """Discount factor."""


def chains_for(cfg: SoftmaxTDTrainConfig, batch: int, rng: np.random.Generator) -> envs.MRPBatch:
    """The family's task distribution: Boyan chains with one-hot x beta features."""
    return envs.sample_boyan_chains(batch, cfg.n_states, cfg.n_states, cfg.gamma, rng=rng, features="onehot", beta=cfg.beta)


def sample_state_queries(cfg: SoftmaxTDTrainConfig, rng: np.random.Generator, size: int | None = None) -> StateQueryBatch:
    """`size` (default `tasks_per_step`) chains, one trajectory S_0..S_n each, every state as the query."""
    batch = cfg.tasks_per_step if size is None else size
    mrp = chains_for(cfg, batch, rng)
    traj = mrp.sample(cfg.n, rng)
    S = cfg.n_states
    prompt = prompt_from_mrp(mrp, traj)
    z = np.repeat(prompt.z[:, None], S, axis=1)  # [B, S, n+1, D]
    z[:, :, -1, prompt.layout.slice("x")] = mrp.phi  # query column of copy s holds x(s)
    dtype = torch_dtype(cfg.dtype)
    return StateQueryBatch(
        z=tensor(z, dtype), P=tensor(mrp.P, dtype), r=tensor(mrp.r, dtype), mu=tensor(mrp.stationary(), dtype),
        v_true=tensor(mrp.values(), dtype), gamma=cfg.gamma,
    )


# --------------------------------------------------------------- objectives
def expected_td_errors(v: Float[Tensor, "batch states"], batch: StateQueryBatch, semi: bool = False) -> Float[Tensor, "batch states"]:
    """dbar(s) = r(s) + gamma (P v)(s) - v(s); with `semi` the bootstrap term carries no gradient."""
    boot = torch.einsum("bst,bt->bs", batch.P, v.detach() if semi else v)
    return batch.r + batch.gamma * boot - v


def neu(model, batch: StateQueryBatch) -> Tensor:
    """Norm of the expected update: mean over tasks of sum_s mu(s)^2 dbar(s)^2 (full gradient)."""
    dbar = expected_td_errors(values(model, batch.z), batch)
    return (batch.mu * dbar).pow(2).sum(-1).mean()


def expected_td(model, batch: StateQueryBatch) -> Tensor:
    """Semi-gradient expected TD error: mean over tasks of sum_s mu(s) dbar(s)^2, P v detached."""
    dbar = expected_td_errors(values(model, batch.z), batch, semi=True)
    return (batch.mu * dbar.pow(2)).sum(-1).mean()


OBJECTIVES = {"neu": neu, "td": expected_td}


# --------------------------------------------------------------------- init
def masks(layout: layouts.PromptLayout) -> dict[str, Tensor]:
    """Masks (1 = trainable) for A, V and V_target, by parameter suffix (the paper's sparsity pattern)."""
    D = layout.d_model
    x = layout.slice("x")
    mem = [layout.slice(b).start for b in ("reward", "target_mem", "current_mem")]
    A = torch.zeros(D, D)
    A[x, x] = 1.0
    V = torch.zeros(D, D)
    V[layout.slice("current_mem").start, mem] = 1.0
    Vt = torch.zeros(D, D)
    Vt[layout.slice("target_mem").start, mem] = 1.0
    return {"A": A, "V": V, "V_target": Vt}


def adjust_init(model: torch.nn.Module, cfg: SoftmaxTDTrainConfig, generator: torch.Generator) -> dict[str, Tensor]:
    """With `masks`: zero everything outside the sparsity pattern; returns {parameter: 0/1 gradient mask}."""
    out: dict[str, Tensor] = {}
    if not cfg.masks:
        return out
    named = dict(model.named_parameters())
    by_suffix = masks(model.layout)
    for name in sorted(named):
        p = named[name]
        suffix = name.rsplit(".", 1)[-1]
        if suffix in by_suffix:
            out[name] = by_suffix[suffix].to(p.dtype)
            with torch.no_grad():
                p.mul_(out[name])
    return out


# --------------------------------------------------------------- evaluation
def value_row(model, layer: int) -> Array:
    """The learned value row over (R, target, current) of the current-memory head."""
    lay = model.layout
    cols = [lay.slice(b).start for b in ("reward", "target_mem", "current_mem")]
    return param(model, layer, "V")[lay.slice("current_mem").start, cols]


def evaluate(model, cfg: SoftmaxTDTrainConfig, rng: np.random.Generator) -> dict:
    """NEU, value error by depth, and per layer the value row, its sign pattern and the kernel's diagonality."""
    batch = sample_state_queries(cfg, rng, cfg.eval_tasks)
    v_true = batch.v_true.double().numpy()
    errors = [float(np.mean(np.abs(v_true).max(-1)))]  # v_0 = 0
    with torch.no_grad():
        loss = float(neu(model, batch))
        flat = batch.z.reshape((-1,) + batch.z.shape[-2:])
        for l in range(1, cfg.n_layers + 1):
            v = model.readout(model(flat, stop_at_layer=l)).reshape(v_true.shape).double().numpy()
            errors.append(float(np.mean(convergence.value_errors(v, v_true)[0])))
    lay = model.layout
    x = cfg.beta * np.broadcast_to(np.eye(cfg.n_states), (cfg.eval_tasks, cfg.n_states, cfg.n_states))
    mu = batch.mu.double().numpy()
    threshold = (1 + cfg.gamma) / 2
    out_layers = []
    for l in range(1 if cfg.tied else cfg.n_layers):
        A11 = param(model, l, "A")[lay.slice("x"), lay.slice("x")]
        diag = np.diagonal(kernel.population_kernel(A11, x, mu), axis1=-2, axis2=-1)
        row = value_row(model, l)
        out_layers.append({
            "layer": l, "value_row": row.tolist(), "sign_pattern": weights.sign_pattern(row),
            "value_row_cosine": weights.cosine(row, [1.0, 1.0, -1.0]),
            "kernel_diag_mean": float(diag.mean()), "kernel_diag_min": float(diag.min(-1).mean()),
            "margin": float(diag.min(-1).mean() - threshold),
            "assumption_5_1_fraction": float(np.mean(diag.min(-1) > threshold)),
        })
    return {"neu": loss, "value_error_inf_by_depth": errors, "layers": out_layers}


def trend_series(rows: list[dict]) -> dict[str, list[float]]:
    lay = [r["layers"][0] for r in rows]
    return {"kernel diag mean": [x["kernel_diag_mean"] for x in lay], "kernel diag min": [x["kernel_diag_min"] for x in lay],
            "value-row cosine to (1,1,-1)": [x["value_row_cosine"] for x in lay],
            "value error (last layer)": [r["value_error_inf_by_depth"][-1] for r in rows]}


TRAINING = Recipe(
    config_class=SoftmaxTDTrainConfig,
    model_config=model_config,
    task=task,
    batch=sample_state_queries,
    objectives=OBJECTIVES,
    evaluate=evaluate,
    trends=Trends(series=trend_series,
                  lines=lambda cfg: [((1 + cfg.gamma) / 2, "Assumption 5.1 threshold (1+gamma)/2")]),
    adjust_init=adjust_init,
    log_extras=lambda model, cfg: {"value_row": value_row(model, 0).tolist()},
)
