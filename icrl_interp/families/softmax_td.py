"""Weighted softmax TD (Xie et al., 2026): docs/concepts.md, "Softmax TD".

Prompt: column k (k = 1..n) holds x(S_{k-1}) and R_k, column n+1 holds x(S_n); rows x (d), reward,
target_mem, current_mem (D = d + 3), the memory rows start at 0. Layer: softmax attention over
sources (the query column masked) writes alpha * delta_k-weighted values into current_mem, and a
temporal shift (or a second, shifted head) refills target_mem with gamma x the next column's value.
theta*: A* = score_scale * diag(I_d, 0, 0, 0), V* = alpha e_current (1, 1, -1) over (R, target, current).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from jaxtyping import Float, Int

from ..core import validate as V
from ..tasks import layouts, reference
from ..tasks import sampling
from . import registry
from .linear_td import boyan_task

Array = np.ndarray
NAME = "softmax-td"


def layout(d: int, m: int | None = None) -> layouts.PromptLayout:
    """Rows x (d), reward, target_mem, current_mem; the readout is current_mem of the last column."""
    return layouts.build_layout(NAME, [("x", d), ("reward", 1), ("target_mem", 1), ("current_mem", 1)], "current_mem")


def prompt(
    x: Float[Array, "batch pos d"],
    rewards: Float[Array, "batch n"],
    states: Int[Array, "batch pos"] | None = None,
) -> layouts.Prompt:
    """`x` holds the features of S_0..S_n (n + 1 rows), `rewards` R_1..R_n."""
    x = V.finite("x", np.asarray(x, dtype=np.float64))
    B, pos, d = x.shape
    V.shape("rewards", rewards, (B, pos - 1))
    lay = layout(d)
    z = np.zeros((B, pos, lay.d_model))
    z[:, :, lay.slice("x")] = x
    z[:, :-1, lay.slice("reward")] = V.finite("rewards", rewards)[..., None]
    r = np.zeros((B, pos))
    r[:, :-1] = rewards
    return layouts.Prompt(z=z, layout=lay, states=layouts.column_labels("states", states, (B, pos)), rewards=r)


def prompt_from_mrp(mrp, traj) -> layouts.Prompt:
    """Prompt from trajectories S_0..S_n of an MRP batch."""
    return prompt(layouts.gather(mrp.phi, traj.states), traj.rewards, traj.states)


def delta_row(lay: layouts.PromptLayout) -> np.ndarray:
    """Row vector reading R + target - current (= delta_k under the construction)."""
    row = np.zeros(lay.d_model)
    row[lay.slice("reward")] = 1.0
    row[lay.slice("target_mem")] = 1.0
    row[lay.slice("current_mem")] = -1.0
    return row


def theta_star(d: int, alpha: float = 1.0, gamma: float = 0.9, score_scale: float = 1.0) -> dict[str, np.ndarray]:
    """A* = score_scale * diag(I_d, 0, 0, 0); V* = alpha e_current (1, 1, -1) on (R, target, current).

    `V_target` is the second head of the dual-head form: gamma * alpha e_target (1, 1, -1).
    """
    lay = layout(d)
    D = lay.d_model
    A = np.zeros((D, D))
    A[lay.slice("x"), lay.slice("x")] = score_scale * np.eye(d)
    Vm = np.zeros((D, D))
    Vm[lay.slice("current_mem").start] = alpha * delta_row(lay)
    V_target = np.zeros((D, D))
    V_target[lay.slice("target_mem").start] = gamma * alpha * delta_row(lay)
    return {"A": A, "V": Vm, "V_target": V_target}


def _layer_theta(model, alpha: float, k: dict) -> dict[str, np.ndarray]:
    mats = theta_star(model.d, alpha, model.gamma, k["score_scale"])
    return {name: mats[name] for name in model.parameter_names()}


def reference_from_prompt(z: np.ndarray, model, constants: dict) -> dict[str, np.ndarray]:
    """Weighted softmax TD for model.n_layers iterations with the kernel of score_scale * I."""
    z = np.asarray(z, dtype=np.float64)
    lay = layout(z.shape[-1] - 3)
    x = z[..., lay.slice("x")]
    trace = reference.weighted_softmax_td(x, z[:, :-1, lay.slice("reward")][..., 0], model.gamma, model.alpha,
                                          model.n_layers, A11=float(constants["score_scale"]) * np.eye(x.shape[-1]))
    return {"td_errors": trace.td_errors, "values": trace.values, "output": trace.values[:, -1, -1:]}


def sample(config, task: sampling.TaskSpec, batch: int, rng: np.random.Generator) -> sampling.PromptBatch:
    """Boyan chains, one trajectory S_0..S_n each."""
    model = config.model
    mrp, traj, tasks = sampling.boyan_tasks(task, model.d, model.gamma, batch, rng)
    p = prompt_from_mrp(mrp, traj)
    return sampling.PromptBatch(p, tasks, reference_from_prompt(p.z, model, config.constants))


@dataclass
class Construct:
    """theta* of softmax TD: L layers of weighted softmax TD on Boyan chains with one-hot features."""

    d: int | None = None
    """Feature dimension (default: --n-states, as one-hot features need)."""
    n: int = 40
    """Context length of the recorded task."""
    n_layers: int = 6
    """Number of layers L (= TD iterations)."""
    gamma: float = 0.9
    """Discount factor."""
    alpha: float = 1.0
    """Step size of theta*."""
    score_scale: float = 1.0
    """Multiplies A* (beta^2 for one-hot x beta features): larger is a sharper, more diagonal kernel."""
    form: str = field(default="tsm", metadata={"choices": ("tsm", "dual")})
    """'tsm' (one head + temporal shift module) or 'dual' (two heads)."""
    n_states: int = 5
    """States of the Boyan chains recorded on."""
    features: str = field(default="onehot", metadata={"choices": ("onehot", "random")})
    """Boyan features: 'onehot' (times --beta) or 'random'."""
    beta: float = 1.0
    """Scale of one-hot features."""
    tied: bool = True
    """One copy of the weights shared by all layers (--no-tied: one per layer)."""
    dtype: str = field(default="float64", metadata={"choices": ("float64", "float32")})
    """Parameter dtype: float64 or float32."""

    def plan(self) -> registry.ConstructPlan:
        d = self.d if self.d is not None else self.n_states
        task = boyan_task(NAME, self.n, self.n_states, self.features, self.beta, d)
        return registry.ConstructPlan(
            model={"d": d, "n_layers": self.n_layers, "gamma": self.gamma, "alpha": self.alpha, "form": self.form,
                   "tied": self.tied, "dtype": self.dtype},
            constants={"score_scale": self.score_scale}, task=task)


FAMILY = registry.register(registry.Family(
    name=NAME,
    summary="softmax attention runs weighted softmax TD (Xie et al., 2026)",
    architecture="softmax-ictd",
    layout=layout,
    task_kind="boyan",
    sample=sample,
    reference=reference_from_prompt,
    theta_star=_layer_theta,
    constants={"score_scale": 1.0},
    hints=registry.Hints(
        output="positions",
        value_block="current_mem",
        algorithm="softmax_td",
        td_direction={"reward": 1.0, "target_mem": 1.0, "current_mem": -1.0},
        weight_fit=registry.ValueRowFit(score="A", value="V", row="current_mem",
                                        columns=("reward", "target_mem", "current_mem"), extra=("V_target",)),
        population_kernel="x",
    ),
    probe_spec="softmax_td.toml",
    # a sharper score (beta^2 = 8 on one-hot features of 5-state chains) so Assumption 5.1 holds:
    # min_s M_pi(s, s) is about 0.99 > (1 + gamma) / 2 = 0.95
    demo={"n_layers": 20, "score_scale": 8.0},
    construct=Construct,
    training="icrl_interp.train.recipes.softmax_td",
    renamed={"training": {"batch": "tasks_per_step"}},  # after 0.1: one name for tasks per step
))
