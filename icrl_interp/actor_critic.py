"""Liang & Lai's actor-critic construction (paper (b), Theorem 3.3): prompts, theta*, reference, sampling.

One linear self-attention layer H + (1/n)(V H)(H^T P H) on the layout
`layouts.actor_critic_layout(d, m)` (D = 3d + 2m + 2) outputs, in the last column,

    critic  w'   = w   + (beta/n)  sum_i delta_i phi_i
    actor   lam' = lam + (alpha/n) sum_i gamma^i delta_i g_i,

delta_i = r_{i+1} + gamma w.phi+_i - w.phi_i and g_i = grad_lam log pi_lam(a_i|s_i) for the softmax
policy pi_lam(a|s) ∝ exp(lam . phi_pi(s, a)). Step names follow the paper: alpha is the actor's,
beta the critic's (`reference.actor_critic_update`). A checkpoint stores alpha in `config.alpha`
and beta in `origin.beta` (theta*) or `training.beta` (trained); see `steps_of`.
The derivation (which blocks are non-zero, which are lazy, the scaling manifold) is in
docs/actor_critic.md. This module is numpy-only; torch is imported inside the model helpers.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from jaxtyping import Float, Int

from . import envs, layouts, reference, sampling
from . import validate as V
from .errors import UserError
from .theta_star import sarsa_blocks

Array = np.ndarray
FAMILY = "actor-critic"


# ------------------------------------------------------------------ prompts
def discounted(scores: Float[Array, "batch n m"], gamma: float) -> Float[Array, "batch n m"]:
    """gamma^i g_i, i = 0..n-1: the score rows a prompt carries."""
    return (gamma ** np.arange(scores.shape[1]))[None, :, None] * scores


def actor_critic_prompt(
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
    gamma = V.discount(gamma)
    phi = V.finite("phi", np.asarray(phi, dtype=np.float64))
    B, n, d = phi.shape
    V.shape("phi_next", phi_next, (B, n, d))
    V.shape("rewards", rewards, (B, n))
    scores = V.finite("scores", V.shape("scores", np.asarray(scores, dtype=np.float64), (B, n, None)))
    m = scores.shape[-1]
    V.shape("w", w, (B, d))
    V.shape("lam", lam, (B, m))
    lay = layouts.actor_critic_layout(d, m)
    z = np.zeros((B, n + 1, lay.d_model))
    layouts._fill_transitions(z, lay, phi, gamma * V.finite("phi_next", phi_next), V.finite("rewards", rewards))
    z[:, :n, lay.slice("score")] = discounted(scores, gamma)
    z[:, n, lay.slice("param_one")] = 1.0
    z[:, n, lay.slice("w")] = V.finite("w", w)
    z[:, n, lay.slice("lam")] = V.finite("lam", lam)
    return layouts._labelled(z, lay, rewards, states, actions)


def policy_features(n_states: int, n_actions: int) -> Float[Array, "s a m"]:
    """phi_pi(s, a) = e_{s * n_A + a}: the tabular softmax policy (m = n_S * n_A)."""
    return envs.state_action_onehot(n_states, n_actions)


def policy_logits(lam: Float[Array, "batch m"], phi_pi: Float[Array, "s a m"]) -> Float[Array, "batch s a"]:
    """lam . phi_pi(s, a) for every (s, a)."""
    return np.einsum("sam,bm->bsa", phi_pi, lam)


def policy(lam: Float[Array, "batch m"], phi_pi: Float[Array, "s a m"]) -> Float[Array, "batch s a"]:
    """pi_lam(a|s) ∝ exp(lam . phi_pi(s, a))."""
    return envs.softmax_policy(policy_logits(lam, phi_pi))


def mdp_columns(mdp: envs.MDPBatch, traj: envs.Trajectories, lam: Float[Array, "batch m"],
                phi_pi: Float[Array, "s a m"]) -> dict[str, np.ndarray]:
    """phi_i, phi+_i, rewards and undiscounted scores g_lam(s_i, a_i) of an MDP trajectory batch."""
    phi, phi_next, states, actions = layouts._mdp_columns(mdp, traj)
    B = mdp.batch
    phi_pi_b = np.broadcast_to(phi_pi, (B,) + phi_pi.shape)
    scores = reference.policy_score(lam, phi_pi_b, traj.states[:, :-1], traj.actions[:, :-1])
    return {"phi": phi, "phi_next": phi_next, "rewards": traj.rewards, "scores": scores, "states": states,
            "actions": actions}


def prompt_from_mdp(mdp: envs.MDPBatch, traj: envs.Trajectories, w: Float[Array, "batch d"],
                    lam: Float[Array, "batch m"], phi_pi: Float[Array, "s a m"]) -> layouts.Prompt:
    """Actor-critic prompt from trajectories (s_0, a_0, ..., s_n, a_n) of pi_lam and the parameters (w, lam)."""
    c = mdp_columns(mdp, traj, lam, phi_pi)
    return actor_critic_prompt(c["phi"], c["phi_next"], c["rewards"], c["scores"], w, lam, mdp.gamma,
                               c["states"], c["actions"])


# ------------------------------------------------------------------- theta*
def theta_star_blocks(d: int, m: int, alpha: float = 1.0, beta: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(P12*, V21*): P12* maps [1; w; lam] to (-w, w, 1, 0) so x_i^T P12* p = delta_i;
    V21* = [[0, 0, 0, 0], [beta I_d, 0, 0, 0], [0, 0, 0, alpha I_m]] over (phi, gamma phi+, r, score)."""
    d, m = V.count("d", d), V.count("m", m)
    P12s, V21s = sarsa_blocks(d, beta)  # the critic is the SARSA construction
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
    lay = layouts.actor_critic_layout(d, m)
    one, two = slice(0, lay.slice("param_one").start), slice(lay.slice("param_one").start, lay.d_model)
    P12, V21 = theta_star_blocks(d, m, alpha, beta)
    P = np.zeros((lay.d_model, lay.d_model))
    P[one, two] = c * P12
    Vm = np.zeros((lay.d_model, lay.d_model))
    Vm[two, one] = V21 / c
    return {"P": P, "V": Vm}


