"""Held-out evaluation of a trained model, one function per family.

The metrics themselves come from `icrl_interp.analyzers` (VD/SS/IWS, manifold fit,
P/Q summaries, sign patterns, population kernel); this module only draws held-out
tasks, runs the model on them and picks what a run reports in final_metrics.json.

* linear-td: VD, SS, IWS against L-step batch TD(0) whose step alpha fits best (1-D
  search) on separate calibration tasks ((c) co-trains that alpha instead), and (c)'s
  P/Q summaries after sign alignment.
* softmax-td: NEU, ||v_l - v_pi||_inf per depth l, the value row and its sign pattern,
  and the population kernel's diagonality against Assumption 5.1's threshold (1 + gamma)/2.
* sarsa: teacher-mimicking loss, the best c of (P12, V21bar) against (c P12*, V21bar*/c),
  relative errors at that c, the gauge-free cosine, and the lazy blocks.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import envs, layouts, reference, theta_star
from ..analyzers import convergence, kernel, weights
from . import tasks as T
from .config import LinearTDTrainConfig, SarsaTrainConfig, SoftmaxTDTrainConfig, TrainConfig
from .objectives import neu, teacher_mimicking

Array = np.ndarray


def _param(model, layer: int, name: str) -> Array:
    return model.layer_params(layer)[name].detach().double().numpy()


# ----------------------------------------------------------------- linear TD
def _td_eval_set(cfg: LinearTDTrainConfig, rng: np.random.Generator, tasks: int):
    """Tasks with one context each, every state's features in the query of a copy of it."""
    mrp = envs.sample_boyan_chains(tasks, cfg.n_states, cfg.d, cfg.gamma, rng=rng)
    traj = mrp.sample(cfg.n, rng)
    S, rows = cfg.n_states, np.arange(tasks)[:, None]
    phi, phi_next = mrp.phi[rows, traj.states[:, :-1]], mrp.phi[rows, traj.states[:, 1:]]
    rep = lambda a: np.repeat(a, S, axis=0)  # noqa: E731  one prompt per (task, query state)
    prompt = layouts.td_prompt(rep(phi), rep(phi_next), rep(traj.rewards), mrp.phi.reshape(tasks * S, cfg.d), cfg.gamma)
    return mrp, (phi, phi_next, traj.rewards), prompt.z


def _values_and_grads(model, z: Array, S: int, d: int) -> tuple[Array, Array]:
    """v_tf at each query and its gradient with respect to the query features, as [tasks, S(, d)]."""
    zt = torch.as_tensor(z, dtype=model.dtype).requires_grad_(True)
    v = model.readout(model(zt)).reshape(-1)
    (grad,) = torch.autograd.grad(v.sum(), zt)
    return v.detach().double().numpy().reshape(-1, S), grad[:, -1, :d].double().numpy().reshape(-1, S, d)


def _td_weights(context, cfg: LinearTDTrainConfig, alpha: float) -> Array:
    phi, phi_next, rewards = context
    tr = reference.batch_td(phi, phi_next, rewards, np.zeros((phi.shape[0], cfg.d)), cfg.gamma, alpha, cfg.n_layers)
    return tr.w[:, -1]


def fit_alpha(v_tf: Array, mrp: envs.MRPBatch, context, cfg: LinearTDTrainConfig) -> float:
    """The step alpha of L-step batch TD whose values are closest (d_pi-weighted) to v_tf."""
    mu = mrp.stationary()

    def vd(alpha: float) -> float:
        v_td = np.einsum("bsd,bd->bs", mrp.phi, _td_weights(context, cfg, alpha))
        return float(np.mean(np.sum(mu * (v_tf - v_td) ** 2, -1)))

    grid = np.geomspace(1e-2, 1e2, 81)
    best = grid[int(np.argmin([vd(a) for a in grid]))]
    fine = np.geomspace(best / 1.13, best * 1.13, 41)
    return float(fine[int(np.argmin([vd(a) for a in fine]))])


def evaluate_linear_td(model, cfg: LinearTDTrainConfig, rng: np.random.Generator) -> dict:
    S, d = cfg.n_states, cfg.d
    cal_mrp, cal_ctx, cal_z = _td_eval_set(cfg, rng, cfg.eval_tasks)
    alpha = fit_alpha(_values_and_grads(model, cal_z, S, d)[0], cal_mrp, cal_ctx, cfg)
    mrp, ctx, z = _td_eval_set(cfg, rng, cfg.eval_tasks)
    v_tf, g_tf = _values_and_grads(model, z, S, d)
    w_td = _td_weights(ctx, cfg, alpha)
    v_td = np.einsum("bsd,bd->bs", mrp.phi, w_td)
    mu, v_true = mrp.stationary(), mrp.values()
    g_td = np.broadcast_to(w_td[:, None, :], g_tf.shape)  # v_td = w_td . phi_q: the same gradient at every state
    m = convergence.vd_ss_iws(v_tf, v_td, g_tf, g_td, mrp.phi, mu, w_td)
    layers = range(1 if cfg.tied else cfg.n_layers)
    return {
        "alpha_fit": alpha,
        **{k: float(np.mean(v)) for k, v in m.items()},
        "msve_tf": float(np.mean(np.sum(mu * (v_tf - v_true) ** 2, -1))),
        "msve_td": float(np.mean(np.sum(mu * (v_td - v_true) ** 2, -1))),
        "layers": [weights.pq_summary(_param(model, l, "P"), _param(model, l, "Q"), model.layout) for l in layers],
    }


# ---------------------------------------------------------------- softmax TD
def value_row(model, layer: int) -> Array:
    """The learned value row over (R, target, current) of the current-memory head."""
    lay = model.layout
    cols = [lay.slice(b).start for b in ("reward", "target_mem", "current_mem")]
    return _param(model, layer, "V")[lay.slice("current_mem").start, cols]


