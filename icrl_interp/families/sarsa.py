"""Semi-gradient SARSA in one linear self-attention layer (Liang & Lai, NeurIPS 2026):
docs/concepts.md, "SARSA and actor-critic".

Prompt: column i = [phi_i; gamma phi+_i; r_{i+1}; 0; 0], last column [0; 0; 0; 1; w], D = 3d + 2.
Layer: H <- H + (1/n) (V H)(H^T P H), no mask; the output is the `w` block of the last column.
theta*: P = [[0, c P12*], [0, 0]], V = [[0, 0], [V21*/c, 0]] with lazy blocks P22 = V22 = 0, so
w' = w + (alpha/n) sum_i delta_i phi_i for every c != 0 (the scaling manifold).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from jaxtyping import Float, Int

from ..core import validate as V
from ..core.errors import UserError
from ..tasks import envs, layouts, reference
from ..tasks import sampling
from . import registry

Array = np.ndarray
NAME = "sarsa"
TIE_TOL = 1e-9
"""A state's greedy actions are those within TIE_TOL (relative) of its best action value / logit."""


def layout(d: int, m: int | None = None) -> layouts.PromptLayout:
    """Transition block (phi, gamma_phi_next, reward), parameter block (param_one, w)."""
    return layouts.build_layout(NAME, [("phi", d), ("gamma_phi_next", d), ("reward", 1), ("param_one", 1), ("w", d)],
                                "w")


def prompt(
    phi: Float[Array, "batch n d"],
    phi_next: Float[Array, "batch n d"],
    rewards: Float[Array, "batch n"],
    w: Float[Array, "batch d"],
    gamma: float,
    states: Int[Array, "batch pos"] | None = None,
    actions: Int[Array, "batch pos"] | None = None,
) -> layouts.Prompt:
    """Column i = [phi_i; gamma phi+_i; r_{i+1}; 0; 0], last column [0; 0; 0; 1; w]."""
    phi, phi_next, rewards, gamma = layouts.check_transitions(phi, phi_next, rewards, gamma)
    B, n, d = phi.shape
    V.shape("w", w, (B, d))
    lay = layout(d)
    z = np.zeros((B, n + 1, lay.d_model))
    layouts.fill_transitions(z, lay, phi, gamma * phi_next, rewards)
    z[:, n, lay.slice("param_one")] = 1.0
    z[:, n, lay.slice("w")] = V.finite("w", w)
    return layouts.labelled_prompt(z, lay, rewards, states, actions)


def prompt_from_mdp(mdp, traj, w: Float[Array, "batch d"]) -> layouts.Prompt:
    """Prompt from MDP trajectories (s_0, a_0, ..., s_n, a_n) and current parameters w."""
    phi, phi_next, states, actions = layouts.mdp_columns(mdp, traj)
    return prompt(phi, phi_next, traj.rewards, w, mdp.gamma, states, actions)


