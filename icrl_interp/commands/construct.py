"""`icrl-interp construct FAMILY --out DIR`: write a theta* checkpoint.

Each family's flags are the fields of its construct-options dataclass (`Family.construct`),
with the field docstrings as help: `icrl-interp construct FAMILY --help` lists them.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..core.cli_fields import add_fields, given, parsed


@dataclass
class ConstructOutput:
    """Where the checkpoint goes."""

    out: str = field(metadata={"metavar": "DIR"})
    """Checkpoint directory to create."""
    prompt_seed: int = 0
    """Seed of the task sampler, recorded in the checkpoint's config (its `seed`) for task sampling downstream."""
    force: bool = False
    """Replace an existing checkpoint directory."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..families import registry

    sub = p.add_subparsers(dest="family", metavar="FAMILY", required=True)
    for name in registry.where(lambda f: f.construct is not None and f.theta_star is not None):
        fam = registry.get(name)
        q = sub.add_parser(name, help=fam.summary, description=(fam.construct.__doc__ or fam.summary).strip())
        add_fields(q, ConstructOutput)
        q.set_defaults(_fields=add_fields(q, fam.construct))


def run(args) -> int:
    from ..core.errors import UserError
    from ..core.outputs import output_dir
    from ..models import checkpoint
    from ..models.construct import construct

    o = parsed(args, ConstructOutput)
    if o.prompt_seed < 0:
        raise UserError(f"--prompt-seed must be a non-negative integer, got {o.prompt_seed}")
    output_dir(o.out, "--out", replaces=True, force=o.force)
    out = construct(args.family, given(args, args._fields), o.out, seed=o.prompt_seed, overwrite=o.force)
    print(f"wrote theta* {args.family} checkpoint {out} (sha256 {checkpoint.sha256(out)[:16]})")
    return 0
