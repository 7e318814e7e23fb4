"""Vectorized sampling of training batches, one sampler per family.

Every sampler draws a whole batch of tasks at once through `icrl_interp.envs`
(loops run over time steps only) and builds the prompts with the project's own
builders in `icrl_interp.layouts`, so the training prompts are the analysis
prompts by construction. Outputs are torch tensors in the requested dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from .. import envs, layouts, reference
from .config import LinearTDTrainConfig, SarsaTrainConfig, SoftmaxTDTrainConfig


def _t(a, dtype: torch.dtype) -> Tensor:
    return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64}[name]


# ----------------------------------------------------------------- linear TD
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


def sample_windows(cfg: LinearTDTrainConfig, rng: np.random.Generator, tasks: int | None = None) -> WindowBatch:
    """`tasks` Boyan chains x `trajectories_per_task` trajectories x (`windows` + 1) windows each."""
    tasks = cfg.tasks_per_step if tasks is None else tasks
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
    prompt = layouts.td_prompt(flat(phi), flat(phi_next), flat(rewards), flat(phi_q), cfg.gamma)
    dtype = _dtype(cfg.dtype)
    z = prompt.z.reshape(seqs, W + 1, n + 1, -1)
    values = rep.values()[np.arange(seqs)[:, None], q_states]
    return WindowBatch(
        z=_t(z, dtype),
        query_rewards=_t(traj.rewards[:, n + 1 : n + W + 1], dtype),
        query_values=_t(values, dtype),
        gamma=cfg.gamma,
    )


# ---------------------------------------------------------------- softmax TD
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
    """The softmax family's task distribution: Boyan chains with one-hot x beta features."""
    return envs.sample_boyan_chains(batch, cfg.n_states, cfg.n_states, cfg.gamma, rng=rng, features="onehot", beta=cfg.beta)


def sample_state_queries(cfg: SoftmaxTDTrainConfig, rng: np.random.Generator, batch: int | None = None) -> StateQueryBatch:
    """`batch` chains, one trajectory S_0..S_n each, every state as the query."""
    batch = cfg.batch if batch is None else batch
    mrp = chains_for(cfg, batch, rng)
    traj = mrp.sample(cfg.n, rng)
    S = cfg.n_states
    prompt = layouts.softmax_prompt_from_mrp(mrp, traj)
    z = np.repeat(prompt.z[:, None], S, axis=1)  # [B, S, n+1, D]
    z[:, :, -1, prompt.layout.slice("x")] = mrp.phi  # query column of copy s holds x(s)
    dtype = _dtype(cfg.dtype)
    return StateQueryBatch(
        z=_t(z, dtype), P=_t(mrp.P, dtype), r=_t(mrp.r, dtype), mu=_t(mrp.stationary(), dtype),
        v_true=_t(mrp.values(), dtype), gamma=cfg.gamma,
    )


# --------------------------------------------------------------------- SARSA
@dataclass
class SarsaBatch:
    """SARSA prompts of random tabular MDPs and the teacher's update for each."""

    z: Float[Tensor, "batch pos d_model"]
    """Prompts (transition columns and the parameter column [1; w])."""
    w: Float[Tensor, "batch d"]
    """Parameters w in the prompt."""
    target: Float[Tensor, "batch d"]
    """Teacher: one batch semi-gradient SARSA step from w (reference.sarsa_update)."""


def sample_sarsa(cfg: SarsaTrainConfig, rng: np.random.Generator, batch: int | None = None) -> SarsaBatch:
    """`batch` random MDPs, w ~ N(0, w_std^2 I), n steps of the behaviour policy each."""
    batch = cfg.batch if batch is None else batch
    mdp = envs.sample_tabular_mdps(batch, cfg.n_states, cfg.n_actions, cfg.gamma, rng=rng, concentration=cfg.concentration)
    d = cfg.n_states * cfg.n_actions
    w = cfg.w_std * rng.standard_normal((batch, d))
    q = w.reshape(batch, cfg.n_states, cfg.n_actions)
    traj = mdp.sample(envs.epsilon_greedy(q, cfg.epsilon), cfg.n, rng)
    prompt = layouts.sarsa_prompt_from_mdp(mdp, traj, w)
    lay = prompt.layout
    phi = prompt.z[:, :-1, lay.slice("phi")]
    phi_next = _next_phi(mdp, traj)  # from the trajectory, not gamma*phi+ / gamma (exact, and gamma may be 0)
    target = reference.sarsa_update(phi, phi_next, traj.rewards, w, cfg.gamma, cfg.alpha)
    dtype = _dtype(cfg.dtype)
    return SarsaBatch(z=_t(prompt.z, dtype), w=_t(w, dtype), target=_t(target, dtype))


def _next_phi(mdp: envs.MDPBatch, traj: envs.Trajectories) -> np.ndarray:
    """phi(s_{i+1}, a_{i+1}) of each transition, straight from the trajectory."""
    feats = mdp.features().reshape(mdp.n_states * mdp.n_actions, -1)
    return feats[traj.states[:, 1:] * mdp.n_actions + traj.actions[:, 1:]]
