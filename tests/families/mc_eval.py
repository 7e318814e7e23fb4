"""A fifth family from outside the package: batch Monte-Carlo value evaluation.

Everything a family needs is in this one file and one `register` call; the model is the existing
linear-attention architecture (docs/adding-a-family.md walks through it).

Prompt: column i = [phi(s_i); 0; G_i] with the (context-truncated) return
G_i = sum_{k=i}^{n-1} gamma^{k-i} r_k, query column [phi(s_q); 0; 0]; D = 2d + 1.
Algorithm: batch MC regression from w_0 = 0, w_{l+1} = w_l + (alpha/n) sum_i (G_i - w_l . phi_i) phi_i.
theta*: Wang et al.'s linear-attention construction (P* = alpha e_D e_D^T, Q* = [[-I, I, 0], 0, 0]):
with the middle rows zero, its TD error r_i + gamma w.phi_{i+1} - w.phi_i is the MC error G_i - w.phi_i,
so L layers run L steps of batch MC regression.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from icrl_interp.tasks import layouts, reference
from icrl_interp.families import registry
from icrl_interp.tasks import sampling

NAME = "mc-eval"


def layout(d: int, m: int | None = None) -> layouts.PromptLayout:
    return layouts.build_layout(NAME, [("phi", d), ("unused", d), ("return", 1)], "return", -1)


def returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """G_i = sum_{k >= i} gamma^{k-i} r_k within each row (truncated at the end of the context)."""
    G = np.zeros_like(rewards, dtype=np.float64)
    acc = np.zeros(rewards.shape[0])
    for i in range(rewards.shape[1] - 1, -1, -1):
        acc = rewards[:, i] + gamma * acc
        G[:, i] = acc
    return G


def prompt(phi, G, phi_query, states=None) -> layouts.Prompt:
    B, n, d = phi.shape
    lay = layout(d)
    z = np.zeros((B, n + 1, lay.d_model))
    z[:, :n, lay.slice("phi")] = phi
    z[:, :n, lay.slice("return")] = G[..., None]
    z[:, n, lay.slice("phi")] = phi_query
    r = np.zeros((B, n + 1))
    r[:, :n] = G
    return layouts.Prompt(z=z, layout=lay, states=layouts.column_labels("states", states, (B, n + 1)), rewards=r)


def reference_from_prompt(z, model, constants) -> dict:
    """Batch MC regression for model.n_layers steps (batch TD(0) with gamma = 0 on the returns)."""
    z = np.asarray(z, dtype=np.float64)
    lay = layout((z.shape[-1] - 1) // 2)
    phi = z[:, :-1, lay.slice("phi")]
    G = z[:, :-1, lay.slice("return")][..., 0]
    trace = reference.batch_td(phi, np.zeros_like(phi), G, z[:, -1, lay.slice("phi")], 0.0, model.alpha,
                               model.n_layers)
    return {"td_errors": trace.td_errors, "values": trace.query_values[..., None],
            "output": trace.query_values[:, -1:], "w": trace.w}


def sample(config, task, batch, rng) -> sampling.PromptBatch:
    model = config.model
    mrp, traj, tasks = sampling.boyan_tasks(task, model.d, model.gamma, batch, rng)
    s = traj.states
    q = rng.integers(0, mrp.n_states, size=batch)
    rows = np.arange(batch)[:, None]
    p = prompt(mrp.phi[rows, s[:, :-1]], returns(traj.rewards, model.gamma), mrp.phi[np.arange(batch), q],
               np.concatenate([s[:, :-1], q[:, None]], axis=1))
    return sampling.PromptBatch(p, tasks, reference_from_prompt(p.z, model, config.constants))


def theta_star(model, alpha, constants) -> dict:
    D = 2 * model.d + 1
    P, Q = np.zeros((D, D)), np.zeros((D, D))
    P[D - 1, D - 1] = alpha
    Q[: model.d, : model.d] = -np.eye(model.d)
    Q[: model.d, model.d : 2 * model.d] = np.eye(model.d)
    return {"P": P, "Q": Q}


@dataclass
class Construct:
    """theta* of batch Monte-Carlo evaluation on Boyan chains."""

    d: int = 3
    """Feature dimension."""
    n: int = 24
    """Context length."""
    n_layers: int = 4
    """Number of layers (= MC regression steps)."""
    gamma: float = 0.8
    """Discount of the returns."""
    alpha: float = 0.5
    """Step size."""
    n_states: int = 6
    """States of the Boyan chains."""

    def plan(self) -> registry.ConstructPlan:
        return registry.ConstructPlan(
            model={"d": self.d, "n_layers": self.n_layers, "gamma": self.gamma, "alpha": self.alpha, "dtype": "float64"},
            constants={},
            task={"family": NAME, "kind": "boyan", "n": self.n, "n_states": self.n_states, "features": "random"})


FAMILY = registry.register(registry.Family(
    name=NAME,
    summary="linear attention runs batch Monte-Carlo value regression (a family registered from outside)",
    architecture="linear-attention",
    layout=layout,
    task_kind="boyan",
    sample=sample,
    reference=reference_from_prompt,
    theta_star=theta_star,
    hints=registry.Hints(
        output="query",
        td_direction={"return": 1.0},
        weight_fit=registry.BlockFit(x=("P", ":", ":"), y=("Q", ":", ":"), names=("P", "Q")),
        query_linear=True,
    ),
    probe_spec="linear_td.toml",
    construct=Construct,
    demo=None,
), replace=True)
