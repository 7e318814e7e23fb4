"""`icrl-interp construct FAMILY --out DIR`: write a theta* checkpoint.

Each family's flags are the fields of its construct-options dataclass (`Family.construct`),
with the field docstrings as help: `icrl-interp construct FAMILY --help` lists them.
"""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..families import registry
    from ..core.cli_fields import add_fields

    sub = p.add_subparsers(dest="family", metavar="FAMILY", required=True)
    for name in registry.where(lambda f: f.construct is not None and f.theta_star is not None):
        fam = registry.get(name)
        q = sub.add_parser(name, help=fam.summary, description=(fam.construct.__doc__ or fam.summary).strip())
        q.add_argument("--out", required=True, help="checkpoint directory to create")
        q.add_argument("--seed", type=int, default=0, help="seed recorded for task sampling downstream")
        q.add_argument("--force", action="store_true", help="replace an existing checkpoint directory")
        q.set_defaults(_fields=add_fields(q, fam.construct))


def run(args) -> int:
    from ..models import checkpoint
    from ..core.cli_fields import given
    from ..models.construct import construct
    from ..core.errors import UserError
    from ..core.outputs import output_dir

    if args.seed < 0:
        raise UserError(f"--seed must be a non-negative integer, got {args.seed}")
    output_dir(args.out, "--out", replaces=True, force=args.force)
    out = construct(args.family, given(args, args._fields), args.out, seed=args.seed, overwrite=args.force)
    print(f"wrote theta* {args.family} checkpoint {out} (sha256 {checkpoint.sha256(out)[:16]})")
    return 0
