"""Write theta* checkpoints from a family's construct options (what `icrl-interp construct` and the demo run)."""
from __future__ import annotations

from pathlib import Path

from . import checkpoint, registry
from .cli_fields import build
from .errors import UserError


def options(family: str, values: dict | None = None):
    """The family's construct options (its `Family.construct` dataclass) with `values` applied."""
    fam = registry.get(family)
    if fam.construct is None or fam.theta_star is None:
        raise UserError(f"family {family!r} has no theta* construction")
    return build(fam.construct, dict(values or {}))


def construct(family: str, values: dict | None, out, *, seed: int | None = 0, overwrite: bool = False) -> Path:
    """Build theta* of `family` with construct options `values` and save it as a checkpoint at `out`."""
    from .models import theta_star_model

    plan = options(family, values).plan()
    model = theta_star_model(family, **plan.model, **plan.constants)
    return checkpoint.save(model, {"task": plan.task, "origin": model.origin, "seed": seed}, out, overwrite=overwrite)
