"""Linear-attention TD(0) (Wang et al., ICLR 2025): docs/concepts.md, "Linear-attention TD(0)".

Prompt: column i = [phi(s_i); gamma phi(s_{i+1}); r_i], query column [phi(s_q); 0; 0], D = 2d + 1.
Layer: Z <- Z + (1/n) P Z M (Z^T Q Z), the query column masked as a source; readout -Z[2d+1, n+1].
theta*: P* = alpha e_D e_D^T, Q* = [[-C^T, C^T, 0], 0, 0]; L layers run L steps of batch TD(0).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from jaxtyping import Float, Int

from ..core import validate as V
from ..core.errors import UserError
from ..tasks import layouts, reference
from ..tasks import sampling
from . import registry

Array = np.ndarray
NAME = "linear-td"


def layout(d: int, m: int | None = None) -> layouts.PromptLayout:
    """Rows phi (d), gamma_phi_next (d), reward (1); the readout is -reward of the query column."""
    return layouts.build_layout(NAME, [("phi", d), ("gamma_phi_next", d), ("reward", 1)], "reward", -1)


def prompt(
    phi: Float[Array, "batch n d"],
    phi_next: Float[Array, "batch n d"],
    rewards: Float[Array, "batch n"],
    phi_query: Float[Array, "batch d"],
    gamma: float,
    states: Int[Array, "batch pos"] | None = None,
) -> layouts.Prompt:
    """Column i = [phi(s_i); gamma phi(s_{i+1}); r_i], query [phi(s_q); 0; 0]."""
    phi, phi_next, rewards, gamma = layouts.check_transitions(phi, phi_next, rewards, gamma)
    B, n, d = phi.shape
    V.shape("phi_query", phi_query, (B, d))
    lay = layout(d)
    z = np.zeros((B, n + 1, lay.d_model))
    layouts.fill_transitions(z, lay, phi, gamma * phi_next, rewards)
    z[:, n, lay.slice("phi")] = V.finite("phi_query", phi_query)
    r = np.zeros((B, n + 1))
    r[:, :n] = rewards
    return layouts.Prompt(z=z, layout=lay, states=layouts.column_labels("states", states, (B, n + 1)), rewards=r)


def prompt_from_mrp(mrp, traj, query_states: Int[Array, " batch"]) -> layouts.Prompt:
    """Prompt from sampled trajectories (n = number of transitions) and a query state per task."""
    s = traj.states
    q = np.asarray(query_states, dtype=np.int64)
    states = np.concatenate([s[:, :-1], q[:, None]], axis=1)
    phi_q = mrp.phi[np.arange(mrp.batch), q]
    return prompt(layouts.gather(mrp.phi, s[:, :-1]), layouts.gather(mrp.phi, s[:, 1:]), traj.rewards, phi_q,
                  mrp.gamma, states)


def theta_star(d: int, alpha: float = 1.0, C: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """P* = alpha e_{2d+1} e_{2d+1}^T, Q* = [[-C^T, C^T, 0], [0, 0, 0], [0, 0, 0]]."""
    lay = layout(d)
    D = lay.d_model
    C = np.eye(d) if C is None else np.asarray(C, dtype=np.float64)
    if C.shape != (d, d):
        raise UserError(f"preconditioner C has shape {C.shape}, expected ({d}, {d})")
    P = np.zeros((D, D))
    P[D - 1, D - 1] = alpha
    Q = np.zeros((D, D))
    Q[lay.slice("phi"), lay.slice("phi")] = -C.T
    Q[lay.slice("phi"), lay.slice("gamma_phi_next")] = C.T
    return {"P": P, "Q": Q}


def _layer_theta(model, alpha: float, k: dict) -> dict[str, np.ndarray]:
    """One layer of theta* on the gauge orbit (c P*, Q*/c)."""
    mats = theta_star(model.d, alpha, None if k.get("C") is None else np.asarray(k["C"], dtype=np.float64))
    return {"P": k["c"] * mats["P"], "Q": mats["Q"] / k["c"]}


def reference_from_prompt(z: np.ndarray, model, constants: dict) -> dict[str, np.ndarray]:
    """Batch TD(0) from w_0 = 0 for model.n_layers steps on the prompt's own transitions."""
    z = np.asarray(z, dtype=np.float64)
    lay = layout((z.shape[-1] - 1) // 2)
    ctx = z[:, :-1]
    gamma = model.gamma
    trace = reference.batch_td(ctx[..., lay.slice("phi")],
                               sampling.unscale(ctx[..., lay.slice("gamma_phi_next")], gamma),
                               ctx[..., lay.slice("reward")][..., 0], z[:, -1, lay.slice("phi")], gamma, model.alpha,
                               model.n_layers)
    return {"td_errors": trace.td_errors, "values": trace.query_values[..., None],
            "output": trace.query_values[:, -1:], "w": trace.w}


def sample(config, task: sampling.TaskSpec, batch: int, rng: np.random.Generator) -> sampling.PromptBatch:
    """Boyan chains, one trajectory each, a uniformly drawn query state."""
    model = config.model
    mrp, traj, tasks = sampling.boyan_tasks(task, model.d, model.gamma, batch, rng)
    query = rng.integers(0, mrp.n_states, size=mrp.batch)
    p = prompt_from_mrp(mrp, traj, query)
    return sampling.PromptBatch(p, tasks, reference_from_prompt(p.z, model, config.constants))


@dataclass
class Construct:
    """theta* of linear-attention TD: L layers of batch TD(0) on randomized Boyan chains."""

    d: int = 4
    """Feature dimension (random features U(-1, 1)); with --features onehot it must equal --n-states."""
    n: int = 30
    """Context length of the recorded task."""
    n_layers: int = 3
    """Number of layers L (= TD steps)."""
    gamma: float = 0.9
    """Discount factor."""
    alpha: float = 1.0
    """Step size of theta*."""
    scale: float = 1.0
    """Gauge constant c: the layer holds (c P*, Q*/c), which computes the same map."""
    n_states: int = 10
    """States of the Boyan chains recorded on."""
    features: str = field(default="random", metadata={"choices": ("random", "onehot")})
    """Boyan features: 'random' (U(-1, 1)) or 'onehot' (times --beta)."""
    beta: float = 1.0
    """Scale of one-hot features."""
    tied: bool = True
    """One copy of the weights shared by all layers (--no-tied: one per layer)."""
    dtype: str = field(default="float64", metadata={"choices": ("float64", "float32")})
    """Parameter dtype: float64 or float32."""

    def plan(self) -> registry.ConstructPlan:
        task = boyan_task(NAME, self.n, self.n_states, self.features, self.beta, self.d)
        return registry.ConstructPlan(
            model={"d": self.d, "n_layers": self.n_layers, "gamma": self.gamma, "alpha": self.alpha,
                   "tied": self.tied, "dtype": self.dtype},
            constants={"c": self.scale}, task=task)


def boyan_task(family: str, n: int, states: int, features: str, beta: float, d: int) -> dict:
    """The task dict of a Boyan-chain construction, with one-hot features checked against d."""
    if features not in ("random", "onehot"):
        raise UserError(f"features must be 'random' or 'onehot', got {features!r}")
    if features == "onehot" and d != states:
        raise UserError(f"one-hot features need d = number of states ({states}), got --d {d}")
    task = {"family": family, "kind": "boyan", "n": n, "n_states": states, "features": features}
    if features == "onehot":
        task["beta"] = beta
    return task


FAMILY = registry.register(registry.Family(
    name=NAME,
    summary="linear attention runs batch TD(0) (Wang et al., ICLR 2025)",
    architecture="linear-attention",
    layout=layout,
    task_kind="boyan",
    sample=sample,
    reference=reference_from_prompt,
    theta_star=_layer_theta,
    gauge=("c",),
    constants={"c": 1.0, "C": None},
    hints=registry.Hints(
        output="query",
        td_direction={"reward": 1.0},
        algorithm="td0",
        weight_fit=registry.BlockFit(x=("P", ":", ":"), y=("Q", ":", ":"), names=("P", "Q")),
        query_linear=True,
        wang_summary=True,
    ),
    probe_spec="linear_td.toml",
    construct=Construct,
    training="icrl_interp.train.recipes.linear_td",
    init_gain_per_layer=True,
))