def theta_star_blocks(d: int, alpha: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(P12*, V21*): P12* maps [1; w] to (-w, w, 1); V21* = [[0], [alpha I_d, 0, 0]]."""
    P12 = np.zeros((2 * d + 1, d + 1))
    P12[:d, 1:] = -np.eye(d)
    P12[d : 2 * d, 1:] = np.eye(d)
    P12[2 * d, 0] = 1.0
    V21 = np.zeros((d + 1, 2 * d + 1))
    V21[1:, :d] = alpha * np.eye(d)
    return P12, V21


def theta_star(d: int, alpha: float = 1.0, c: float = 1.0) -> dict[str, np.ndarray]:
    """P = [[0, c P12*], [0, 0]], V = [[0, 0], [c^-1 V21*, 0]]; lazy blocks zero."""
    if c == 0:
        raise UserError("the scaling-manifold constant c must be non-zero")
    D = 3 * d + 2
    P12, V21 = theta_star_blocks(d, alpha)
    P = np.zeros((D, D))
    P[: 2 * d + 1, 2 * d + 1 :] = c * P12
    Vm = np.zeros((D, D))
    Vm[2 * d + 1 :, : 2 * d + 1] = V21 / c
    return {"P": P, "V": Vm}


def _layer_theta(model, alpha: float, k: dict) -> dict[str, np.ndarray]:
    return theta_star(model.d, alpha, k["c"])


def reference_from_prompt(z: np.ndarray, model, constants: dict) -> dict[str, np.ndarray]:
    """One batch semi-gradient SARSA step from the prompt's w (and the TD errors at w)."""
    z = np.asarray(z, dtype=np.float64)
    lay = layout((z.shape[-1] - 2) // 3)
    ctx = z[:, :-1]
    gamma = model.gamma
    phi, phi_next = ctx[..., lay.slice("phi")], sampling.unscale(ctx[..., lay.slice("gamma_phi_next")], gamma)
    rewards, w = ctx[..., lay.slice("reward")][..., 0], z[:, -1, lay.slice("w")]
    delta = reference.td_errors(phi, phi_next, rewards, w, gamma)
    return {"td_errors": delta[:, None, :], "output": reference.sarsa_update(phi, phi_next, rewards, w, gamma, model.alpha),
            "w": w}


def sample(config, task: sampling.TaskSpec, batch: int, rng: np.random.Generator) -> sampling.PromptBatch:
    """Random tabular MDPs with the task's features, w ~ N(0, w_scale^2 I), n steps of epsilon-greedy(w . phi) each."""
    model = config.model
    mdp = sampling.task_mdps(task, model.d, model.gamma, batch, rng)
    w = task.w_scale * rng.standard_normal((batch, model.d))
    pi = envs.epsilon_greedy(sampling.q_values(mdp, w), task.epsilon)
    traj = mdp.sample(pi, task.n, rng)
    p = prompt_from_mdp(mdp, traj, w)
    return sampling.PromptBatch(p, sampling.mdp_task_data(mdp, pi), reference_from_prompt(p.z, model, config.constants))


# ------------------------------------------------------------------ control
@dataclass
class Control:
    """Closed-loop SARSA on tabular MDPs (paper (b), Algorithm 1): how parameters act and update."""

    n_states: int
    """States of the MDPs."""
    n_actions: int
    """Actions of the MDPs."""
    gamma: float
    """Discount of the MDPs and of the update."""
    alpha: float
    """Step size of the update (the actor's step for actor-critic)."""
    beta: float
    """Critic step (actor-critic; equals alpha for SARSA)."""
    epsilon: float = 0.1
    """Exploration of the epsilon-greedy acting policy (SARSA)."""
    family: str = NAME
    """Family name, for reports."""
    sa_features: str = "onehot"
    """State-action features of the MDPs (`sampling.TaskSpec.sa_features`): 'onehot' or a random map per MDP."""
    feature_dim: int | None = None
    """Feature dimension d of a random map (None: n_states * n_actions)."""
    sa_randomness: float = 1.0
    """Randomness rho of a random map (`sampling.sa_feature_map`)."""
    phi: np.ndarray | None = field(default=None, repr=False)
    """Per-MDP features [batch, s, a, d] of the MDPs the rule is bound to (`bind`); None: unbound / one-hot."""

    @property
    def d(self) -> int:
        if self.phi is not None:
            return self.phi.shape[-1]
        return self.n_states * self.n_actions if self.feature_dim is None else self.feature_dim

    def draw_features(self, batch: int, rng) -> np.ndarray | None:
        """Features of `batch` held-out MDPs for this rule's feature map (None for one-hot)."""
        return sampling.sa_feature_map(self.sa_features, batch, self.n_states, self.n_actions, self.d, rng,
                                       self.sa_randomness)

    def bind(self, mdp: envs.MDPBatch) -> "Control":
        """The rule acting on `mdp`'s own features (needed for random feature maps)."""
        if self.sa_features == "onehot" and mdp.phi is None:
            return self
        if mdp.phi is None or mdp.phi.shape[-1] != self.d:
            raise UserError(f"the {self.family} rule uses {self.sa_features} features of dimension {self.d}; "
                            f"the MDPs carry {'one-hot' if mdp.phi is None else mdp.phi.shape[-1]}-dimensional ones")
        return replace(self, phi=mdp.phi)

    @property
    def size(self) -> int:
        """Length of the parameter vector."""
        return self.d

    def action_values(self, params: Float[Array, "batch p"]) -> Float[Array, "batch s a"]:
        """What the policy is greedy in: w . phi(s, a)."""
        return self._linear(params[:, : self.d])

    def _linear(self, w: Float[Array, "batch d"]) -> Float[Array, "batch s a"]:
        """w . phi(s, a) for every (s, a): a reshape for one-hot features, else the bound MDPs' features."""
        if self.phi is None:
            if self.sa_features != "onehot":
                raise UserError(f"the {self.family} rule with {self.sa_features} features must be bound to MDPs (bind)")
            return w.reshape(-1, self.n_states, self.n_actions)
        return np.einsum("bsad,bd->bsa", self.phi, w)

    def policy(self, params: Float[Array, "batch p"]) -> Float[Array, "batch s a"]:
        """The acting policy: epsilon-greedy on w . phi."""
        return envs.epsilon_greedy(self.action_values(params), self.epsilon)

    def greedy_sets(self, params: Float[Array, "batch p"]) -> np.ndarray:
        """[batch, s, a] booleans: the greedy actions of each state (several on ties)."""
        q = self.action_values(params)
        best = q.max(-1, keepdims=True)
        return q >= best - TIE_TOL * np.maximum(1.0, np.abs(best))

    def greedy(self, params: Float[Array, "batch p"]) -> Int[Array, "batch s"]:
        return np.argmax(self.action_values(params), -1)

    def prompt_and_teacher(self, mdp: envs.MDPBatch, traj: envs.Trajectories,
                           params: Float[Array, "batch p"]) -> tuple[np.ndarray, np.ndarray]:
        """The prompt for this trajectory and the teacher's (reference) update."""
        phi, phi_next, states, actions = layouts.mdp_columns(mdp, traj)
        p = prompt(phi, phi_next, traj.rewards, params, self.gamma, states, actions)
        return p.z, reference.sarsa_update(phi, phi_next, traj.rewards, params, self.gamma, self.alpha)

    def readout(self, z_out, lay: layouts.PromptLayout):
        """The model's parameter output (numpy or torch) from its last residual stream."""
        return lay.readout(z_out)


def mdp_shape(config) -> tuple[int, int]:
    """(n_states, n_actions) of a control checkpoint, checked against its d (one-hot features)."""
    task, d = config.task, config.model.d
    if task.kind != "mdp":
        raise UserError(f"the checkpoint's task is {task.kind!r}; control runs on tabular MDPs")
    if task.sa_features == "onehot" and task.n_states * task.n_actions != d:
        raise UserError(f"the checkpoint has d = {d}, but its task has n_states*n_actions = "
                        f"{task.n_states * task.n_actions} (control uses state-action one-hot features)")
    return task.n_states, task.n_actions


def control(config, epsilon: float = 0.1) -> Control:
    """The SARSA rule a checkpoint config mimics."""
    n_states, n_actions = mdp_shape(config)
    alpha = config.model.alpha
    return Control(n_states, n_actions, config.model.gamma, alpha, alpha, epsilon, **feature_options(config))


def feature_options(config) -> dict:
    """The Control fields of a checkpoint's feature map (task.sa_features, model d, task.sa_randomness)."""
    task = config.task
    return {"sa_features": task.sa_features, "feature_dim": int(config.model.d), "sa_randomness": task.sa_randomness}


def feature_task(sa_features: str, sa_randomness: float) -> dict:
    """The task keys of a feature map: none for one-hot (so one-hot tasks read exactly as before)."""
    if sa_features == "onehot":
        return {}
    return {"sa_features": sa_features, "sa_randomness": float(sa_randomness)}


@dataclass
class Construct:
    """theta* of SARSA: one LSA layer on random tabular MDPs (one-hot features, d = states * actions, or a
    random feature map of dimension d)."""

    n_states: int = 9
    """States of the MDPs."""
    n_actions: int = 4
    """Actions of the MDPs."""
    d: int | None = None
    """Feature dimension: states * actions for one-hot features (the default); any d for a random map
    (default states * actions)."""
    n: int = 64
    """Context length of the recorded task."""
    gamma: float = 0.5
    """Discount factor."""
    alpha: float = 1.0
    """Step size of theta*."""
    scale: float = 1.0
    """Scaling-manifold constant c: the layer holds (c P12*, V21*/c)."""
    dtype: str = field(default="float64", metadata={"choices": ("float64", "float32")})
    """Parameter dtype: float64 or float32."""
    sa_features: str = field(default="onehot", metadata={"choices": sampling.SA_FEATURES})
    """State-action features of the task: 'onehot', or a fresh random map per MDP, 'gaussian' (N(0, 1/d)) or
    'uniform' (same variance)."""
    sa_randomness: float = 1.0
    """Random feature maps: rho in [0, 1]; smaller moves the features toward a fixed, poorly exciting map."""

    family = NAME  # not a field (no annotation): the family whose theta* this builds; subclasses override it

    def one_hot_d(self) -> int:
        """The feature dimension (kept name: one-hot was the only map)."""
        d = V.count("n_states", self.n_states) * V.count("n_actions", self.n_actions)
        if self.sa_features == "onehot" and self.d is not None and self.d != d:
            raise UserError(f"{self.family} features are state-action one-hot: d must be states*actions = {d}, "
                            f"got --d {self.d}")
        d = d if self.d is None else self.d
        sampling.check_sa_features(self.sa_features, self.sa_randomness, self.n_states, self.n_actions, d)
        return d

    def plan(self) -> registry.ConstructPlan:
        d = self.one_hot_d()
        return registry.ConstructPlan(
            model={"d": d, "n_layers": 1, "gamma": self.gamma, "alpha": self.alpha, "dtype": self.dtype,
                   **self.extra_model(d)},
            constants=self.constants(),
            task={"family": self.family, "kind": "mdp", "n": self.n, "n_states": self.n_states, "n_actions": self.n_actions,
                  **feature_task(self.sa_features, self.sa_randomness)})

    def extra_model(self, d: int) -> dict:
        """Model fields beyond the SARSA ones (the actor-critic adds m)."""
        return {}

    def constants(self) -> dict:
        return {"c": self.scale}


FAMILY = registry.register(registry.Family(
    name=NAME,
    summary="one linear self-attention layer runs semi-gradient SARSA (Liang & Lai, NeurIPS 2026)",
    architecture="lsa",
    layout=layout,
    task_kind="mdp",
    sample=sample,
    reference=reference_from_prompt,
    theta_star=_layer_theta,
    gauge=("c",),
    constants={"c": 1.0},
    hints=registry.Hints(
        output="parameters",
        output_blocks=("w",),
        algorithm="batch_sarsa",
        primary_probe=("attn.hook_attn_scores", "hook_resid_post"),
        # V21's param_one row writes the constant entry of w~ = [1; w], which nothing reads out
        weight_fit=registry.BlockFit(x=("P", ":param_one", "param_one:"), y=("V", "param_one:", ":param_one"),
                                     names=("P12", "V21"), y_unread=("param_one",)),
        lazy_from="param_one",
        value_error_label="distance to the teacher update ‖TF(H) − w_SARSA‖",
    ),
    probe_spec="sarsa.toml",
    construct=Construct,
    control=control,
    training="icrl_interp.train.recipes.sarsa",
    renamed={"training": {"batch": "tasks_per_step"}},  # after 0.1: one name for tasks per step
))
