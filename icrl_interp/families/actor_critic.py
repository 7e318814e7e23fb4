"""Actor-critic in one linear self-attention layer (Liang & Lai, NeurIPS 2026, Theorem 3.3):
docs/concepts.md, "SARSA and actor-critic".

On the layout (phi, gamma_phi_next, reward, score | param_one, w, lam), D = 3d + 2m + 2, one LSA
layer H + (1/n)(V H)(H^T P H) outputs in the last column

    critic  w'   = w   + (beta/n)  sum_i delta_i phi_i
    actor   lam' = lam + (alpha/n) sum_i gamma^i delta_i g_i,

delta_i = r_{i+1} + gamma w.phi+_i - w.phi_i and g_i = grad_lam log pi_lam(a_i|s_i) for the softmax
policy pi_lam(a|s) ∝ exp(lam . phi_pi(s, a)). alpha is the actor's step, beta the critic's. A
checkpoint stores alpha as model.alpha and beta as origin.critic_step (theta*) or training.critic_step
(trained), never under the name beta, which is the task's feature scale (task.beta); `read_constants`
resolves it. Checkpoints written by icrl_interp 0.1 name it origin.beta / training.beta: `RENAMED` reads them.
The critic is the SARSA construction.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from jaxtyping import Float, Int

from ..core import validate as V
from ..core.errors import UserError
from ..tasks import envs, layouts, reference
from ..tasks import sampling
from . import registry
from . import sarsa

Array = np.ndarray
NAME = "actor-critic"


def layout(d: int, m: int | None = None) -> layouts.PromptLayout:
    """Transition block adds the discounted score (m rows), parameter block adds lam (m rows).
    The readout block is the critic `w`; the actor's output is the `lam` block of the last position."""
    if m is None:
        raise UserError("the actor-critic layout needs the policy dimension m")
    return layouts.build_layout(
        NAME, [("phi", d), ("gamma_phi_next", d), ("reward", 1), ("score", m), ("param_one", 1), ("w", d), ("lam", m)],
        "w")


# ------------------------------------------------------------------ prompts
def discounted(scores: Float[Array, "batch n m"], gamma: float) -> Float[Array, "batch n m"]:
    """gamma^i g_i, i = 0..n-1: the score rows a prompt carries."""
    return (gamma ** np.arange(scores.shape[1]))[None, :, None] * scores


def prompt(
    phi: Float[Array, "batch n d"],
    phi_next: Float[Array, "batch n d"],
    rewards: Float[Array, "batch n"],
    scores: Float[Array, "batch n m"],
    w: Float[Array, "batch d"],
    lam: Float[Array, "batch m"],
    gamma: float,
    states: Int[Array, "batch pos"] | None = None,
    actions: Int[Array, "batch pos"] | None = None,
) -> layouts.Prompt:
    """Column i = [phi_i; gamma phi+_i; r_{i+1}; gamma^i g_i; 0; 0; 0], last column [0; 0; 0; 0; 1; w; lam].

    `scores` are the undiscounted g_i; the prompt carries gamma^i g_i.
    """
    phi, phi_next, rewards, gamma = layouts.check_transitions(phi, phi_next, rewards, gamma)
    B, n, d = phi.shape
    scores = V.finite("scores", V.shape("scores", np.asarray(scores, dtype=np.float64), (B, n, None)))
    m = scores.shape[-1]
    V.shape("w", w, (B, d))
    V.shape("lam", lam, (B, m))
    lay = layout(d, m)
    z = np.zeros((B, n + 1, lay.d_model))
    layouts.fill_transitions(z, lay, phi, gamma * phi_next, rewards)
    z[:, :n, lay.slice("score")] = discounted(scores, gamma)
    z[:, n, lay.slice("param_one")] = 1.0
    z[:, n, lay.slice("w")] = V.finite("w", w)
    z[:, n, lay.slice("lam")] = V.finite("lam", lam)
    return layouts.labelled_prompt(z, lay, rewards, states, actions)


def policy_features(n_states: int, n_actions: int) -> Float[Array, "s a m"]:
    """phi_pi(s, a) = e_{s * n_A + a}: the tabular softmax policy (m = n_S * n_A)."""
    return envs.state_action_onehot(n_states, n_actions)


