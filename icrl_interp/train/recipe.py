"""The torch half of a family: everything the generic trainer asks a family, as one `Recipe`.

A family's home names its torch half by module path (`registry.Family.training`); that module
defines the family's `TrainConfig` subclass and `TRAINING = Recipe(...)`. The trainer, the
trend plots and the `icrl-interp train` command look the recipe up here and never compare
family names. This module is light (no torch): looking a recipe up imports the family's
torch half, nothing else does.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.errors import UserError
from ..families import registry

def no_masks(model, cfg, generator) -> dict:
    """`adjust_init` of a family that keeps `models.build_model`'s init as it is."""
    return {}


def no_extras(model, cfg) -> dict:
    """`log_extras` of a family without per-log-line diagnostics."""
    return {}


def no_lines(cfg) -> list:
    """`Trends.lines` of a family without reference lines."""
    return []


@dataclass(frozen=True)
class Trends:
    """How `python -m icrl_interp.train.trends` plots a family's held-out metrics over checkpoints."""

    series: Callable[[list[dict]], dict[str, list[float]]]
    """series(rows) -> {curve label: one value per checkpoint}; `rows` are the family's `evaluate`
    results (plus 'step'), one per checkpoint, in step order."""
    log_scale: bool = False
    """Plot the metrics on a log axis (values are clipped at 1e-16)."""
    lines: Callable[[Any], list[tuple[float, str]]] = no_lines
    """lines(cfg) -> [(y, label)]: horizontal reference lines (targets, thresholds)."""


@dataclass(frozen=True)
class Recipe:
    """What training a family takes: its config, model, task stream, losses, init and evaluation."""

    config_class: type
    """The family's `train.config.TrainConfig` subclass; its fields and their docstrings are the
    `icrl-interp train FAMILY` flags and the run's config.json."""
    model_config: Callable[[Any], Any]
    """model_config(cfg) -> the `models.ModelConfig` the config trains."""
    task: Callable[[Any], dict]
    """task(cfg) -> the checkpoints' `task` (keys of `sampling.TaskSpec`, 'family' included)."""
    batch: Callable[..., Any]
    """batch(cfg, rng, size=None) -> one training batch (torch tensors in cfg.dtype) drawn from the
    numpy Generator `rng`; `size` overrides the config's tasks per step (held-out sets use it)."""
    objectives: dict[str, Callable[[Any, Any], Any]]
    """{name: loss(model, batch) -> scalar tensor}. A config's `objective` field picks one; the first is
    the default and the only one used by configs without an `objective` field."""
    evaluate: Callable[[Any, Any, Any], dict]
    """evaluate(model, cfg, rng) -> held-out metrics (JSON-able) of a model, on tasks drawn from `rng`."""
    trends: Trends
    """How the held-out metrics are plotted over a run's checkpoints."""
    adjust_init: Callable[[Any, Any, Any], dict] = no_masks
    """adjust_init(model, cfg, torch_generator) -> {parameter name: 0/1 gradient mask}: changes to
    `models.build_model`'s init (drawing from the same generator) and the entries kept at zero."""
    log_extras: Callable[[Any, Any], dict] = no_extras
    """log_extras(model, cfg) -> cheap diagnostics added to each metrics.jsonl line."""
    update_constraint: Callable[[Any, Any], Any] | None = None
    """update_constraint(model, cfg) -> None, or fix(named_parameters, before) that rewrites each
    optimizer update in place (`before`: the parameters before the step)."""

    def objective(self, cfg) -> Callable[[Any, Any], Any]:
        """The loss a config selects (its `objective` field, else the first objective)."""
        name = getattr(cfg, "objective", None)
        if name is None:
            return next(iter(self.objectives.values()))
        if name not in self.objectives:
            raise UserError(f"{cfg.family} objective must be one of {', '.join(map(repr, self.objectives))}, got {name!r}")
        return self.objectives[name]


def training_families() -> list[str]:
    """Registered families that have a training recipe, in registration order."""
    return registry.where(lambda f: f.training is not None)


def recipe(family: str) -> Recipe:
    """The training recipe of `family` (imports its torch half); a one-line UserError if it has none."""
    known = training_families()
    if family not in known:
        raise UserError(f"unknown training family {family!r} (known: {', '.join(known)})")
    return registry.get(family).training_half()


def recipe_of(cfg) -> Recipe:
    """The recipe of a training config (by its `family` field)."""
    return recipe(cfg.family)
