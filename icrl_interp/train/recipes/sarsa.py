"""Training the SARSA layer (Liang & Lai (b)): the torch half of the sarsa family.

* Batches: random tabular MDPs, w ~ N(0, w_std^2 I) in the prompt, n steps of the behaviour
  policy, and the teacher's update w_SARSA (one batch semi-gradient SARSA step, `sample_sarsa`).
* Objective: teacher mimicking, E ||TF(H) - w_SARSA||^2 (sum over coordinates, mean over prompts).
* Init: `models.build_model`'s, whose lazy blocks P22 and V22 start at zero; no mask is needed:
  each lazy block's gradient is a product with the other lazy block, so both stay exactly 0.0
  under any gradient method (Prop. 3.1). With `lazy_ablation` they get a Xavier-normal draw too.
* `span_projection` projects each Adam update onto the span of the prompts' transition columns
  (`icrl_interp.train.span`).
* Evaluation: teacher-mimicking loss, the best c of (P12, V21bar) against (c P12*, V21bar*/c),
  relative errors at that c, the gauge-free cosine, the same modulo the unexcited direction u,
  and the lazy blocks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from ...analyzers import weights
from ...core.errors import UserError, check
from ...families.sarsa import NAME, feature_task, prompt_from_mdp, theta_star_blocks
from ...models import ModelConfig
from ...tasks import envs, layouts, reference, sampling
from ...tasks.sampling import SA_FEATURES
from .. import span
from ..config import TrainConfig
from ..recipe import Recipe, Trends
from ..util import lazy_max_abs, param, randomize_lazy_blocks, tensor, torch_dtype


@dataclass
class SarsaTrainConfig(TrainConfig):
    """Liang & Lai (b): one LSA layer mimicking the batch SARSA update on random tabular MDPs."""

    family: str = NAME
    n_states: int = 9
    """States of each random MDP."""
    n_actions: int = 4
    """Actions of each random MDP."""
    gamma: float = 0.5
    """Discount factor."""
    n: int = 64
    """Context length (transitions per prompt)."""
    alpha: float = 1.0
    """Step of the teacher update w_SARSA = w + (alpha/n) sum_i delta_i phi_i."""
    w_std: float = 0.5
    """Parameters in the prompt: w ~ N(0, w_std^2 I)."""
    w_std_max: float | None = None
    """If set, each prompt's std of w is drawn log-uniformly from [w_std, w_std_max], so training also sees the
    larger parameters a closed control loop reaches (None: always w_std)."""
    epsilon: float = 1.0
    """Behaviour policy: epsilon-greedy on Q_w(s, a) = w . phi(s, a) (1.0 = uniform random)."""
    concentration: float = 1.0
    """Dirichlet concentration of the transition rows."""
    tasks_per_step: int = 256
    """MDPs (one prompt each) per optimizer step."""
    lazy_ablation: bool = False
    """Ablation: Xavier-initialise the lazy blocks P22 and V22 too (the paper zero-initialises them)."""
    span_projection: bool = False
    """Project each Adam update of P's transition rows and V's transition columns onto the span of the
    prompts' transition columns (icrl_interp.train.span), so, as under gradient descent, nothing moves along
    the direction u = [1; -1/gamma 1; 0] that one-hot features never excite (sarsa only)."""
    sa_features: str = field(default="onehot", metadata={"choices": SA_FEATURES})
    """State-action features: 'onehot' (d = n_states * n_actions; leaves u = [1; -1/gamma 1; 0] unexcited), or a
    fresh random map per MDP, 'gaussian' (N(0, I/d)) or 'uniform' (same variance), which excites every direction
    (Liang & Lai's Assumption 1; sampling.sa_feature_map)."""
    d: int | None = None
    """Feature dimension (None: n_states * n_actions; one-hot needs exactly that)."""
    sa_randomness: float = 1.0
    """Random feature maps: rho in [0, 1], phi = sqrt(1 - rho^2) phi0 + rho G; small rho moves the features toward
    the fixed, poorly exciting map phi0(s, a) = e_{(s n_A + a) mod d} (the paper's 'low-randomness' ablation)."""
    steps: int = 3000
    lr: float = 1e-3
    lr_decay: float = 0.99
    lr_decay_every: int = 10

    LATE_FIELDS: ClassVar[tuple[str, ...]] = ("sa_features", "d", "sa_randomness", "w_std_max")

    def validate(self) -> "SarsaTrainConfig":
        super().validate()
        for name in ("n_states", "n_actions", "n", "tasks_per_step"):
            check(int(getattr(self, name)) >= 1, f"{name} must be a positive integer, got {getattr(self, name)}")
        check(self.w_std >= 0, f"w_std must be non-negative, got {self.w_std}")
        check(self.w_std_max is None or self.w_std_max >= self.w_std > 0,
              f"w_std_max must be at least w_std > 0, got {self.w_std_max} (w_std {self.w_std})")
        check(0 <= self.epsilon <= 1, f"epsilon must lie in [0, 1], got {self.epsilon}")
        check(self.concentration > 0, f"concentration must be positive, got {self.concentration}")
        try:
            sampling.check_sa_features(self.sa_features, self.sa_randomness, int(self.n_states), int(self.n_actions),
                                       self.feature_dim)
        except UserError as e:
            raise UserError(f"{e} (training options sa_features, sa_randomness, d)") from None
        return self

    @property
    def feature_dim(self) -> int:
        """d: the given one, else n_states * n_actions."""
        return int(self.n_states) * int(self.n_actions) if self.d is None else self.d


def model_config(cfg: SarsaTrainConfig) -> ModelConfig:
    return ModelConfig(family=NAME, d=cfg.feature_dim, n_layers=1, gamma=cfg.gamma, alpha=cfg.alpha, dtype=cfg.dtype)


def mdp_task(cfg: SarsaTrainConfig) -> dict:
    """The checkpoints' task of a tabular-MDP training config (its `family` is the config's); the feature map's
    keys only when it is not one-hot, so one-hot checkpoints read exactly as before."""
    return {"family": cfg.family, "kind": "mdp", "n": cfg.n, "n_states": cfg.n_states, "n_actions": cfg.n_actions,
            "concentration": cfg.concentration, "epsilon": cfg.epsilon, "w_scale": cfg.w_std,
            **feature_task(cfg.sa_features, cfg.sa_randomness)}


# ------------------------------------------------------------------ batches
@dataclass
class SarsaBatch:
    """Prompts of random tabular MDPs and the teacher's update for each."""

    z: Float[Tensor, "batch pos d_model"]
    """Prompts (transition columns and the parameter column [1; w])."""
    w: Float[Tensor, "batch d"]
    """Parameters in the prompt (the update's starting point)."""
    target: Float[Tensor, "batch d"]
    """Teacher: one batch semi-gradient SARSA step from w (reference.sarsa_update)."""
    weight: Float[Tensor, " d"] | None = None
    """Per-coordinate weights of the squared error (None: all 1; actor-critic's loss_weights 'steps')."""


def sample_mdps(cfg: SarsaTrainConfig, batch: int, rng: np.random.Generator) -> envs.MDPBatch:
    """The task distribution: `batch` random tabular MDPs with the config's shape, concentration and features."""
    return sampling.draw_mdps(batch, cfg.n_states, cfg.n_actions, cfg.gamma, rng, cfg.concentration, cfg.sa_features,
                              cfg.feature_dim, cfg.sa_randomness)


def sample_sarsa(cfg: SarsaTrainConfig, rng: np.random.Generator, size: int | None = None) -> SarsaBatch:
    """`size` (default `tasks_per_step`) random MDPs, w ~ N(0, w_std^2 I), n steps of the behaviour policy each."""
    batch = cfg.tasks_per_step if size is None else size
    mdp = sample_mdps(cfg, batch, rng)
    w = draw_params(cfg.w_std, cfg.w_std_max, batch, cfg.feature_dim, rng)
    traj = mdp.sample(envs.epsilon_greedy(sampling.q_values(mdp, w), cfg.epsilon), cfg.n, rng)
    prompt = prompt_from_mdp(mdp, traj, w)
    lay = prompt.layout
    phi = prompt.z[:, :-1, lay.slice("phi")]
    phi_next = _next_phi(mdp, traj)  # from the trajectory, not gamma*phi+ / gamma (exact, and gamma may be 0)
    target = reference.sarsa_update(phi, phi_next, traj.rewards, w, cfg.gamma, cfg.alpha)
    dtype = torch_dtype(cfg.dtype)
    return SarsaBatch(z=tensor(prompt.z, dtype), w=tensor(w, dtype), target=tensor(target, dtype))


def draw_params(std: float, std_max: float | None, batch: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """Parameters of `batch` prompts, N(0, s^2 I_dim): s = std, or with std_max one s per prompt, log-uniform in
    [std, std_max] (a scale mixture covering small and large parameters)."""
    if std_max is None:
        return std * rng.standard_normal((batch, dim))
    scale = np.exp(rng.uniform(np.log(std), np.log(std_max), size=(batch, 1)))
    return scale * rng.standard_normal((batch, dim))


def _next_phi(mdp: envs.MDPBatch, traj: envs.Trajectories) -> np.ndarray:
    """phi(s_{i+1}, a_{i+1}) of each transition, straight from the trajectory."""
    return layouts.mdp_columns(mdp, traj)[1]


# --------------------------------------------------------------- objectives
def teacher_mimicking(model, batch: SarsaBatch) -> Tensor:
    """Liang-Lai: mean over prompts of ||TF(H) - w_SARSA||^2."""
    out = model.readout(model(batch.z))
    return (out - batch.target).pow(2).sum(-1).mean()


# --------------------------------------------------------------------- init
def adjust_init(model: torch.nn.Module, cfg: SarsaTrainConfig, generator: torch.Generator) -> dict[str, Tensor]:
    """With `lazy_ablation`: random lazy blocks (from `generator`); never any gradient mask."""
    return randomize_lazy_blocks(model, cfg.init_gain, generator) if cfg.lazy_ablation else {}


def update_constraint(model, cfg: SarsaTrainConfig):
    """With `span_projection`: project each update onto the transition columns' span (train.span)."""
    if not cfg.span_projection:
        return None
    proj, layout = span.transition_span_projector(cfg, model.layout), model.layout
    return lambda named, before: span.project_updates(named, before, proj, layout)


def log_extras(model, cfg: SarsaTrainConfig) -> dict:
    """max |lazy block entry| (0.0 unless the blocks moved)."""
    return {"lazy_max_abs": lazy_max_abs(model)}


# --------------------------------------------------------------- evaluation
def evaluate(model, cfg: SarsaTrainConfig, rng: np.random.Generator) -> dict:
    """Held-out loss, manifold fit of (P12, V21bar) (raw, modulo u, and theta*'s own floor), lazy blocks.

    V21bar is V21 without its first row, the row that writes the constant entry of w~ = [1; w]: that entry is
    never read out, so the loss does not see the row (it stays at its init) and it is not identifiable for any
    feature map. `rel_err_V21` is over the identifiable rows; `rel_err_V21_all_rows` adds the unread row at the
    same c, for the record. With one-hot features u is not identifiable either (`mod_null`, `null_floor`).
    """
    d = cfg.feature_dim
    batch = sample_sarsa(cfg, rng, cfg.eval_tasks)
    with torch.no_grad():
        loss = float(teacher_mimicking(model, batch))
        update = float((batch.target - batch.w).pow(2).sum(-1).mean())
    P, V = param(model, 0, "P"), param(model, 0, "V")
    one, two = weights.lsa_blocks(model.layout)
    wrows = model.layout.slice("w")
    P12s, V21s = theta_star_blocks(d, cfg.alpha)
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
    V21_all, V21s_all = V[two, one], theta_star_blocks(d, cfg.alpha)[1]
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
        "rel_err_V21_all_rows": weights.rel_err(V21_all, V21s_all / fit["scale"]),
        "features": {"sa_features": cfg.sa_features, "d": d, "sa_randomness": cfg.sa_randomness},
    }


def trend_series(rows: list[dict]) -> dict[str, list[float]]:
    return {"rel err P12": [r["rel_err_P12"] for r in rows], "rel err V21": [r["rel_err_V21"] for r in rows],
            "rel err P12 mod u": [r["mod_null"]["rel_err_P12"] for r in rows],
            "rel err V21 mod u": [r["mod_null"]["rel_err_V21"] for r in rows],
            "lazy |P22|+|V22|": [r["lazy_P22"] + r["lazy_V22"] for r in rows]}


TRAINING = Recipe(
    config_class=SarsaTrainConfig,
    model_config=model_config,
    task=mdp_task,
    batch=sample_sarsa,
    objectives={"mimic": teacher_mimicking},
    evaluate=evaluate,
    trends=Trends(series=trend_series, log_scale=True),
    adjust_init=adjust_init,
    log_extras=log_extras,
    update_constraint=update_constraint,
)