def policy_logits(lam: Float[Array, "batch m"], phi_pi: Float[Array, "*batch s a m"]) -> Float[Array, "batch s a"]:
    """lam . phi_pi(s, a) for every (s, a); phi_pi shared [s, a, m] or per task [batch, s, a, m]."""
    return np.einsum("bsam,bm->bsa" if np.ndim(phi_pi) == 4 else "sam,bm->bsa", phi_pi, lam)


def policy(lam: Float[Array, "batch m"], phi_pi: Float[Array, "*batch s a m"]) -> Float[Array, "batch s a"]:
    """pi_lam(a|s) ∝ exp(lam . phi_pi(s, a))."""
    return envs.softmax_policy(policy_logits(lam, phi_pi))


def mdp_columns(mdp: envs.MDPBatch, traj: envs.Trajectories, lam: Float[Array, "batch m"],
                phi_pi: Float[Array, "*batch s a m"]) -> dict[str, np.ndarray]:
    """phi_i, phi+_i, rewards and undiscounted scores g_lam(s_i, a_i) of an MDP trajectory batch."""
    phi, phi_next, states, actions = layouts.mdp_columns(mdp, traj)
    phi_pi_b = phi_pi if np.ndim(phi_pi) == 4 else np.broadcast_to(phi_pi, (mdp.batch,) + phi_pi.shape)
    scores = reference.policy_score(lam, phi_pi_b, traj.states[:, :-1], traj.actions[:, :-1])
    return {"phi": phi, "phi_next": phi_next, "rewards": traj.rewards, "scores": scores, "states": states,
            "actions": actions}


def prompt_from_mdp(mdp: envs.MDPBatch, traj: envs.Trajectories, w: Float[Array, "batch d"],
                    lam: Float[Array, "batch m"], phi_pi: Float[Array, "*batch s a m"]) -> layouts.Prompt:
    """Prompt from trajectories (s_0, a_0, ..., s_n, a_n) of pi_lam and the parameters (w, lam)."""
    c = mdp_columns(mdp, traj, lam, phi_pi)
    return prompt(c["phi"], c["phi_next"], c["rewards"], c["scores"], w, lam, mdp.gamma, c["states"], c["actions"])


RENAMED = {"origin": {"beta": "critic_step"}, "training": {"beta": "critic_step", "batch": "tasks_per_step"}}
"""Config keys renamed after 0.1 (read from older checkpoints and run configs, written new): the critic step was
`beta`, the name of the task's feature scale, and tasks per optimizer step were `batch`."""


