"""Training the actor-critic layer (Liang & Lai (b), Thm 3.3): the torch half of the actor-critic family.

The SARSA recipe with a policy: prompts carry w ~ N(0, w_std^2 I) and lam ~ N(0, lam_std^2 I), the
behaviour policy is pi_lam (tabular softmax, m = d), and the teacher is the actor-critic step
[w'; lam'] (`reference.actor_critic_update`). Init, lazy blocks and the ablation are SARSA's.
Evaluation: held-out teacher-mimicking loss, the best c of (P12, V21bar) against
(c P12*, V21bar*/c) (one scale for both output blocks), per-output-block scales, the lazy blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from ...analyzers import weights
from ...core.errors import check
from ...families import sarsa
from ...families.actor_critic import NAME, mdp_columns, mdp_policy_features, policy, prompt, readout, theta_star_blocks
from ...models import ModelConfig
from ...tasks import reference
from ..recipe import Recipe, Trends
from ..util import param, tensor, torch_dtype
from . import sarsa as sarsa_training
from .sarsa import SarsaBatch, SarsaTrainConfig


@dataclass
class ActorCriticTrainConfig(SarsaTrainConfig):
    """Liang & Lai (b), Thm 3.3: one LSA layer mimicking the batch actor-critic step (icrl_interp.families.actor_critic).

    Prompts carry w ~ N(0, w_std^2 I) and lam ~ N(0, lam_std^2 I); the behaviour policy is pi_lam
    (tabular softmax, m = d), so `epsilon` is unused. The target is [w'; lam'].
    """

    family: str = NAME
    alpha: float = 1.0
    """Actor step: lam' = lam + (alpha/n) sum_i gamma^i delta_i g_i."""
    critic_step: float = 1.0
    """Critic step beta: w' = w + (beta/n) sum_i delta_i phi_i."""
    lam_std: float = 0.5
    """Policy parameters in the prompt: lam ~ N(0, lam_std^2 I)."""
    lam_std_max: float | None = None
    """If set, each prompt's std of lam is drawn log-uniformly from [lam_std, lam_std_max]: the closed loop's lam
    grows well past lam_std (|lam| ~ 14-16 after 1000 updates at alpha 32, d 36), and training must cover it."""
    critic_weight: float = 1.0
    """Weight of the critic's squared error in the loss (the actor's has weight 1; the paper weights the two).
    The critic's update is beta/alpha times the actor's, so with weight 1 a small critic step leaves the critic
    all but out of the loss; (alpha/beta)^2 weighs both errors relative to their own step."""

    critic_lr_factor: float = 1.0
    """Factor on the Adam steps of V's critic rows (the rows that write w'). Adam moves every entry by about lr
    per step whatever its scale, and theta*'s critic rows are beta/alpha times its actor rows: beta/alpha gives
    both the same relative step (a per-block learning rate; 1.0: plain Adam)."""

    LATE_FIELDS: ClassVar[tuple[str, ...]] = SarsaTrainConfig.LATE_FIELDS + ("lam_std_max", "critic_weight",
                                                                            "critic_lr_factor")

    def validate(self) -> "ActorCriticTrainConfig":
        super().validate()
        check(not self.span_projection, f"span_projection is implemented for {sarsa.NAME} only, not {NAME}")
        check(self.lam_std >= 0, f"lam_std must be non-negative, got {self.lam_std}")
        check(self.lam_std_max is None or self.lam_std_max >= self.lam_std > 0,
              f"lam_std_max must be at least lam_std > 0, got {self.lam_std_max} (lam_std {self.lam_std})")
        check(self.critic_weight > 0, f"critic_weight must be positive, got {self.critic_weight}")
        check(self.critic_lr_factor > 0, f"critic_lr_factor must be positive, got {self.critic_lr_factor}")
        return self


def model_config(cfg: ActorCriticTrainConfig) -> ModelConfig:
    """Softmax policy on the critic's features: m = d (n_states * n_actions for one-hot)."""
    d = cfg.feature_dim
    return ModelConfig(family=NAME, d=d, m=d, n_layers=1, gamma=cfg.gamma, alpha=cfg.alpha, dtype=cfg.dtype)