def evaluate_softmax_td(model, cfg: SoftmaxTDTrainConfig, rng: np.random.Generator) -> dict:
    batch = T.sample_state_queries(cfg, rng, cfg.eval_tasks)
    v_true = batch.v_true.double().numpy()
    errors = [float(np.mean(np.abs(v_true).max(-1)))]  # v_0 = 0
    with torch.no_grad():
        loss = float(neu(model, batch))
        flat = batch.z.reshape((-1,) + batch.z.shape[-2:])
        for l in range(1, cfg.n_layers + 1):
            v = model.readout(model(flat, stop_at_layer=l)).reshape(v_true.shape).double().numpy()
            errors.append(float(np.mean(convergence.value_errors(v, v_true)[0])))
    lay = model.layout
    x = cfg.beta * np.broadcast_to(np.eye(cfg.n_states), (cfg.eval_tasks, cfg.n_states, cfg.n_states))
    mu = batch.mu.double().numpy()
    threshold = (1 + cfg.gamma) / 2
    out_layers = []
    for l in range(1 if cfg.tied else cfg.n_layers):
        A11 = _param(model, l, "A")[lay.slice("x"), lay.slice("x")]
        diag = np.diagonal(kernel.population_kernel(A11, x, mu), axis1=-2, axis2=-1)
        row = value_row(model, l)
        out_layers.append({
            "layer": l, "value_row": row.tolist(), "sign_pattern": weights.sign_pattern(row),
            "value_row_cosine": weights.cosine(row, [1.0, 1.0, -1.0]),
            "kernel_diag_mean": float(diag.mean()), "kernel_diag_min": float(diag.min(-1).mean()),
            "margin": float(diag.min(-1).mean() - threshold),
            "assumption_5_1_fraction": float(np.mean(diag.min(-1) > threshold)),
        })
    return {"neu": loss, "value_error_inf_by_depth": errors, "layers": out_layers}


# ---------------------------------------------------------------------- SARSA
def evaluate_sarsa(model, cfg: SarsaTrainConfig, rng: np.random.Generator) -> dict:
    d = cfg.n_states * cfg.n_actions
    batch = T.sample_sarsa(cfg, rng, cfg.eval_tasks)
    with torch.no_grad():
        loss = float(teacher_mimicking(model, batch))
        update = float((batch.target - batch.w).pow(2).sum(-1).mean())
    P, V = _param(model, 0, "P"), _param(model, 0, "V")
    one, two = weights.lsa_blocks(model.layout)
    wrows = model.layout.slice("w")
    P12s, V21s = theta_star.sarsa_blocks(d, cfg.alpha)
    P12, V21, V21s = P[one, two], V[wrows, one], V21s[1:]
    fit = weights.manifold_fit(P12, P12s, V21, V21s, ("P12", "V21"))
    # The one direction no prompt excites: u . x_i = 1 - 1 = 0 for every column, since one-hot
    # features have 1^T phi = 1 = 1^T phi+. The loss never sees it and gradient descent never
    # moves it, but Adam's per-coordinate scaling does; compare the blocks modulo u as well.
    # (gamma = 0 empties the whole gamma*phi+ block instead; u then only removes its all-ones part.)
    u = np.concatenate([np.ones(d), -np.ones(d) / max(cfg.gamma, 1e-12), [0.0]])
    proj = np.eye(2 * d + 1) - np.outer(u, u) / (u @ u)
    mod = weights.manifold_fit(proj @ P12, proj @ P12s, V21 @ proj, V21s @ proj, ("P12", "V21"))
    # theta* itself has a component along u (u^T P12* = -(1 + 1/gamma) per w column), which no loss
    # identifies: a model whose u-component stays ~0 (gradient descent, or --span-projection, from a
    # small init) ends near the raw errors of theta* with that component removed ('null_floor').
    floor = weights.manifold_fit(proj @ P12s, P12s, V21s @ proj, V21s, ("P12", "V21"))
    lazy = weights.lazy_blocks(P, V, model.layout)
    return {
        "loss": loss,
        "loss_relative_to_update": loss / update,
        "scale_c": fit["scale"],
        "rel_err_P12": fit["rel_err"]["P12"],
        "rel_err_V21": fit["rel_err"]["V21"],
        "gauge_cosine": fit["gauge_cosine"],
        "null_direction_share_P12": float(np.linalg.norm(u @ (P12 - fit["scale"] * P12s)) / np.linalg.norm(u)
                                          / max(np.linalg.norm(P12 - fit["scale"] * P12s), 1e-300)),
        "mod_null": {"scale_c": mod["scale"], "rel_err_P12": mod["rel_err"]["P12"], "rel_err_V21": mod["rel_err"]["V21"],
                     "gauge_cosine": mod["gauge_cosine"]},
        "lazy_P22": lazy["P22"],
        "lazy_V22": lazy["V22"],
        "null_floor": {"rel_err_P12": floor["rel_err"]["P12"], "rel_err_V21": floor["rel_err"]["V21"]},
    }


def evaluate(model, cfg: TrainConfig, rng: np.random.Generator) -> dict:
    """The family's held-out evaluation (see the module docstring)."""
    if cfg.family == "linear-td":
        return evaluate_linear_td(model, cfg, rng)
    if cfg.family == "softmax-td":
        return evaluate_softmax_td(model, cfg, rng)
    if cfg.family == "actor-critic":
        from ..actor_critic import evaluate_training

        return evaluate_training(model, cfg, rng)
    return evaluate_sarsa(model, cfg, rng)
