"""Training linear-attention TD (Wang et al. (c)): the torch half of the linear-td family.

* Batches: sliding windows along trajectories of randomized Boyan chains (`sample_windows`).
* Objectives: 'mstde', the semi-gradient mean squared TD error over sliding windows,
  delta_t = r(s_q^t) + gamma * stopgrad(v(Z_{t+1})) - v(Z_t); 'msve': (v(Z_t) - v_true(s_q^t))^2.
* Init: `models.build_model`'s (gain / L per untied layer, as Wang et al.'s code).
* Evaluation: VD, SS, IWS against L-step batch TD(0) whose step alpha fits best (1-D search) on
  separate calibration tasks ((c) co-trains that alpha instead), and (c)'s P/Q summaries.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from .. import envs, reference
from ..analyzers import convergence, weights
from ..errors import check
from ..models import ModelConfig
from ..train.config import TrainConfig
from ..train.recipe import Recipe, Trends
from ..train.util import param, tensor, torch_dtype, values
from .linear_td import NAME, prompt

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
    """Tasks with one context each, every state's features in the query of a copy of it."""
    mrp = envs.sample_boyan_chains(tasks, cfg.n_states, cfg.d, cfg.gamma, rng=rng)
    traj = mrp.sample(cfg.n, rng)
    S, rows = cfg.n_states, np.arange(tasks)[:, None]
    phi, phi_next = mrp.phi[rows, traj.states[:, :-1]], mrp.phi[rows, traj.states[:, 1:]]
    rep = lambda a: np.repeat(a, S, axis=0)  # noqa: E731  one prompt per (task, query state)
    p = prompt(rep(phi), rep(phi_next), rep(traj.rewards), mrp.phi.reshape(tasks * S, cfg.d), cfg.gamma)
    return mrp, (phi, phi_next, traj.rewards), p.z


def _values_and_grads(model, z: Array, S: int, d: int) -> tuple[Array, Array]:
    """v_tf at each query and its gradient with respect to the query features, as [tasks, S(, d)]."""
    zt = torch.as_tensor(z, dtype=model.dtype).requires_grad_(True)
    v = model.readout(model(zt)).reshape(-1)
    (grad,) = torch.autograd.grad(v.sum(), zt)
    return v.detach().double().numpy().reshape(-1, S), grad[:, -1, :d].double().numpy().reshape(-1, S, d)


def _td_weights(context, cfg: LinearTDTrainConfig, alpha: float) -> Array:
    phi, phi_next, rewards = context
    tr = reference.batch_td(phi, phi_next, rewards, np.zeros((phi.shape[0], cfg.d)), cfg.gamma, alpha, cfg.n_layers)
    return tr.w[:, -1]


def fit_alpha(v_tf: Array, mrp: envs.MRPBatch, context, cfg: LinearTDTrainConfig) -> float:
    """The step alpha of L-step batch TD whose values are closest (d_pi-weighted) to v_tf."""
    mu = mrp.stationary()

    def vd(alpha: float) -> float:
        v_td = np.einsum("bsd,bd->bs", mrp.phi, _td_weights(context, cfg, alpha))
        return float(np.mean(np.sum(mu * (v_tf - v_td) ** 2, -1)))

    grid = np.geomspace(1e-2, 1e2, 81)
    best = grid[int(np.argmin([vd(a) for a in grid]))]
    fine = np.geomspace(best / 1.13, best * 1.13, 41)
    return float(fine[int(np.argmin([vd(a) for a in fine]))])


def evaluate(model, cfg: LinearTDTrainConfig, rng: np.random.Generator) -> dict:
    """alpha_fit, VD/SS/IWS (task means), the MSVE of the model and of batch TD, and P/Q summaries per layer."""
    S, d = cfg.n_states, cfg.d
    cal_mrp, cal_ctx, cal_z = _eval_set(cfg, rng, cfg.eval_tasks)
    alpha = fit_alpha(_values_and_grads(model, cal_z, S, d)[0], cal_mrp, cal_ctx, cfg)
    mrp, ctx, z = _eval_set(cfg, rng, cfg.eval_tasks)
    v_tf, g_tf = _values_and_grads(model, z, S, d)
    w_td = _td_weights(ctx, cfg, alpha)
    v_td = np.einsum("bsd,bd->bs", mrp.phi, w_td)
    mu, v_true = mrp.stationary(), mrp.values()
    g_td = np.broadcast_to(w_td[:, None, :], g_tf.shape)  # v_td = w_td . phi_q: the same gradient at every state
    m = convergence.vd_ss_iws(v_tf, v_td, g_tf, g_td, mrp.phi, mu, w_td)
    layers = range(1 if cfg.tied else cfg.n_layers)
    return {
        "alpha_fit": alpha,
        **{k: float(np.mean(v)) for k, v in m.items()},
        "msve_tf": float(np.mean(np.sum(mu * (v_tf - v_true) ** 2, -1))),
        "msve_td": float(np.mean(np.sum(mu * (v_td - v_true) ** 2, -1))),
        "layers": [weights.pq_summary(param(model, l, "P"), param(model, l, "Q"), model.layout) for l in layers],
    }


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
