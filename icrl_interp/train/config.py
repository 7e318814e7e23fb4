"""Training configurations: the fields every family shares, and configs by family name.

Each family's torch half (`registry.Family.training`) subclasses `TrainConfig` with its own fields
and the papers' defaults (e.g. `families.sarsa_training.SarsaTrainConfig`). A config is plain data
(JSON round trip through `to_dict` / `config_from_dict`); the trainer stores it as `config.json` in
the run directory, so a run can be re-made or resumed from that file alone. This module is light
(no torch); `config_for` imports the family's torch half.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from ..core.errors import UserError, check
from ..families import registry
from .recipe import recipe, training_families

MAX_SEED = 2**63 - 1
"""The largest seed: torch.Generator.manual_seed takes at most 2**64 - 1, and a checkpoint's seed is
stored as a signed 64-bit integer (HDF5 attributes of its recordings)."""


@dataclass
class TrainConfig:
    """Fields shared by every family (the optimizer, schedule, run bookkeeping)."""

    family: str = ""
    """Registered family with a training recipe (`icrl_interp.families.registry`); set by each family's subclass."""
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

    # Fields added after runs were shipped: they enter the run id (`trainer.run_id`) only when they differ
    # from their default, so the runs made before them keep their ids.
    LATE_FIELDS: ClassVar[tuple[str, ...]] = ()

    def validate(self) -> "TrainConfig":
        known = training_families()
        check(self.family in known, f"unknown training family {self.family!r} (known: {', '.join(known)})")
        for name in ("steps", "lr_decay_every", "checkpoint_every", "log_every", "eval_tasks"):
            check(int(getattr(self, name)) >= 1, f"{name} must be a positive integer, got {getattr(self, name)}")
        check(self.seed <= MAX_SEED, f"seed must be at most {MAX_SEED} (2**63 - 1), got {self.seed}")
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

    def hashed_dict(self) -> dict:
        """`to_dict()` with the fields the family renamed (`registry.Family.renamed["training"]`) under their
        old names: what run ids and sweep point names hash, so runs made before a rename keep their names."""
        old = {new: old for old, new in renamed_fields(self.family).items()}
        return {old.get(k, k): v for k, v in self.to_dict().items()}


def renamed_fields(family: str) -> dict[str, str]:
    """{old field name: new name} of a family's training config: read from older run configs, checkpoints and
    --config files, written new."""
    return registry.get(family).renamed.get("training", {}) if family in registry.names() else {}


def config_for(family: str, **overrides) -> TrainConfig:
    """The default config of a family with `overrides` applied (unknown keys are an error)."""
    cls = recipe(family).config_class
    overrides = registry.current_keys(overrides, renamed_fields(family))
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - set(types))
    check(not unknown, f"unknown {family} training option(s): {', '.join(unknown)}")
    check(overrides.get("family", family) == family, f"config family {overrides.get('family')!r} does not match {family!r}")
    values = {k: _coerce(k, v, types[k]) for k, v in overrides.items() if k != "family"}
    return cls(**values).validate()


def config_classes() -> dict[str, type[TrainConfig]]:
    """{family: its TrainConfig subclass} for every family with a training recipe (imports them all)."""
    return {family: recipe(family).config_class for family in training_families()}


def config_from_dict(data: dict) -> TrainConfig:
    """Rebuild a config from its `to_dict()` form (e.g. a run's config.json)."""
    check(isinstance(data, dict) and "family" in data, "a training config must be a JSON object with a 'family' field")
    data = dict(data)
    return config_for(data.pop("family"), **data)


def _coerce(name: str, value, kind: str):
    """Cast a JSON/CLI value to the declared field type (int/float/bool/str, or one of them | None), with a clear error."""
    if kind.endswith(" | None"):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        kind = kind[: -len(" | None")]
    try:
        if kind == "bool":
            if isinstance(value, str):
                check(value.lower() in ("true", "false", "1", "0"), f"{name} must be true or false, got {value!r}")
                return value.lower() in ("true", "1")
            check(isinstance(value, (bool, int)) and value in (0, 1), f"{name} must be true or false, got {value!r}")
            return bool(value)
        if kind == "int":
            if isinstance(value, int) and not isinstance(value, bool):
                return value  # exact: float() would round integers beyond 2**53
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
