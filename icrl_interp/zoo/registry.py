"""The zoo's one table: every model with a known answer, its ground truth and how to build it (docs/zoo.md).

An `Entry` names the task it runs on (the family whose theta* runs `family_algorithm`, looked up in the
family registry by `Hints.algorithm`, with that family's construct options), its `Truth` (the algorithm as
the verdict's candidate name, its parameters, whether it is a decoy, the layer its computation is known to
sit at) and a builder `build(entry, config) -> torch module` (`config`: the task, a checkpoint config of
`models.construct.task_config`). `entries(set_name, zoo_seed)` draws the zoo: seed 0 is the zoo the
thresholds were read against; any other seed is a *fresh* zoo (step sizes jittered, other prompts, splits
and random directions) that nothing was tuned on.

Other modules add entries by naming themselves in `PROVIDERS`: a module with
`entries(zoo_seed: int) -> list[Entry]` (the trained mimics of `zoo/mimics.py`). A provider that is not
installed (its module missing) is skipped.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..core.errors import UserError
from .tasks import LINEAR, SHORT, SMALL_MDP, family_of

SETS = ("default", "full")
"""`default`: a few entries that build and run in the test suite; `full`: every entry (docs/zoo.md)."""
KINDS = ("exact", "trained", "decoy")
PROVIDERS = ("icrl_interp.zoo.mimics",)
"""Modules that contribute entries (`entries(zoo_seed)`); skipped when not present."""
REWARD_REGRESSION = "reward regression (no bootstrapping)"
"""The verdict's label of a model of the immediate reward (TD with gamma' = 0)."""
NONE_FITS = "none fits"
ZOO_ROLES = {"resid_pre": "blocks.{layer}.hook_resid_pre", "resid_post": "blocks.{layer}.hook_resid_post",
             "readout": "unembed"}
"""[roles] of the zoo's own modules (`teachers.ZooModule`): their residual stream and readout."""
JITTER = 0.25
"""A fresh zoo (seed != 0) multiplies every step size by exp(U(-JITTER, JITTER))."""


@dataclass(frozen=True)
class Truth:
    """What an entry computes."""

    algorithm: str
    """The verdict's candidate name (td0, td_lambda_0.5, mc_regression, residual_gradient, lstd, batch_sarsa,
    expected_sarsa, q_learning, actor_critic), or for a decoy what it computes (e.g. 'last_reward')."""
    params: dict = field(default_factory=dict)
    """alpha, gamma (the discount gamma' the algorithm bootstraps with; it may differ from the task's), lambda,
    steps_per_layer, beta (actor-critic's critic step); only those the algorithm has."""
    decoy: bool = False
    target_layer: int | None = None
    """The layer the causal test runs at (None: not run). For a non-decoy, the layer whose residual stream
    (its errors at the context columns) the next layer reads, so the test must say "yes" there; for a decoy,
    a layer whose context columns the next layer reads too, where the test must not say "yes"."""
    accepted: tuple[str, ...] = ()
    """The verdict labels that are right for this entry (default: the algorithm; decoys: 'none fits' and
    reward regression)."""

    def right(self) -> tuple[str, ...]:
        if self.accepted:
            return self.accepted
        return (NONE_FITS, REWARD_REGRESSION) if self.decoy else (self.algorithm,)


@dataclass(frozen=True)
class Entry:
    """One zoo model."""

    name: str
    kind: str
    """'exact' (a teacher computing the algorithm), 'trained' (a transformer trained to mimic one) or 'decoy'."""
    family_algorithm: str
    """`Hints.algorithm` of the family whose task the model runs on (td0: linear-td, batch_sarsa, actor_critic)."""
    truth: Truth
    build: Callable[["Entry", Any], Any]
    """build(entry, config) -> torch.nn.Module."""
    task_options: dict = field(default_factory=dict)
    """Construct options of the family's task (d, n, gamma, ...)."""
    sets: tuple[str, ...] = ("full",)
    seed: int = 0
    """Seeds the entry's prompts, split and random directions (and its fit, where it has one)."""
    description: str = ""
    roles: dict | None = None
    """[roles] of the model (docs/byom.md): where its residual stream and readout are; None: `ZOO_ROLES`."""

    @property
    def probe_roles(self) -> dict:
        return dict(self.roles if self.roles is not None else ZOO_ROLES)

    @property
    def family(self) -> str:
        return family_of(self.family_algorithm)

    def config(self):
        from ..models.construct import task_config

        return task_config(self.family, dict(self.task_options), seed=self.seed)

    def model(self):
        return self.build(self, self.config())


