"""Training linear-attention TD (Wang et al. (c)): the torch half of the linear-td family.

* Batches: sliding windows along trajectories of randomized Boyan chains (`sample_windows`).
* Objectives: 'mstde', the semi-gradient mean squared TD error over sliding windows,
  delta_t = r(s_q^t) + gamma * stopgrad(v(Z_{t+1})) - v(Z_t); 'msve': (v(Z_t) - v_true(s_q^t))^2.
* Init: `models.build_model`'s (gain / L per untied layer, as Wang et al.'s code).
* Evaluation: VD, SS, IWS against L-step batch TD(0) at the step alpha fitted exactly on the calibration
  half of the tasks (`analyzers.td_step`, the definition `analyze` uses too; (c) co-trains that alpha
  instead), and (c)'s P/Q summaries.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from ...analyzers import td_step, weights
from ...core.errors import check
from ...families.linear_td import NAME, prompt
from ...models import ModelConfig
from ...tasks import envs
from ..config import TrainConfig
from ..recipe import Recipe, Trends
from ..util import param, tensor, torch_dtype, values

Array = np.ndarray


@dataclass
class LinearTDTrainConfig(TrainConfig):
    """Wang et al. (c): linear-attention TD transformer on randomized Boyan chains.

    One optimizer step draws `tasks_per_step` chains, `trajectories_per_task` fresh
    trajectories of each, and slides the (n+1)-column window `windows` times along
    each trajectory; (c) uses one task and one trajectory per step (64 windows, 5
    steps per task, 4000 tasks, lr 1e-3), we batch many tasks per step.
    """

    family: str = NAME
    d: int = 4
    """Feature dimension (features U(-1, 1)^{states x d}, fresh per task)."""
    n_states: int = 10
    """Boyan chain size."""
    n: int = 30
    """Context length (transition columns per prompt)."""
    n_layers: int = 3
    """Transformer depth L."""
    gamma: float = 0.9
    """Discount factor."""
    tied: bool = True
    """Share (P, Q) across layers ((c)'s 'auto' mode)."""
    windows: int = 64
    """TD errors per trajectory: windows t = 0..windows (the last one only provides a target)."""
    trajectories_per_task: int = 5
    """Independent trajectories (optimizer 'batches' in (c)) per task."""
    tasks_per_step: int = 16
    """Tasks per optimizer step (all their windows in one forward pass)."""
    objective: str = "mstde"
    """'mstde' (semi-gradient squared TD error over sliding windows, (c)) or 'msve' (squared error to true values)."""
    steps: int = 250
    lr: float = 1e-2
    weight_decay: float = 1e-6
    checkpoint_every: int = 25

    def validate(self) -> "LinearTDTrainConfig":
        super().validate()
        check(self.objective in OBJECTIVES,
              f"{NAME} objective must be {' or '.join(map(repr, OBJECTIVES))}, got {self.objective!r}")
        for name in ("d", "n", "n_layers", "windows", "trajectories_per_task", "tasks_per_step"):
            check(int(getattr(self, name)) >= 1, f"{name} must be a positive integer, got {getattr(self, name)}")
        check(self.n_states >= 3, f"a Boyan chain needs at least 3 states, got n_states={self.n_states}")
        return self


def model_config(cfg: LinearTDTrainConfig) -> ModelConfig:
    return ModelConfig(family=NAME, d=cfg.d, n_layers=cfg.n_layers, gamma=cfg.gamma, tied=cfg.tied, dtype=cfg.dtype)


def task(cfg: LinearTDTrainConfig) -> dict:
    return {"family": NAME, "kind": "boyan", "n": cfg.n, "n_states": cfg.n_states, "features": "random",
            "rewards": "uniform"}


# ------------------------------------------------------------------ batches
@dataclass
class WindowBatch:
    """Sliding windows along trajectories of Boyan chains (Wang et al.'s training prompts).

    Window t of a trajectory s_0, s_1, ... holds the transitions t .. t+n-1 as context
    and queries s_{t+n+1}; the TD target of window t is r(s_{t+n+1}) + gamma v(window t+1).
    """

    z: Float[Tensor, "seqs windows pos d_model"]
    """Prompts, one sequence of windows per (task, trajectory)."""
    query_rewards: Float[Tensor, "seqs windows_minus_one"]
    """r(s_{t+n+1}) for windows t = 0 .. windows-2."""
    query_values: Float[Tensor, "seqs windows"]
    """True value v(s_{t+n+1}) of each window's query (the MSVE target)."""
    gamma: float
    """Discount factor."""


def sample_windows(cfg: LinearTDTrainConfig, rng: np.random.Generator, size: int | None = None) -> WindowBatch:
    """`size` (default `tasks_per_step`) Boyan chains x `trajectories_per_task` trajectories x
    (`windows` + 1) windows each."""
    tasks = cfg.tasks_per_step if size is None else size
    n, W, K = cfg.n, cfg.windows, cfg.trajectories_per_task
    mrp = envs.sample_boyan_chains(tasks, cfg.n_states, cfg.d, cfg.gamma, rng=rng)
    rep = envs.MRPBatch(P=np.repeat(mrp.P, K, 0), r=np.repeat(mrp.r, K, 0), phi=np.repeat(mrp.phi, K, 0), gamma=cfg.gamma)
    traj = rep.sample(n + W + 1, rng)  # states s_0 .. s_{n+W+1}
    seqs = rep.batch
    start = np.arange(W + 1)[:, None]
    ctx = start + np.arange(n)[None, :]  # [W+1, n]: context transition indices of each window
    rows = np.arange(seqs)[:, None, None]
    phi = rep.phi[rows, traj.states[:, ctx]]  # [seqs, W+1, n, d]
    phi_next = rep.phi[rows, traj.states[:, ctx + 1]]
    rewards = traj.rewards[:, ctx]
    q_states = traj.states[:, n + 1 : n + W + 2]  # [seqs, W+1]
    phi_q = rep.phi[np.arange(seqs)[:, None], q_states]
    flat = lambda a: a.reshape((seqs * (W + 1),) + a.shape[2:])  # noqa: E731
    z = prompt(flat(phi), flat(phi_next), flat(rewards), flat(phi_q), cfg.gamma).z.reshape(seqs, W + 1, n + 1, -1)
    dtype = torch_dtype(cfg.dtype)
    v = rep.values()[np.arange(seqs)[:, None], q_states]
    return WindowBatch(
        z=tensor(z, dtype),
        query_rewards=tensor(traj.rewards[:, n + 1 : n + W + 1], dtype),
        query_values=tensor(v, dtype),
        gamma=cfg.gamma,
    )


# --------------------------------------------------------------- objectives
def window_values(model, batch: WindowBatch) -> Float[Tensor, "seqs windows"]:
    """v(Z_t) for every window of every sequence, in one forward pass."""
    return values(model, batch.z)


def mstde(model, batch: WindowBatch) -> Tensor:
    """Wang et al.'s semi-gradient MSTDE over sliding windows (target values detached)."""
    v = window_values(model, batch)
    delta = batch.query_rewards + batch.gamma * v[:, 1:].detach() - v[:, :-1]
    return delta.pow(2).mean()


def msve(model, batch: WindowBatch) -> Tensor:
    """Mean squared error of v(Z_t) against the true value of each window's query."""
    v = window_values(model, batch)
    return (v - batch.query_values).pow(2).mean()


OBJECTIVES = {"mstde": mstde, "msve": msve}


# --------------------------------------------------------------- evaluation
def _eval_set(cfg: LinearTDTrainConfig, rng: np.random.Generator, tasks: int):
    """Tasks with one context each: the chains and their (phi, phi_next, rewards) transitions."""
    mrp = envs.sample_boyan_chains(tasks, cfg.n_states, cfg.d, cfg.gamma, rng=rng)
    traj = mrp.sample(cfg.n, rng)
    rows = np.arange(tasks)[:, None]
    return mrp, (mrp.phi[rows, traj.states[:, :-1]], mrp.phi[rows, traj.states[:, 1:]], traj.rewards)


def _values_and_grads(model, z: Array, S: int, d: int) -> tuple[Array, Array]:
    """v_tf at each query and its gradient with respect to the query features, as [tasks, S(, d)]."""
    zt = torch.as_tensor(z, dtype=model.dtype).requires_grad_(True)
    v = model.readout(model(zt)).reshape(-1)
    (grad,) = torch.autograd.grad(v.sum(), zt)
    return v.detach().double().numpy().reshape(-1, S), grad[:, -1, :d].double().numpy().reshape(-1, S, d)


def evaluate_tasks(model, gamma: float, context, phi_states: Array, mu: Array, task_ids: Array,
                   v_true: Array | None = None, alpha: float | None = None, per_task: bool = False) -> dict:
    """Wang et al.'s VD / SS / IWS of `model` on given tasks, by `analyzers.td_step`'s definition (the one
    `icrl-interp analyze` uses): batch TD with as many steps as the model has layers, at the step fitted on
    the calibration half of the tasks (by task id) or `alpha`; metrics on the other half.

    context = (phi, phi_next, rewards) [tasks, n(, d)] of each task's prompt; every state's features are put
    in the query of a copy of it (v_tf and its query gradient by autograd, not assuming linearity). With
    `per_task`, also `per_task`: {task_id, VD, SS, IWS} arrays over the scored tasks (one prompt each), for
    intervals over tasks."""
    phi, phi_next, rewards = (np.asarray(a, dtype=np.float64) for a in context)
    (B, S, d), L = phi_states.shape, model.config.n_layers
    rep = lambda a: np.repeat(a, S, axis=0)  # noqa: E731  one prompt per (task, query state)
    z = prompt(rep(phi), rep(phi_next), rep(rewards), phi_states.reshape(B * S, d), gamma).z
    v_tf, g_tf = _values_and_grads(model, z, S, d)
    coef = td_step.td_weight_polynomial(phi, gamma * phi_next, rewards, L)
    ev = td_step.WangEvaluation(L, alpha)
    ev.update(task_ids, v_tf, g_tf, coef, phi_states, mu)
    res, per_prompt = ev.result()
    out = {"alpha_fit": res["alpha"], **{k: res[k] for k in ("alpha_source", "VD", "SS", "IWS", "n_tasks")}}
    if per_task:
        out["per_task"] = per_prompt
    if v_true is not None:
        keep = np.ones(B, dtype=bool) if alpha is not None else ~td_step.calibration_tasks(task_ids)
        v_td = np.einsum("bsd,bd->bs", phi_states, td_step.weights_at(coef, res["alpha"]))
        for name, v in (("msve_tf", v_tf), ("msve_td", v_td)):
            out[name] = float(np.mean(np.sum(mu * (v - v_true) ** 2, -1)[keep]))
    return out


def evaluate(model, cfg: LinearTDTrainConfig, rng: np.random.Generator) -> dict:
    """`evaluate_tasks` on `eval_tasks` fresh tasks (ids 0..eval_tasks-1: about half calibrate the TD step, the
    rest are scored), the MSVE of the model and of batch TD, and P/Q summaries per layer."""
    mrp, ctx = _eval_set(cfg, rng, cfg.eval_tasks)
    out = evaluate_tasks(model, cfg.gamma, ctx, mrp.phi, mrp.stationary(), np.arange(cfg.eval_tasks), mrp.values())
    layers = range(1 if cfg.tied else cfg.n_layers)
    out["layers"] = [weights.pq_summary(param(model, l, "P"), param(model, l, "Q"), model.layout) for l in layers]
    return out


def trend_series(rows: list[dict]) -> dict[str, list[float]]:
    return {k: [r[k] for r in rows] for k in ("SS", "IWS", "VD")}


TRAINING = Recipe(
    config_class=LinearTDTrainConfig,
    model_config=model_config,
    task=task,
    batch=sample_windows,
    objectives=OBJECTIVES,
    evaluate=evaluate,
    trends=Trends(series=trend_series, lines=lambda cfg: [(0.9, "target SS, IWS >= 0.9")]),
)