# ------------------------------------------------------------------- theta*
def theta_star_blocks(d: int, m: int, alpha: float = 1.0, beta: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(P12*, V21*): P12* maps [1; w; lam] to (-w, w, 1, 0) so x_i^T P12* p = delta_i;
    V21* = [[0, 0, 0, 0], [beta I_d, 0, 0, 0], [0, 0, 0, alpha I_m]] over (phi, gamma phi+, r, score)."""
    d, m = V.count("d", d), V.count("m", m)
    P12s, V21s = sarsa.theta_star_blocks(d, beta)  # the critic is the SARSA construction
    P12 = np.zeros((2 * d + 1 + m, 1 + d + m))
    P12[: 2 * d + 1, : d + 1] = P12s  # score rows and the lam column stay 0: they never enter delta
    V21 = np.zeros((1 + d + m, 2 * d + 1 + m))
    V21[: d + 1, : 2 * d + 1] = V21s
    V21[1 + d :, 2 * d + 1 :] = alpha * np.eye(m)
    return P12, V21


def theta_star(d: int, m: int, alpha: float = 1.0, beta: float = 1.0, c: float = 1.0) -> dict[str, np.ndarray]:
    """P = [[0, c P12*], [0, 0]], V = [[0, 0], [V21*/c, 0]] on the actor-critic layout; lazy blocks zero."""
    if c == 0 or not np.isfinite(c):
        raise UserError(f"the scaling-manifold constant c must be finite and non-zero, got {c}")
    for name, step in (("alpha", alpha), ("beta", beta)):
        if not np.isfinite(step):
            raise UserError(f"step size {name} must be finite, got {step}")
    lay = layout(d, m)
    one, two = slice(0, lay.slice("param_one").start), slice(lay.slice("param_one").start, lay.d_model)
    P12, V21 = theta_star_blocks(d, m, alpha, beta)
    P = np.zeros((lay.d_model, lay.d_model))
    P[one, two] = c * P12
    Vm = np.zeros((lay.d_model, lay.d_model))
    Vm[two, one] = V21 / c
    return {"P": P, "V": Vm}


def _critic_step(alpha: float, k: dict) -> float:
    """The critic step beta of constants `k` (None: beta = alpha, the actor's step)."""
    return alpha if k.get("critic_step") is None else float(k["critic_step"])


def _layer_theta(model, alpha: float, k: dict) -> dict[str, np.ndarray]:
    return theta_star(model.d, model.m, alpha, _critic_step(alpha, k), k["c"])


def read_constants(config) -> dict:
    """c from origin; the critic step beta from origin.critic_step, else training.critic_step, else the actor
    step alpha."""
    origin, training = getattr(config, "origin", None) or {}, getattr(config, "training", None) or {}
    beta = next((float(src["critic_step"]) for src in (origin, training) if src.get("critic_step") is not None),
                float(config.model.alpha))
    return {"c": float(origin.get("c", 1.0)), "critic_step": beta}


# -------------------------------------------------------------- readout
def readout(z_out: Float[Any, "*batch pos d_model"], lay: layouts.PromptLayout):
    """[w'; lam'] from the last column (numpy or torch): w and lam are adjacent blocks."""
    return z_out[..., -1, lay.slice("w").start : lay.slice("lam").stop]


def split(params: Float[Array, "*batch dm"], d: int) -> tuple[np.ndarray, np.ndarray]:
    """[w; lam] -> (w, lam)."""
    return params[..., :d], params[..., d:]


# ------------------------------------------------------------- reference
def reference_step(z: Float[Array, "batch pos d_model"], d: int, m: int, gamma: float, alpha: float,
                   beta: float) -> dict[str, np.ndarray]:
    """The reference actor-critic step on prompts in the actor-critic layout (output = [w'; lam'])."""
    z = np.asarray(z, dtype=np.float64)
    lay = layout(d, m)
    V.shape("prompts", z, (None, None, lay.d_model))
    ctx = z[:, :-1]
    n = ctx.shape[1]
    phi = ctx[..., lay.slice("phi")]
    phi_next = sampling.unscale(ctx[..., lay.slice("gamma_phi_next")], np.full(n, gamma))
    scores = sampling.unscale(ctx[..., lay.slice("score")], gamma ** np.arange(n))
    rewards, w, lam = ctx[..., lay.slice("reward")][..., 0], z[:, -1, lay.slice("w")], z[:, -1, lay.slice("lam")]
    w_new, lam_new = reference.actor_critic_update(phi, phi_next, rewards, scores, w, lam, gamma, alpha, beta)
    delta = reference.td_errors(phi, phi_next, rewards, w, gamma)
    return {"td_errors": delta[:, None, :], "output": np.concatenate([w_new, lam_new], -1), "w": w, "lam": lam}


def reference_from_prompt(z: np.ndarray, model, constants: dict) -> dict[str, np.ndarray]:
    return reference_step(z, model.d, model.m, model.gamma, model.alpha, _critic_step(model.alpha, constants))


def tabular_policy_features(d: int, m: int, n_states: int, n_actions: int, sa_features: str = "onehot") -> np.ndarray:
    """One-hot phi and phi_pi, checked against the model's (d, m). With a random feature map the policy uses the
    critic's features (phi_pi = phi, per MDP: `MDPBatch.feature_table`), so only m = d is checked and the
    one-hot table is returned for the record."""
    if sa_features != "onehot":
        if m != d:
            raise UserError(f"actor-critic with {sa_features} features uses phi_pi = phi: m must equal d = {d}, got m = {m}")
    elif n_states * n_actions != d or m != d:
        raise UserError(f"actor-critic on tabular MDPs uses one-hot features: d = m = n_states*n_actions = "
                        f"{n_states * n_actions}, but the model has d = {d}, m = {m}")
    return policy_features(n_states, n_actions)


def mdp_policy_features(mdp: envs.MDPBatch) -> np.ndarray:
    """phi_pi of the MDPs: the shared one-hot table [s, a, m], or the MDPs' own features [batch, s, a, d]."""
    return policy_features(mdp.n_states, mdp.n_actions) if mdp.phi is None else mdp.phi


def sample(config, task: sampling.TaskSpec, batch: int, rng: np.random.Generator) -> sampling.PromptBatch:
    """Random MDPs with the task's features, w and lam ~ N(0, w_scale^2 I), n steps of pi_lam each."""
    model = config.model
    tabular_policy_features(model.d, model.m, task.n_states, task.n_actions, task.sa_features)
    mdp = sampling.task_mdps(task, model.d, model.gamma, batch, rng)
    phi_pi = mdp_policy_features(mdp)
    w = task.w_scale * rng.standard_normal((batch, model.d))
    lam = task.w_scale * rng.standard_normal((batch, model.m))
    pi = policy(lam, phi_pi)
    traj = mdp.sample(pi, task.n, rng)
    p = prompt_from_mdp(mdp, traj, w, lam, phi_pi)
    return sampling.PromptBatch(p, sampling.mdp_task_data(mdp, pi), reference_from_prompt(p.z, model, config.constants))


# ------------------------------------------------------------------ control
@dataclass
class Control(sarsa.Control):
    """Closed-loop actor-critic: act with pi_lam, update [w; lam] by the critic and actor steps."""

    family: str = NAME

    @property
    def size(self) -> int:
        return 2 * self.d

    def action_values(self, params: Float[Array, "batch p"]) -> Float[Array, "batch s a"]:
        """The policy logits lam . phi_pi(s, a) (phi_pi = phi)."""
        return self._linear(params[:, self.d :])

    def policy(self, params: Float[Array, "batch p"]) -> Float[Array, "batch s a"]:
        return envs.softmax_policy(self.action_values(params))

    def prompt_and_teacher(self, mdp, traj, params):
        w, lam = split(params, self.d)
        c = mdp_columns(mdp, traj, lam, mdp_policy_features(mdp))
        p = prompt(c["phi"], c["phi_next"], c["rewards"], c["scores"], w, lam, self.gamma)
        w_new, lam_new = reference.actor_critic_update(c["phi"], c["phi_next"], c["rewards"], c["scores"], w, lam,
                                                       self.gamma, self.alpha, self.beta)
        return p.z, np.concatenate([w_new, lam_new], -1)

    def readout(self, z_out, lay: layouts.PromptLayout):
        return readout(z_out, lay)


def control(config, epsilon: float = 0.1) -> Control:
    """The actor-critic rule a checkpoint config mimics (actor step alpha, critic step beta)."""
    n_states, n_actions = sarsa.mdp_shape(config)
    tabular_policy_features(config.model.d, int(config.model.m), n_states, n_actions, config.task.sa_features)
    k = config.constants
    return Control(n_states, n_actions, config.model.gamma, config.model.alpha, k["critic_step"], epsilon,
                   **sarsa.feature_options(config))


@dataclass
class Construct(sarsa.Construct):
    """theta* of actor-critic: one LSA layer, softmax policy on the critic's features (m = d; one-hot:
    d = states * actions)."""

    alpha: float = 1.0
    """The actor's step alpha (--critic-step is the critic's)."""
    critic_step: float | None = None
    """The critic's step beta; None (the default): beta = --alpha, the actor's step."""

    family = NAME

    def extra_model(self, d: int) -> dict:
        return {"m": d}  # the tabular softmax policy: m = d

    def constants(self) -> dict:
        # stored explicitly (origin.critic_step): the checkpoint says which step it holds
        return {"c": self.scale, "critic_step": self.alpha if self.critic_step is None else self.critic_step}


FAMILY = registry.register(registry.Family(
    name=NAME,
    summary="one linear self-attention layer runs actor-critic (Liang & Lai, NeurIPS 2026)",
    architecture="lsa",
    layout=layout,
    task_kind="mdp",
    sample=sample,
    reference=reference_from_prompt,
    theta_star=_layer_theta,
    gauge=("c",),
    constants={"c": 1.0, "critic_step": None},
    renamed=RENAMED,
    read_constants=read_constants,
    needs_m=True,
    hints=registry.Hints(
        output="parameters",
        output_blocks=("w", "lam"),
        algorithm="actor_critic",
        primary_probe=("attn.hook_attn_scores", "hook_resid_post"),
        weight_fit=sarsa.FAMILY.hints.weight_fit,
        lazy_from="param_one",
        value_error_label=sarsa.FAMILY.hints.value_error_label,
    ),
    probe_spec="actor_critic.toml",
    construct=Construct,
    control=control,
    training="icrl_interp.train.recipes.actor_critic",
))