def sample_actor_critic(cfg: ActorCriticTrainConfig, rng: np.random.Generator, size: int | None = None) -> SarsaBatch:
    """Prompts of random MDPs with w ~ N(0, w_std^2), lam ~ N(0, lam_std^2), n steps of pi_lam each,
    and the teacher's [w'; lam'] (a SarsaBatch whose `w` holds [w; lam])."""
    batch = cfg.tasks_per_step if size is None else size
    mdp = sarsa_training.sample_mdps(cfg, batch, rng)
    d = cfg.feature_dim
    phi_pi = mdp_policy_features(mdp)
    if cfg.w_std_max is None and cfg.lam_std_max is None:  # the original draw, kept bit for bit
        w, lam = cfg.w_std * rng.standard_normal((batch, d)), cfg.lam_std * rng.standard_normal((batch, d))
    else:
        w = sarsa_training.draw_params(cfg.w_std, cfg.w_std_max, batch, d, rng)
        lam = sarsa_training.draw_params(cfg.lam_std, cfg.lam_std_max, batch, d, rng)
    traj = mdp.sample(policy(lam, phi_pi), cfg.n, rng)
    c = mdp_columns(mdp, traj, lam, phi_pi)
    z = prompt(c["phi"], c["phi_next"], c["rewards"], c["scores"], w, lam, cfg.gamma).z
    w_new, lam_new = reference.actor_critic_update(c["phi"], c["phi_next"], c["rewards"], c["scores"], w, lam, cfg.gamma,
                                                   cfg.alpha, cfg.critic_step)
    dtype = torch_dtype(cfg.dtype)
    weight = None
    if cfg.critic_weight != 1.0:
        weight = tensor(np.concatenate([np.full(d, cfg.critic_weight), np.ones(d)]), dtype)
    return SarsaBatch(z=tensor(z, dtype), w=tensor(np.concatenate([w, lam], -1), dtype),
                      target=tensor(np.concatenate([w_new, lam_new], -1), dtype), weight=weight)


def mimicking_loss(model, batch: SarsaBatch) -> Tensor:
    """Mean over prompts of ||[w'; lam']_TF - [w'; lam']_teacher||^2 (each coordinate times the batch's weight,
    if it has one: critic_weight)."""
    err = (readout(model(batch.z), model.layout) - batch.target).pow(2)
    if batch.weight is not None:
        err = err * batch.weight
    return err.sum(-1).mean()


def evaluate(model, cfg: ActorCriticTrainConfig, rng: np.random.Generator) -> dict:
    """Held-out loss (unweighted, whatever `critic_weight`; and per output block, relative to the teacher's
    update), manifold fit of (P12, V21bar), one scale per output block, lazy blocks."""
    d = cfg.feature_dim
    batch = sample_actor_critic(cfg, rng, cfg.eval_tasks)
    with torch.no_grad():
        err = (readout(model(batch.z), model.layout) - batch.target).pow(2)
        step = (batch.target - batch.w).pow(2)
        loss, update = float(err.sum(-1).mean()), float(step.sum(-1).mean())
        per_block = {name: float(err[:, sl].sum(-1).mean() / step[:, sl].sum(-1).mean())
                     for name, sl in (("critic", slice(0, d)), ("actor", slice(d, 2 * d)))}
    P, Vm = param(model, 0, "P"), param(model, 0, "V")
    lay = model.layout
    one, two = weights.lsa_blocks(lay)
    P12s, V21s = theta_star_blocks(d, d, cfg.alpha, cfg.critic_step)
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
        "loss_relative_by_block": per_block,
        "rel_err_V21_all_rows": weights.rel_err(Vm[two, one], V21s / c),
        "features": {"sa_features": cfg.sa_features, "d": d, "sa_randomness": cfg.sa_randomness},
    }


def trend_series(rows: list[dict]) -> dict[str, list[float]]:
    """The family's own metrics (its evaluation has no 'mod_null' block, unlike SARSA's)."""
    return {"rel err P12": [r["rel_err_P12"] for r in rows], "rel err V21": [r["rel_err_V21"] for r in rows],
            "loss / update": [r["loss_relative_to_update"] for r in rows],
            "lazy |P22|+|V22|": [r["lazy_P22"] + r["lazy_V22"] for r in rows]}


def adjust_init(model: torch.nn.Module, cfg: ActorCriticTrainConfig, generator: torch.Generator) -> dict[str, Tensor]:
    """SARSA's init (the lazy-block ablation), and with critic_lr_factor k != 1 the critic rows of V scaled by k:
    together with the k-scaled steps, Adam on V's critic rows then equals Adam on V' = V / k from the usual init."""
    masks = sarsa_training.adjust_init(model, cfg, generator)
    if cfg.critic_lr_factor != 1.0:
        rows = model.layout.slice("w")
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.rsplit(".", 1)[-1] == "V":
                    p[rows, :] *= cfg.critic_lr_factor
    return masks


def update_constraint(model, cfg: ActorCriticTrainConfig):
    """With critic_lr_factor != 1: scale the last Adam step of V's critic rows (a per-block learning rate)."""
    if cfg.critic_lr_factor == 1.0:
        return None
    rows, factor = model.layout.slice("w"), cfg.critic_lr_factor

    def fix(named, before):
        with torch.no_grad():
            for name, p in named.items():
                if name.rsplit(".", 1)[-1] == "V":
                    p[rows, :] = before[name][rows, :] + factor * (p[rows, :] - before[name][rows, :])

    return fix


TRAINING = Recipe(
    config_class=ActorCriticTrainConfig,
    model_config=model_config,
    task=sarsa_training.mdp_task,
    batch=sample_actor_critic,
    objectives={"mimic": mimicking_loss},
    evaluate=evaluate,
    trends=Trends(series=trend_series, log_scale=True),
    adjust_init=adjust_init,
    log_extras=sarsa_training.log_extras,
    update_constraint=update_constraint,
)
