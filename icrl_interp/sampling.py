"""Generic pieces of task sampling: the task distribution spec, a batch of prompts with its
task data and reference run, and small helpers the family homes share.

Which prompts a family builds and which reference it runs is the family's business: its home
registers a `sample` function (`icrl_interp.registry.Family.sample`) that returns a `PromptBatch`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from . import envs, layouts
from .errors import UserError


@dataclass
class TaskSpec:
    """A task distribution (a checkpoint's `task`): which family's prompts, and how tasks are drawn."""

    family: str | None = None
    """Family whose prompts these are (their layout and reference algorithm); None = the model's family."""
    kind: str = "boyan"
    """'boyan' (randomized Boyan chain MRPs) or 'mdp' (random tabular MDPs)."""
    n: int = 30
    """Context length: transitions per prompt."""
    n_states: int = 10
    """Number of states."""
    features: str = "random"
    """Boyan features: 'random' (U(-1,1)) or 'onehot' (times beta)."""
    beta: float = 1.0
    """Scale of one-hot features."""
    rewards: str = "uniform"
    """Boyan rewards: 'uniform' or 'representable'."""
    n_actions: int = 4
    """MDP actions."""
    concentration: float = 1.0
    """Dirichlet concentration of MDP transition rows."""
    epsilon: float = 1.0
    """Behaviour policy for MDP prompts: epsilon-greedy on w . phi (1.0 = uniform random)."""
    w_scale: float = 0.5
    """Std of the current parameters w drawn for SARSA prompts."""

    @classmethod
    def from_dict(cls, data: object, family: str | None = None, task_kind: str | None = None) -> "TaskSpec":
        """Parse a task dict; `family` fills a missing `family`, `task_kind` a missing `kind`."""
        if data is not None and not isinstance(data, dict):
            raise UserError(f"task config must be an object, got {data!r}")
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise UserError(f"task config has unknown keys: {', '.join(sorted(unknown))}")
        if data.get("family") is None:
            data["family"] = family
        if "kind" not in data and task_kind is not None:
            data["kind"] = task_kind
        if data.get("kind") == "mdp":
            data.setdefault("n_states", 9)
        try:
            spec = cls(**data)
        except TypeError as e:
            raise UserError(f"malformed task config: {e}") from None
        for name in ("n", "n_states", "n_actions"):
            value = getattr(spec, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise UserError(f"task {name} must be a positive integer, got {value!r}")
        return spec

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PromptBatch:
    """Prompts plus what the analyzers need to judge them."""

    prompt: layouts.Prompt
    tasks: dict[str, np.ndarray]
    """Per-prompt task data (transition law, rewards, features, stationary distribution, true values)."""
    reference: dict[str, np.ndarray]
    """The reference algorithm on the same prompts (td_errors, values, output)."""


def unscale(rows: np.ndarray, factors) -> np.ndarray:
    """Undo a per-column scaling of prompt rows (e.g. gamma * phi(s'), gamma^i g_i): rows / factors
    along the column axis, and 0 where the factor is 0 (those rows then carry nothing)."""
    factors = np.broadcast_to(np.asarray(factors, dtype=np.float64), rows.shape[1:2])
    safe = np.where(factors > 0, factors, 1.0)
    return np.where(factors[None, :, None] > 0, rows / safe[None, :, None], 0.0)


def mdp_task_data(mdp: envs.MDPBatch, pi: np.ndarray) -> dict[str, np.ndarray]:
    """What a recording stores about MDP tasks under the behaviour policy pi."""
    P_pi, _ = mdp.policy_mrp(pi)
    return {"P": mdp.P, "r": mdp.R, "stationary": envs.stationary_distribution(P_pi),
            "values": mdp.state_values(pi), "q_values": mdp.q_values(pi), "policy": pi}


def boyan_tasks(task: TaskSpec, d: int, gamma: float, batch: int, rng: np.random.Generator):
    """Boyan chain tasks of a task spec with trajectories S_0..S_n: (mrp, traj, task data)."""
    if task.kind != "boyan":
        raise UserError(f"family {task.family} records on Boyan chains, the task asks for {task.kind!r}")
    mrp = envs.sample_boyan_chains(batch, task.n_states, d, gamma, rng, task.features, task.beta, task.rewards)
    if mrp.d != d:
        raise UserError(f"task features have dimension {mrp.d}, the model expects d = {d}")
    traj = mrp.sample(task.n, rng)
    tasks = {"P": mrp.P, "r": mrp.r, "phi": mrp.phi, "stationary": mrp.stationary(), "values": mrp.values()}
    return mrp, traj, tasks


def onehot_mdps(task: TaskSpec, d: int, gamma: float, batch: int, rng: np.random.Generator) -> envs.MDPBatch:
    """Random tabular MDPs of a task spec, checked against state-action one-hot features of dimension d."""
    if task.kind != "mdp":
        raise UserError(f"family {task.family} records on tabular MDPs, the task asks for {task.kind!r}")
    if task.n_states * task.n_actions != d:
        raise UserError(f"{task.family} features are state-action one-hot: n_states*n_actions = "
                        f"{task.n_states * task.n_actions} but the model has d = {d}")
    return envs.sample_tabular_mdps(batch, task.n_states, task.n_actions, gamma, rng, task.concentration)
