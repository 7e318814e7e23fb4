"""Generic pieces of task sampling: the task distribution spec, a batch of prompts with its
task data and reference run, and small helpers the family homes share.

Which prompts a family builds and which reference it runs is the family's business: its home
registers a `sample` function (`icrl_interp.families.registry.Family.sample`) that returns a `PromptBatch`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from ..core.errors import UserError
from . import envs, layouts


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
    sa_features: str = "onehot"
    """MDP state-action features: 'onehot' (e_{s n_A + a}, d = n_states * n_actions), or a fresh random map
    per task, 'gaussian' (entries N(0, 1/d)) or 'uniform' (U(-sqrt(3/d), sqrt(3/d))), of the model's d
    (`sa_feature_map`)."""
    sa_randomness: float = 1.0
    """Random MDP feature maps only: rho in [0, 1] in phi = sqrt(1 - rho^2) phi0 + rho G, which moves the features
    toward the fixed, poorly exciting map phi0(s, a) = e_{(s n_A + a) mod d} as rho -> 0 (1.0: fully random)."""

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
        check_sa_features(spec.sa_features, spec.sa_randomness)
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


def task_mdps(task: TaskSpec, d: int, gamma: float, batch: int, rng: np.random.Generator) -> envs.MDPBatch:
    """Random tabular MDPs of a task spec with its state-action features of dimension d (the model's)."""
    if task.kind != "mdp":
        raise UserError(f"family {task.family} records on tabular MDPs, the task asks for {task.kind!r}")
    if task.sa_features == "onehot" and task.n_states * task.n_actions != d:
        raise UserError(f"{task.family} features are state-action one-hot: n_states*n_actions = "
                        f"{task.n_states * task.n_actions} but the model has d = {d}")
    return draw_mdps(batch, task.n_states, task.n_actions, gamma, rng, task.concentration, task.sa_features, d,
                     task.sa_randomness)


onehot_mdps = task_mdps
"""Former name of `task_mdps` (one-hot was the only feature map)."""


# ------------------------------------------------------- MDP feature maps
SA_FEATURES = ("onehot", "gaussian", "uniform")
"""State-action feature maps of tabular MDP tasks (`TaskSpec.sa_features`)."""


def check_sa_features(kind: str, randomness: float = 1.0, n_states: int | None = None, n_actions: int | None = None,
                      d: int | None = None) -> None:
    """One-line errors for a feature map that cannot be drawn (d is checked when given with the MDP shape)."""
    if kind not in SA_FEATURES:
        raise UserError(f"unknown state-action features {kind!r} (use {', '.join(SA_FEATURES)})")
    if isinstance(randomness, bool) or not isinstance(randomness, (int, float, np.floating)) or not 0 <= randomness <= 1:
        raise UserError(f"sa_randomness must lie in [0, 1], got {randomness!r}")
    if kind == "onehot" and randomness != 1:
        raise UserError(f"sa_randomness {randomness} applies to random feature maps (gaussian, uniform), not one-hot")
    if d is not None:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise UserError(f"feature dimension d must be a positive integer, got {d!r}")
        if kind == "onehot" and n_states is not None and n_actions is not None and d != n_states * n_actions:
            raise UserError(f"state-action one-hot features have d = n_states*n_actions = {n_states * n_actions}, "
                            f"got d = {d}")


def fixed_sa_features(n_states: int, n_actions: int, d: int) -> np.ndarray:
    """phi0(s, a) = e_{(s n_A + a) mod d}, [s, a, d]: the tabular map folded into d dimensions (one-hot when
    d = n_states * n_actions). Every row has 1^T phi0 = 1, so u = [1; -1/gamma 1; 0] is orthogonal to every
    prompt column [phi; gamma phi+; r]: the poorly exciting end of the `sa_randomness` knob."""
    idx = np.arange(n_states * n_actions) % d
    return np.eye(d)[idx].reshape(n_states, n_actions, d)


def sa_feature_map(kind: str, batch: int, n_states: int, n_actions: int, d: int | None, rng,
                   randomness: float = 1.0) -> np.ndarray | None:
    """State-action features of `batch` tasks, [batch, s, a, d]; None for 'onehot' (the MDPs' own e_{s n_A + a}).

    'gaussian': G(s, a) ~ N(0, I_d / d); 'uniform': entries U(-sqrt(3/d), sqrt(3/d)); a fresh draw per task.
    Both have E||G(s, a)||^2 = 1, the squared norm of a one-hot row. With randomness rho < 1,
    phi = sqrt(1 - rho^2) phi0 + rho G with the fixed map phi0 = `fixed_sa_features`, so E||phi||^2 = 1 for
    every rho while the excitation of phi0's blind direction shrinks like rho^2 (docs/reproductions.md).
    One-hot draws nothing from `rng`; a random map draws after the MDPs (so the MDPs of a seed are the same
    for every feature map).
    """
    d = n_states * n_actions if d is None else d
    check_sa_features(kind, randomness, n_states, n_actions, d)
    if kind == "onehot":
        return None
    rng = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
    size = (batch, n_states, n_actions, d)
    if kind == "gaussian":
        G = rng.standard_normal(size) / np.sqrt(d)
    else:
        G = rng.uniform(-np.sqrt(3.0 / d), np.sqrt(3.0 / d), size=size)
    if randomness == 1:
        return G
    return np.sqrt(1.0 - randomness**2) * fixed_sa_features(n_states, n_actions, d)[None] + randomness * G


def draw_mdps(batch: int, n_states: int, n_actions: int, gamma: float, rng: np.random.Generator,
              concentration: float = 1.0, features: str = "onehot", d: int | None = None,
              randomness: float = 1.0) -> envs.MDPBatch:
    """Random tabular MDPs (`envs.sample_tabular_mdps`) carrying the state-action features of `features`."""
    mdp = envs.sample_tabular_mdps(batch, n_states, n_actions, gamma, rng, concentration)
    phi = sa_feature_map(features, batch, n_states, n_actions, d, rng, randomness)
    return mdp if phi is None else mdp.with_features(phi)


def q_values(mdp: envs.MDPBatch, w: np.ndarray) -> np.ndarray:
    """Q_w(s, a) = w . phi(s, a) of every task, [batch, s, a] (w: [batch, d])."""
    if mdp.phi is None:  # one-hot: a reshape, bit-for-bit what it always was
        return np.asarray(w).reshape(mdp.batch, mdp.n_states, mdp.n_actions)
    return np.einsum("bsad,bd->bsa", mdp.phi, w)


# ------------------------------------------------------------ excitation
def excitation(z: np.ndarray, layout: layouts.PromptLayout, gamma: float) -> dict:
    """Smallest / largest eigenvalues of the second moments that Liang & Lai's Assumption 1 asks to be excited,
    measured on prompts z [batch, n+1, D] of the sarsa or actor-critic layout (float64):

    * `columns`: E[x x^T] of the transition columns x_i = [phi_i; gamma phi+_i; r_{i+1} (; gamma^i g_i)];
    * `regression`: E[R^T R], R = (1/n) sum_i phi_i x_i^T (the Bellman regression matrix: P12 is identified
      iff it is positive definite);
    * `td_target`: E[b b^T], b = (1/n) sum_i x_i delta_i (V21bar is identified iff it is positive definite);
    * `params`: E[p p^T] of the parameter column p = [1; w (; lam)];
    * `blind_u`: u^T E[x x^T] u / u^T u along u = [1; -1/gamma 1; 0 (; 0)], the direction one-hot features
      never excite (0.0 exactly for them).
    """
    z = np.asarray(z, dtype=np.float64)
    one = layout.slice("param_one").start
    x, p = z[:, :-1, :one], z[:, -1, one:]
    B, n, k = x.shape
    phi, w = x[..., layout.slice("phi")], z[:, -1, layout.slice("w")]
    delta = x[..., layout.slice("reward")][..., 0] + np.einsum("bnd,bd->bn", x[..., layout.slice("gamma_phi_next")] - phi, w)
    R = np.einsum("bnd,bnk->bdk", phi, x) / n
    b = np.einsum("bnk,bn->bk", x, delta) / n
    moments = {"columns": np.einsum("bnk,bnl->kl", x, x) / (B * n), "regression": np.einsum("bdk,bdl->kl", R, R) / B,
               "td_target": b.T @ b / B, "params": p.T @ p / B}
    out = {}
    for name, M in moments.items():
        ev = np.linalg.eigvalsh(M)
        out[name] = {"min": float(ev[0]), "max": float(ev[-1])}
    d = phi.shape[-1]
    u = np.zeros(k)
    u[layout.slice("phi")], u[layout.slice("gamma_phi_next")] = 1.0, -1.0 / max(gamma, 1e-12)
    out["blind_u"] = float(u @ moments["columns"] @ u / (u @ u))
    out["d"], out["n"], out["prompts"] = d, n, B
    return out
