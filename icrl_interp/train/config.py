"""Training configurations: one @dataclass per model family, with the papers' defaults.

A config is plain data (JSON round trip through `to_dict` / `config_from_dict`);
the trainer stores it as `config.json` in the run directory, so a run can be
re-made or resumed from that file alone.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import UserError, check

TRAIN_FAMILIES = ("linear-td", "softmax-td", "sarsa", "actor-critic")


@dataclass
class TrainConfig:
    """Fields shared by every family (the optimizer, schedule, run bookkeeping)."""

    family: str = ""
    """Model family: 'linear-td', 'softmax-td' or 'sarsa'."""
    steps: int = 1000
    """Number of optimizer (Adam) steps."""
    seed: int = 0
    """Seeds the model init (torch.Generator) and the task stream (numpy Generator per step)."""
    lr: float = 1e-3
    """Adam learning rate at step 0."""
    lr_decay: float = 1.0
    """Multiply the learning rate by this factor every `lr_decay_every` steps (1.0 = constant)."""
    lr_decay_every: int = 1
    """Period of the step decay, in optimizer steps."""
    weight_decay: float = 0.0
    """Adam's (L2) weight decay."""
    init_gain: float = 0.1
    """Xavier-normal gain of the trainable matrices at init."""
    dtype: str = "float32"
    """Parameter and prompt dtype: 'float32' or 'float64'."""
    checkpoint_every: int = 100
    """Write a checkpoint (and the resume state) every this many steps; the last step always gets one."""
    log_every: int = 10
    """Append a metrics.jsonl line every this many steps."""
    eval_tasks: int = 64
    """Held-out tasks for the final evaluation (drawn from a seed disjoint from training)."""

    def validate(self) -> "TrainConfig":
        check(self.family in TRAIN_FAMILIES, f"unknown training family {self.family!r} (known: {', '.join(TRAIN_FAMILIES)})")
        for name in ("steps", "lr_decay_every", "checkpoint_every", "log_every", "eval_tasks"):
            check(int(getattr(self, name)) >= 1, f"{name} must be a positive integer, got {getattr(self, name)}")
        check(self.lr > 0, f"lr must be positive, got {self.lr}")
        check(0 < self.lr_decay <= 1, f"lr_decay must lie in (0, 1], got {self.lr_decay}")
        check(self.weight_decay >= 0, f"weight_decay must be non-negative, got {self.weight_decay}")
        check(self.init_gain > 0, f"init_gain must be positive, got {self.init_gain}")
        check(self.dtype in ("float32", "float64"), f"dtype must be 'float32' or 'float64', got {self.dtype!r}")
        check(0 <= getattr(self, "gamma", 0.0) < 1, f"gamma must lie in [0, 1), got {getattr(self, 'gamma', None)}")
        return self

    def lr_at(self, step: int) -> float:
        """Learning rate used for optimizer step `step` (0-based)."""
        return self.lr * self.lr_decay ** (step // self.lr_decay_every)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class LinearTDTrainConfig(TrainConfig):
    """Wang et al. (c): linear-attention TD transformer on randomized Boyan chains.

    One optimizer step draws `tasks_per_step` chains, `trajectories_per_task` fresh
    trajectories of each, and slides the (n+1)-column window `windows` times along
    each trajectory; (c) uses one task and one trajectory per step (64 windows, 5
    steps per task, 4000 tasks, lr 1e-3), we batch many tasks per step.
    """

    family: str = "linear-td"
    d: int = 4
    """Feature dimension (features U(-1, 1)^{states x d}, fresh per task)."""
    n_states: int = 10
    """Boyan chain size."""
    n: int = 30
    """Context length (transition columns per prompt)."""
    n_layers: int = 3
    """Transformer depth L."""
    gamma: float = 0.9
    """Discount factor."""
    tied: bool = True
    """Share (P, Q) across layers ((c)'s 'auto' mode)."""
    windows: int = 64
    """TD errors per trajectory: windows t = 0..windows (the last one only provides a target)."""
    trajectories_per_task: int = 5
    """Independent trajectories (optimizer 'batches' in (c)) per task."""
    tasks_per_step: int = 16
    """Tasks per optimizer step (all their windows in one forward pass)."""
    objective: str = "mstde"
    """'mstde' (semi-gradient squared TD error over sliding windows, (c)) or 'msve' (squared error to true values)."""
    steps: int = 250
    lr: float = 1e-2
    weight_decay: float = 1e-6
    checkpoint_every: int = 25

    def validate(self) -> "LinearTDTrainConfig":
        super().validate()
        check(self.objective in ("mstde", "msve"), f"linear-td objective must be 'mstde' or 'msve', got {self.objective!r}")
        for name in ("d", "n", "n_layers", "windows", "trajectories_per_task", "tasks_per_step"):
            check(int(getattr(self, name)) >= 1, f"{name} must be a positive integer, got {getattr(self, name)}")
        check(self.n_states >= 3, f"a Boyan chain needs at least 3 states, got n_states={self.n_states}")
        return self


@dataclass
class SoftmaxTDTrainConfig(TrainConfig):
    """Xie et al. (a): softmax ICTD transformer on randomized Boyan chains with one-hot x beta features.

    The trainable parameters are the full (A_l, V_l) unless `masks` is set, in which
    case only the paper's sparsity pattern trains (A's x-x block and V's value row
    over (R, target, current)); everything outside the mask is zero and stays so.
    """

    family: str = "softmax-td"
    n_states: int = 5
    """Boyan chain size; d = n_states with one-hot features."""
    beta: float = 1.0
    """Feature scale: x(s) = beta e_s (the kernel sharpness is beta^2 times A's scale)."""
    n: int = 40
    """Context length (columns 1..n hold S_{k-1}, R_k; column n+1 is the query)."""
    n_layers: int = 6
    """Transformer depth L."""
    gamma: float = 0.9
    """Discount factor."""
    tied: bool = True
    """One (A, V) shared by all layers."""
    form: str = "tsm"
    """'tsm' (single head + temporal shift module) or 'dual' (two heads)."""
    objective: str = "neu"
    """'neu' (norm of the expected update, project definition) or 'td' (semi-gradient expected TD error)."""
    masks: bool = True
    """Train only inside the paper's fixed sparsity masks (App. F.2)."""
    batch: int = 64
    """Tasks per optimizer step."""
    steps: int = 1000
    lr: float = 1e-2

    def validate(self) -> "SoftmaxTDTrainConfig":
        super().validate()
        check(self.objective in ("neu", "td"), f"softmax-td objective must be 'neu' or 'td', got {self.objective!r}")
        check(self.form in ("tsm", "dual"), f"form must be 'tsm' or 'dual', got {self.form!r}")
        for name in ("n", "n_layers", "batch"):
            check(int(getattr(self, name)) >= 1, f"{name} must be a positive integer, got {getattr(self, name)}")
        check(self.n_states >= 3, f"a Boyan chain needs at least 3 states, got n_states={self.n_states}")
        check(self.beta > 0, f"beta must be positive, got {self.beta}")
        return self


@dataclass
class SarsaTrainConfig(TrainConfig):
    """Liang & Lai (b): one LSA layer mimicking the batch SARSA update on random tabular MDPs."""

    family: str = "sarsa"
    n_states: int = 9
    """States of each random MDP."""
    n_actions: int = 4
    """Actions; d = n_states * n_actions (state-action one-hot features)."""
    gamma: float = 0.5
    """Discount factor."""
    n: int = 64
    """Context length (transitions per prompt)."""
    alpha: float = 1.0
    """Step of the teacher update w_SARSA = w + (alpha/n) sum_i delta_i phi_i."""
    w_std: float = 0.5
    """Parameters in the prompt: w ~ N(0, w_std^2 I)."""
    epsilon: float = 1.0
    """Behaviour policy: epsilon-greedy on Q_w(s, a) = w . phi(s, a) (1.0 = uniform random)."""
    concentration: float = 1.0
    """Dirichlet concentration of the transition rows."""
    batch: int = 256
    """MDPs (prompts) per optimizer step."""
    lazy_ablation: bool = False
    """Ablation: Xavier-initialise the lazy blocks P22 and V22 too (the paper zero-initialises them)."""
    span_projection: bool = False
    """Project each Adam update of P's transition rows and V's transition columns onto the span of the
    prompts' transition columns (icrl_interp.train.span), so, as under gradient descent, nothing moves along
    the direction u = [1; -1/gamma 1; 0] that one-hot features never excite (sarsa only)."""
    steps: int = 3000
    lr: float = 1e-3
    lr_decay: float = 0.99
    lr_decay_every: int = 10

    def validate(self) -> "SarsaTrainConfig":
        super().validate()
        for name in ("n_states", "n_actions", "n", "batch"):
            check(int(getattr(self, name)) >= 1, f"{name} must be a positive integer, got {getattr(self, name)}")
        check(self.w_std >= 0, f"w_std must be non-negative, got {self.w_std}")
        check(0 <= self.epsilon <= 1, f"epsilon must lie in [0, 1], got {self.epsilon}")
        check(self.concentration > 0, f"concentration must be positive, got {self.concentration}")
        check(not self.span_projection or self.family == "sarsa", f"span_projection is implemented for sarsa only, not {self.family}")
        return self


@dataclass
class ActorCriticTrainConfig(SarsaTrainConfig):
    """Liang & Lai (b), Thm 3.3: one LSA layer mimicking the batch actor-critic step (icrl_interp.actor_critic).

    Prompts carry w ~ N(0, w_std^2 I) and lam ~ N(0, lam_std^2 I); the behaviour policy is pi_lam
    (tabular softmax, m = d), so `epsilon` is unused. The target is [w'; lam'].
    """

    family: str = "actor-critic"
    alpha: float = 1.0
    """Actor step: lam' = lam + (alpha/n) sum_i gamma^i delta_i g_i."""
    beta: float = 1.0
    """Critic step: w' = w + (beta/n) sum_i delta_i phi_i."""
    lam_std: float = 0.5
    """Policy parameters in the prompt: lam ~ N(0, lam_std^2 I)."""

    def validate(self) -> "ActorCriticTrainConfig":
        super().validate()
        check(self.lam_std >= 0, f"lam_std must be non-negative, got {self.lam_std}")
        return self


CONFIG_CLASSES: dict[str, type[TrainConfig]] = {
    "linear-td": LinearTDTrainConfig,
    "softmax-td": SoftmaxTDTrainConfig,
    "sarsa": SarsaTrainConfig,
    "actor-critic": ActorCriticTrainConfig,
}


def config_for(family: str, **overrides) -> TrainConfig:
    """The default config of a family with `overrides` applied (unknown keys are an error)."""
    cls = CONFIG_CLASSES.get(family)
    if cls is None:
        raise UserError(f"unknown training family {family!r} (known: {', '.join(TRAIN_FAMILIES)})")
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - set(types))
    check(not unknown, f"unknown {family} training option(s): {', '.join(unknown)}")
    check(overrides.get("family", family) == family, f"config family {overrides.get('family')!r} does not match {family!r}")
    values = {k: _coerce(k, v, types[k]) for k, v in overrides.items() if k != "family"}
    return cls(**values).validate()


def config_from_dict(data: dict) -> TrainConfig:
    """Rebuild a config from its `to_dict()` form (e.g. a run's config.json)."""
    check(isinstance(data, dict) and "family" in data, "a training config must be a JSON object with a 'family' field")
    data = dict(data)
    return config_for(data.pop("family"), **data)


def _coerce(name: str, value, kind: str):
    """Cast a JSON/CLI value to the declared field type (int/float/bool/str), with a clear error."""
    try:
        if kind == "bool":
            if isinstance(value, str):
                check(value.lower() in ("true", "false", "1", "0"), f"{name} must be true or false, got {value!r}")
                return value.lower() in ("true", "1")
            check(isinstance(value, (bool, int)) and value in (0, 1), f"{name} must be true or false, got {value!r}")
            return bool(value)
        if kind == "int":
            check(not isinstance(value, bool) and float(value) == int(float(value)), f"{name} must be an integer, got {value!r}")
            return int(float(value))
        if kind == "float":
            check(not isinstance(value, bool), f"{name} must be a number, got {value!r}")
            return float(value)
        return str(value)
    except UserError:
        raise
    except (TypeError, ValueError):
        raise UserError(f"{name} has an invalid value {value!r} (expected {kind})") from None
