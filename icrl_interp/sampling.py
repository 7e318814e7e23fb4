"""Batches of prompts for a model family, with their tasks and the reference algorithm's run.

`sample_batch` draws tasks from the distribution a checkpoint's config names
(`config["task"]`), builds the family's prompts, and runs the reference
algorithm with the checkpoint's constants, so a recording can compare the
model's internals with what the algorithm computes on the very same prompts.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from . import envs, layouts, reference
from .errors import UserError


@dataclass
class TaskSpec:
    """The task distribution of a checkpoint (its config's `task` field)."""

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
    def from_dict(cls, data: dict | None, family: str) -> "TaskSpec":
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise UserError(f"task config has unknown keys: {', '.join(sorted(unknown))}")
        if "kind" not in data:
            data["kind"] = "mdp" if family in ("sarsa", "actor-critic") else "boyan"
        if data["kind"] == "mdp":
            data.setdefault("n_states", 9)
        return cls(**data)


@dataclass
class PromptBatch:
    """Prompts plus what the analyzers need to judge them."""

    prompt: layouts.Prompt
    tasks: dict[str, np.ndarray]
    """Per-prompt task data (transition law, rewards, features, stationary distribution, true values)."""
    reference: dict[str, np.ndarray]
    """The reference algorithm on the same prompts (td_errors, values, output)."""


def _constants(config: dict) -> tuple[int, float, float, float]:
    origin = config.get("origin") or {}
    return (int(config["n_layers"]), float(config["gamma"]), float(config.get("alpha", 1.0)),
            float(origin.get("score_scale", config.get("score_scale", 1.0))))


def sample_batch(config: dict, batch: int, rng) -> PromptBatch:
    """Draw `batch` tasks for the checkpoint `config` and build prompts, task data and reference."""
    family = config["family"]
    task_cfg = dict(config.get("task") or {})
    if config.get("n") and "n" not in task_cfg:
        task_cfg["n"] = int(config["n"])
    task = TaskSpec.from_dict(task_cfg, family)
    n_layers, gamma, alpha, score_scale = _constants(config)
    d = int(config["d"])
    rng = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
    if family in ("linear-td", "softmax-td"):
        if task.kind != "boyan":
            raise UserError(f"family {family} records on Boyan chains, config asks for {task.kind!r}")
        mrp = envs.sample_boyan_chains(batch, task.n_states, d, gamma, rng, task.features, task.beta, task.rewards)
        if mrp.d != d:
            raise UserError(f"task features have dimension {mrp.d}, the model expects d = {d}")
        traj = mrp.sample(task.n, rng)
        tasks = {"P": mrp.P, "r": mrp.r, "phi": mrp.phi, "stationary": mrp.stationary(), "values": mrp.values()}
        if family == "linear-td":
            return _linear_td(mrp, traj, rng, tasks, n_layers, alpha)
        return _softmax_td(mrp, traj, tasks, n_layers, alpha, score_scale)
    if family == "sarsa":
        return _sarsa(task, d, gamma, alpha, batch, rng)
    if family == "actor-critic":
        from . import actor_critic

        return actor_critic.sample_prompt_batch(config, task, batch, rng)
    raise UserError(f"no task sampler for family {family!r}")


def _linear_td(mrp, traj, rng, tasks, n_layers, alpha) -> PromptBatch:
    query = rng.integers(0, mrp.n_states, size=mrp.batch)
    prompt = layouts.td_prompt_from_mrp(mrp, traj, query)
    return PromptBatch(prompt, tasks, reference_from_prompt("linear-td", prompt.z, n_layers, mrp.gamma, alpha))


def _softmax_td(mrp, traj, tasks, n_layers, alpha, score_scale) -> PromptBatch:
    prompt = layouts.softmax_prompt_from_mrp(mrp, traj)
    ref = reference_from_prompt("softmax-td", prompt.z, n_layers, mrp.gamma, alpha, score_scale)
    return PromptBatch(prompt, tasks, ref)


def _sarsa(task: TaskSpec, d: int, gamma: float, alpha: float, batch: int, rng) -> PromptBatch:
    if task.n_states * task.n_actions != d:
        raise UserError(f"SARSA features are state-action one-hot: n_states*n_actions = "
                        f"{task.n_states * task.n_actions} but the model has d = {d}")
    mdp = envs.sample_tabular_mdps(batch, task.n_states, task.n_actions, gamma, rng, task.concentration)
    w = task.w_scale * rng.standard_normal((batch, d))
    pi = envs.epsilon_greedy(w.reshape(batch, task.n_states, task.n_actions), task.epsilon)
    traj = mdp.sample(pi, task.n, rng)
    prompt = layouts.sarsa_prompt_from_mdp(mdp, traj, w)
    tasks = mdp_task_data(mdp, pi)
    return PromptBatch(prompt, tasks, reference_from_prompt("sarsa", prompt.z, 1, gamma, alpha))


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


def reference_from_prompt(family: str, z: np.ndarray, n_layers: int, gamma: float, alpha: float,
                          score_scale: float = 1.0) -> dict[str, np.ndarray]:
    """Run the family's reference algorithm on prompts given in the family's layout.

    Everything the algorithm needs is in the prompt itself, so this works on
    prompts a user supplies as well as on sampled ones.
    """
    z = np.asarray(z, dtype=np.float64)
    d_model = z.shape[-1]
    if family == "linear-td":
        lay = layouts.td_layout((d_model - 1) // 2)
        ctx = z[:, :-1]
        trace = reference.batch_td(ctx[..., lay.slice("phi")], unscale(ctx[..., lay.slice("gamma_phi_next")], gamma),
                                   ctx[..., lay.slice("reward")][..., 0], z[:, -1, lay.slice("phi")], gamma, alpha, n_layers)
        return {"td_errors": trace.td_errors, "values": trace.query_values[..., None],
                "output": trace.query_values[:, -1:], "w": trace.w}
    if family == "softmax-td":
        lay = layouts.softmax_layout(d_model - 3)
        x = z[..., lay.slice("x")]
        trace = reference.weighted_softmax_td(x, z[:, :-1, lay.slice("reward")][..., 0], gamma, alpha, n_layers,
                                              A11=score_scale * np.eye(x.shape[-1]))
        return {"td_errors": trace.td_errors, "values": trace.values, "output": trace.values[:, -1, -1:]}
    if family == "sarsa":
        lay = layouts.sarsa_layout((d_model - 2) // 3)
        ctx = z[:, :-1]
        phi, phi_next = ctx[..., lay.slice("phi")], unscale(ctx[..., lay.slice("gamma_phi_next")], gamma)
        rewards, w = ctx[..., lay.slice("reward")][..., 0], z[:, -1, lay.slice("w")]
        delta = reference.td_errors(phi, phi_next, rewards, w, gamma)
        return {"td_errors": delta[:, None, :], "output": reference.sarsa_update(phi, phi_next, rewards, w, gamma, alpha),
                "w": w}
    raise UserError(f"no reference algorithm for family {family!r}")