def steps_of(config: dict) -> tuple[float, float]:
    """(alpha, beta) of an actor-critic checkpoint config: actor step config.alpha; critic step
    origin.beta, else training.beta, else alpha."""
    alpha = float(config.get("alpha", 1.0))
    for source in (config.get("origin") or {}, config.get("training") or {}):
        if source.get("beta") is not None:
            return alpha, float(source["beta"])
    return alpha, alpha


# -------------------------------------------------------------- readout
def readout(z_out: Float[Any, "*batch pos d_model"], layout: layouts.PromptLayout):
    """[w'; lam'] from the last column (numpy or torch): w and lam are adjacent blocks."""
    return z_out[..., -1, layout.slice("w").start : layout.slice("lam").stop]


def split(params: Float[Array, "*batch dm"], d: int) -> tuple[np.ndarray, np.ndarray]:
    """[w; lam] -> (w, lam)."""
    return params[..., :d], params[..., d:]


# ------------------------------------------------------------- reference
def reference_from_prompt(z: Float[Array, "batch pos d_model"], d: int, m: int, gamma: float, alpha: float,
                          beta: float) -> dict[str, np.ndarray]:
    """The reference actor-critic step on prompts in the actor-critic layout (output = [w'; lam'])."""
    z = np.asarray(z, dtype=np.float64)
    lay = layouts.actor_critic_layout(d, m)
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


# -------------------------------------------------------------- sampling
def sample_prompt_batch(config: dict, task, batch: int, rng: np.random.Generator):
    """Recording prompts of an actor-critic checkpoint: random MDPs, w and lam ~ N(0, w_scale^2 I),
    n steps of pi_lam each; with the reference step on the same prompts (a `sampling.PromptBatch`)."""

    d, m, gamma = int(config["d"]), int(config["m"]), float(config["gamma"])
    phi_pi = tabular_policy_features(d, m, task.n_states, task.n_actions)
    mdp = envs.sample_tabular_mdps(batch, task.n_states, task.n_actions, gamma, rng, task.concentration)
    w = task.w_scale * rng.standard_normal((batch, d))
    lam = task.w_scale * rng.standard_normal((batch, m))
    pi = policy(lam, phi_pi)
    traj = mdp.sample(pi, task.n, rng)
    prompt = prompt_from_mdp(mdp, traj, w, lam, phi_pi)
    tasks = sampling.mdp_task_data(mdp, pi)
    alpha, beta = steps_of(config)
    return sampling.PromptBatch(prompt, tasks, reference_from_prompt(prompt.z, d, m, gamma, alpha, beta))


def tabular_policy_features(d: int, m: int, n_states: int, n_actions: int) -> np.ndarray:
    """One-hot phi and phi_pi, checked against the model's (d, m)."""
    if n_states * n_actions != d or m != d:
        raise UserError(f"actor-critic on tabular MDPs uses one-hot features: d = m = n_states*n_actions = "
                        f"{n_states * n_actions}, but the model has d = {d}, m = {m}")
    return policy_features(n_states, n_actions)


# ---------------------------------------------------------------- models
def _builder(config, alpha: float, constants: dict) -> dict[str, np.ndarray]:
    """`models.register_theta_star` builder: one step for actor and critic (theta_star_model has one alpha)."""
    return theta_star(config.d, config.m, alpha, alpha, constants["c"])


def register() -> None:
    """Make `models.theta_star_model('actor-critic', d, m=...)` available (idempotent; imports torch)."""
    from .models import register_theta_star

    register_theta_star(FAMILY, _builder, ("c",))


def theta_star_model(d: int, m: int, gamma: float = 0.5, alpha: float = 1.0, beta: float = 1.0, c: float = 1.0,
                     dtype: str = "float64"):
    """An actor-critic LSA model holding theta* with actor step alpha and critic step beta."""
    from .models import ModelConfig, empty_model

    config = ModelConfig(family=FAMILY, d=d, m=m, n_layers=1, gamma=gamma, alpha=alpha, dtype=dtype)
    model = empty_model(config)
    model.load_arrays({f"blocks.0.attn.{k}": v for k, v in theta_star(d, m, alpha, beta, c).items()})
    model.origin = {"kind": "theta_star", "alpha": float(alpha), "beta": float(beta), "c": float(c)}
    return model


