"""Write theta* checkpoints from a family's construct options (what `icrl-interp construct` and the demo run), and
the task configs a model of any kind is recorded or tested on (`task_config`, `task_of`)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..core.cli_fields import build
from ..core.errors import UserError
from ..core.outputs import check_finite, check_fits
from ..families import registry
from . import checkpoint

LAYER_OVERHEAD = 32 * 2**10
"""Bytes a layer costs besides its parameters (its torch module objects; measured ~22 KiB)."""


def options(family: str, values: dict | None = None):
    """The family's construct options (its `Family.construct` dataclass) with `values` applied."""
    fam = registry.get(family)
    if fam.construct is None or fam.theta_star is None:
        raise UserError(f"family {family!r} has no theta* construction")
    opts = build(fam.construct, dict(values or {}))
    check_finite(opts)
    for f in dataclasses.fields(opts):
        value = getattr(opts, f.name)
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise UserError(f"--{f.name.replace('_', '-')} must be non-negative, got {value}")
    return opts


def _model_config(family: str, model: dict):
    from .config import ModelConfig

    return ModelConfig(family=family, **{k: v for k, v in model.items() if k in ModelConfig.field_names()})


def check_size(family: str, values: dict | None) -> None:
    """Refuse construct options whose parameters do not fit in memory (before anything is built)."""
    values = dict(values or {})
    opts = options(family, values)
    _model_config(family, opts.plan().model)  # its own errors first
    names = {"d": "--d", "n_layers": "--n-layers", "n_states": "--n-states", "n_actions": "--n-actions",
             "features": "--features"}
    sizes = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts) if f.name in names}
    sizes = {k: v for k, v in sizes.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 1}

    def estimate(s: dict) -> int:
        try:
            cfg = _model_config(family, options(family, {**values, **s}).plan().model)
        except UserError:  # e.g. d tied to states: the other sizes decide
            return 2**200
        params = cfg.parameter_count()
        # float64 theta* matrices, their torch copies and the saved copy; each layer's module objects
        return 4 * 8 * params + LAYER_OVERHEAD * cfg.n_layers

    check_fits(estimate, sizes, {k: names[k] for k in sizes}, "the parameters of theta*")


def construct(family: str, values: dict | None, out, *, seed: int | None = 0, overwrite: bool = False) -> Path:
    """Build theta* of `family` with construct options `values` and save it as a checkpoint at `out`."""
    plan = options(family, values).plan()
    check_size(family, values)
    from . import theta_star_model  # torch: only once the options are known to be good

    with np.errstate(all="ignore"):  # an overflow becomes a NaN / Inf tensor, refused by checkpoint.save
        model = theta_star_model(family, **plan.model, **plan.constants)
    return checkpoint.save(model, {"task": plan.task, "origin": model.origin, "seed": seed}, out, overwrite=overwrite)


def task_config(family: str, values: dict | None = None, *, seed: int | None = 0):
    """The task of `family` with construct options `values`, as a checkpoint config without weights.

    This is how a model that is not one of the package's (a TransformerLens model, a plain PyTorch
    module) is recorded on a family's prompts: the options are those of `icrl-interp construct FAMILY`
    (dimensions, context length n, n_states, features, gamma, ...); `n_layers` is the number of steps of
    the reference algorithm that are recorded beside the activations. The config's `sample`, `reference` and
    `model.layout` give the prompts, their task data and the reference run (docs/byom.md).
    """
    from ..tasks.sampling import TaskSpec
    from .config import CheckpointConfig, ModelConfig

    plan = options(family, values).plan()
    fam = registry.get(family)
    model = ModelConfig(family=fam.name, **{k: v for k, v in plan.model.items() if k in ModelConfig.field_names()})
    task = TaskSpec.from_dict(plan.task, fam.name, fam.task_kind)
    return CheckpointConfig(model=model, task=task, origin={"kind": "task", **plan.constants}, seed=seed)


def task_of(task, options: dict | None = None):
    """The checkpoint config of a task given as a family name (+ its construct options: `task_config`), a
    checkpoint directory (its config) or a CheckpointConfig (itself)."""
    from .config import CheckpointConfig

    if isinstance(task, CheckpointConfig):
        if options:
            raise UserError("task options go with a family name, not with a checkpoint config")
        return task
    if isinstance(task, str) and registry.find(task) is not None:
        return task_config(task, options)
    if isinstance(task, (str, Path)) and Path(task).is_dir():
        if options:
            raise UserError("task options go with a family name, not with a checkpoint directory")
        return checkpoint.read(task)[0]
    raise UserError(f"task {task!r} is neither a registered family ({', '.join(registry.names())}) nor a checkpoint "
                    f"directory")