# ------------------------------------------------------------------ builders
def _layout_gamma(config):
    return config.model.layout, float(config.model.gamma)


def teacher(algorithm: str, n_layers: int) -> Callable:
    """A builder of the teacher running `algorithm` (`teachers.build`) with the entry's truth parameters."""

    def build(entry: Entry, config):
        from . import teachers

        lay, gamma = _layout_gamma(config)
        return teachers.build(algorithm, lay, gamma, n_layers, n_actions=config.task.n_actions, **entry.truth.params)

    return build


def decoy(kind: str, n_layers: int = 2) -> Callable:
    """A builder of a `decoys` class by name (InputRidge: fitted here on 1024 training prompts of the entry's
    task drawn from its seed, to the true value of the query state)."""

    def build(entry: Entry, config):
        from . import decoys

        lay, gamma = _layout_gamma(config)
        if kind != "InputRidge":
            return getattr(decoys, kind)(lay, gamma, n_layers)
        batch = config.sample(1024, np.random.default_rng([entry.seed, 0x51D6E]))
        values = batch.tasks["values"]
        target = values[np.arange(values.shape[0]), batch.prompt.states[:, -1]]
        coef, icpt = decoys.fit_ridge(batch.prompt.z, target)
        return decoys.InputRidge(lay, gamma, coef, icpt, n_layers)

    return build


# ------------------------------------------------------------------ the table
def _table() -> list[tuple]:
    """(name, kind, family algorithm, truth algorithm, params, layers, how, task options, sets); `how`: a
    builder, or the algorithm of the teacher that builds it (None: the truth's)."""
    g, T, S, AC = LINEAR["gamma"], "td0", "batch_sarsa", "actor_critic"
    D, F = ("default", "full"), ("full",)

    def td(alpha, k, gamma=g, **more):
        return {"alpha": alpha, "gamma": gamma, **more, "steps_per_layer": k}

    return [
        ("td0_a1_k1_L3", "exact", T, "td0", td(1.0, 1), 3, None, LINEAR, D),
        ("td0_a0.5_k2_L2", "exact", T, "td0", td(0.5, 2), 2, None, LINEAR, F),
        ("td0_a0.3_k4_L2", "exact", T, "td0", td(0.3, 4), 2, None, LINEAR, F),
        # one layer of two steps: one TD(0) step from w0 = 0 *is* one step of reward regression (delta_i = r_i)
        ("td0_a1_k2_L1", "exact", T, "td0", td(1.0, 2), 1, None, LINEAR, F),
        ("td0_gamma0.5_a1_k1_L3", "exact", T, "td0", td(1.0, 1, 0.5), 3, None, LINEAR, D),
        ("td0_gamma0.7_a0.5_k2_L2", "exact", T, "td0", td(0.5, 2, 0.7), 2, None, LINEAR, F),
        ("td_lambda0.5_a1_k1_L3", "exact", T, "td_lambda_0.5", td(1.0, 1, **{"lambda": 0.5}), 3, None, LINEAR, F),
        ("mc_regression_a1_k1_L3", "exact", T, "mc_regression", td(1.0, 1), 3, None, LINEAR, F),
        ("residual_gradient_a1_k1_L3", "exact", T, "residual_gradient", td(1.0, 1), 3, None, LINEAR, F),
        ("lstd_L2", "exact", T, "lstd", {"gamma": g}, 2, None, LINEAR, F),
        # control tasks: small tabular MDPs (`tasks.SMALL_MDP`: 5 states x 3 actions, one-hot features, n 40, gamma 0.5)
        ("sarsa_a1_k1_L1", "exact", S, "batch_sarsa", td(1.0, 1, 0.5), 1, None, SMALL_MDP, F),
        ("sarsa_a0.5_k2_L2", "exact", S, "batch_sarsa", td(0.5, 2, 0.5), 2, None, SMALL_MDP, F),
        ("expected_sarsa_a1_k1_L1", "exact", S, "expected_sarsa", td(1.0, 1, 0.5), 1, None, SMALL_MDP, F),
        ("q_learning_a1_k1_L1", "exact", S, "q_learning", td(1.0, 1, 0.5), 1, None, SMALL_MDP, F),
        ("actor_critic_a1_b1_L1", "exact", AC, "actor_critic", td(1.0, 1, 0.5, beta=1.0), 1, None, SMALL_MDP, F),
        ("actor_critic_a3_b0.5_L1", "exact", AC, "actor_critic", td(3.0, 1, 0.5, beta=0.5), 1, None, SMALL_MDP, F),
        # decoys: no RL algorithm, every one correlated with one
        ("decoy_last_reward", "decoy", T, "last_reward", {}, 2, decoy("LastReward"), LINEAR, D),
        ("decoy_mean_reward", "decoy", T, "mean_reward_over_1_minus_gamma", {}, 2, decoy("MeanReward"), LINEAR, F),
        ("decoy_input_ridge", "decoy", T, "input_ridge", {}, 2, decoy("InputRidge"), LINEAR, F),
        ("decoy_discounted_sum", "decoy", T, "discounted_reward_sum", {}, 2, decoy("DiscountedSum"), LINEAR, F),
        ("decoy_nearest_reward", "decoy", T, "nearest_neighbour_reward", {}, 2, decoy("NearestReward"), LINEAR, F),
        ("decoy_immediate_reward_L2", "decoy", T, "immediate_reward", td(1.0, 1, 0.0), 2, "td0", LINEAR, D),
        ("decoy_immediate_reward_k2_L1", "decoy", T, "immediate_reward", td(0.5, 2, 0.0), 1, "td0", LINEAR, F),
        ("decoy_last_reward_short", "decoy", T, "last_reward", {}, 2, decoy("LastReward"), SHORT, F),
        ("decoy_mean_reward_short", "decoy", T, "mean_reward_over_1_minus_gamma", {}, 2, decoy("MeanReward"), SHORT, F),
        ("decoy_sarsa_immediate_reward", "decoy", S, "immediate_reward", td(1.0, 1, 0.0), 1, "batch_sarsa", SMALL_MDP,
         F),
    ]