def save_theta_star(out_dir, n_states: int = 9, n_actions: int = 4, n: int = 64, gamma: float = 0.5,
                    alpha: float = 1.0, beta: float = 1.0, c: float = 1.0, dtype: str = "float64",
                    overwrite: bool = False):
    """Write a theta* actor-critic checkpoint for tabular MDPs (d = m = n_states * n_actions)."""
    from . import checkpoint

    d = V.count("n_states", n_states) * V.count("n_actions", n_actions)
    model = theta_star_model(d, d, gamma, alpha, beta, c, dtype)
    task = {"kind": "mdp", "n": int(n), "n_states": int(n_states), "n_actions": int(n_actions)}
    return checkpoint.save(model, {"n": int(n), "task": task}, out_dir, overwrite=overwrite)


# ---------------------------------------------------- teacher mimicking
# Hooks the trainer (icrl_interp.train) dispatches to for family 'actor-critic'; the config is
# train.config.ActorCriticTrainConfig. Torch is imported inside.
def train_batch(cfg, rng: np.random.Generator, batch: int | None = None):
    """Prompts of random MDPs with w ~ N(0, w_std^2), lam ~ N(0, lam_std^2), n steps of pi_lam each,
    and the teacher's [w'; lam'] (a train.tasks.SarsaBatch whose `w` holds [w; lam])."""
    import torch

    from .train.tasks import SarsaBatch

    batch = cfg.batch if batch is None else batch
    mdp = envs.sample_tabular_mdps(batch, cfg.n_states, cfg.n_actions, cfg.gamma, rng=rng, concentration=cfg.concentration)
    d = cfg.n_states * cfg.n_actions
    phi_pi = policy_features(cfg.n_states, cfg.n_actions)
    w, lam = cfg.w_std * rng.standard_normal((batch, d)), cfg.lam_std * rng.standard_normal((batch, d))
    traj = mdp.sample(policy(lam, phi_pi), cfg.n, rng)
    c = mdp_columns(mdp, traj, lam, phi_pi)
    z = actor_critic_prompt(c["phi"], c["phi_next"], c["rewards"], c["scores"], w, lam, cfg.gamma).z
    w_new, lam_new = reference.actor_critic_update(c["phi"], c["phi_next"], c["rewards"], c["scores"], w, lam, cfg.gamma,
                                                   cfg.alpha, cfg.beta)
    dtype = {"float32": torch.float32, "float64": torch.float64}[cfg.dtype]
    t = lambda a: torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)  # noqa: E731
    return SarsaBatch(z=t(z), w=t(np.concatenate([w, lam], -1)), target=t(np.concatenate([w_new, lam_new], -1)))


def mimicking_loss(model, batch):
    """Mean over prompts of ||[w'; lam']_TF - [w'; lam']_teacher||^2."""
    return (readout(model(batch.z), model.layout) - batch.target).pow(2).sum(-1).mean()


def evaluate_training(model, cfg, rng: np.random.Generator) -> dict:
    """Held-out teacher-mimicking loss, best c of (P12, V21bar) against (c P12*, V21bar*/c) (one scale
    for both output blocks), per-output-block scales, and the lazy blocks."""
    import torch

    from .analyzers import weights

    d = cfg.n_states * cfg.n_actions
    batch = train_batch(cfg, rng, cfg.eval_tasks)
    with torch.no_grad():
        loss = float(mimicking_loss(model, batch))
        update = float((batch.target - batch.w).pow(2).sum(-1).mean())
    P, Vm = (model.layer_params(0)[k].detach().double().numpy() for k in ("P", "V"))
    lay = model.layout
    one, two = weights.lsa_blocks(lay)
    P12s, V21s = theta_star_blocks(d, d, cfg.alpha, cfg.beta)
    P12, V21 = P[one, two], Vm[lay.slice("w").start :, one]  # V21bar: V21 without the '1' row
    fit = weights.manifold_fit(P12, P12s, V21, V21s[1:], ("P12", "V21"))
    c = fit["scale"]
    lazy = weights.lazy_blocks(P, Vm, lay)
    critic, actor = slice(0, d), slice(d, 2 * d)
    return {
        "loss": loss, "loss_relative_to_update": loss / update, "scale_c": c,
        "rel_err_P12": fit["rel_err"]["P12"], "rel_err_V21": fit["rel_err"]["V21"], "gauge_cosine": fit["gauge_cosine"],
        # one scale per output block, fitted separately: equal to scale_c if the manifold is one-dimensional
        "block_scales": {"critic": 1.0 / weights.ls_scale(V21[critic], V21s[1:][critic]),
                         "actor": 1.0 / weights.ls_scale(V21[actor], V21s[1:][actor])},
        "lazy_P22": lazy["P22"], "lazy_V22": lazy["V22"],
    }