def builtin(zoo_seed: int = 0) -> list[Entry]:
    """The exact teachers and decoys of the zoo drawn with `zoo_seed` (docs/zoo.md, "The table")."""
    out = []
    for i, (name, kind, fam, algo, params, layers, how, task, sets) in enumerate(_table()):
        params = dict(params)
        if zoo_seed:
            rng = np.random.default_rng([int(zoo_seed), i])
            for key in ("alpha", "beta"):
                if key in params:
                    params[key] = float(params[key] * np.exp(rng.uniform(-JITTER, JITTER)))
        decoy_ = kind == "decoy"
        target = 0 if layers >= 2 and algo != "lstd" else None  # LSTD's layers never read the error row
        build = how if callable(how) else teacher(how or algo, layers)
        accepted = (REWARD_REGRESSION, NONE_FITS) if decoy_ else ()
        out.append(Entry(name, kind, fam, Truth(algo, params, decoy_, target, accepted), build, dict(task), sets,
                         seed=1000 * int(zoo_seed) + i, description=_describe(kind, algo, params, layers)))
    return out


def _describe(kind: str, algo: str, params: dict, layers: int) -> str:
    p = ", ".join(f"{k} {v:.3g}" for k, v in params.items())
    return f"{kind}: {algo}" + (f" ({p})" if p else "") + f", {layers} layer{'s' if layers > 1 else ''}"


def entries(set_name: str = "default", zoo_seed: int = 0) -> list[Entry]:
    """The entries of a set (`SETS`) of the zoo drawn with `zoo_seed`: built-in ones, then the providers'."""
    if set_name not in SETS:
        raise UserError(f"--set {set_name!r}: expected one of {', '.join(SETS)}")
    if isinstance(zoo_seed, bool) or not isinstance(zoo_seed, (int, np.integer)) or zoo_seed < 0:
        raise UserError(f"--zoo-seed must be a non-negative integer, got {zoo_seed!r}")
    found = builtin(int(zoo_seed))
    for module in PROVIDERS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        provide = getattr(mod, "entries", None)
        if callable(provide):  # a provider still being written (no entries() yet) adds nothing
            found += list(provide(int(zoo_seed)))
    names = [e.name for e in found]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(f"zoo entries named twice: {', '.join(dup)}")
    bad = [e.name for e in found if e.kind not in KINDS]
    if bad:
        raise UserError(f"zoo entries of unknown kind: {', '.join(bad)}")
    return [e for e in found if set_name in e.sets]


def with_seed(entry: Entry, seed: int) -> Entry:
    """The entry with another seed (tests)."""
    return replace(entry, seed=int(seed))
