"""`icrl-interp train FAMILY --out RUN_DIR`: pretrain a model (resumes if RUN_DIR holds the same run).

One sub-command per family with a training recipe (`icrl_interp.train.recipe`); its flags are the
fields of the family's TrainConfig (help = the field docstrings, `cli_fields.add_fields`) plus the
general flags below, so a flag of another family is refused by argparse (abbreviated flags are not
accepted, so one family's flag can never be taken for a prefix of another field's). A family's flags are added
when its sub-command is used (or its --help shown): building the CLI imports no torch.
"""
from __future__ import annotations

import argparse
import dataclasses
import json

from ..cli_fields import add_fields, given

SKIP = ("family",)
"""Config fields that are not flags (the family is the sub-command)."""


def _general(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="run directory (resumed if it holds the same config)")
    p.add_argument("--config", help="JSON file with config fields (flags override it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation at the end")
    p.add_argument("--export", metavar="DIR", help="after training, copy the final checkpoint + metrics + config to DIR")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: fastest for these tiny matmuls)")


class FamilyParser(argparse.ArgumentParser):
    """A family's sub-parser: its config flags are added on first use (parsing, help or usage)."""

    family: str | None = None
    """The family whose TrainConfig fields become flags (set right after the parser is made)."""
    _filled = False

    def fill(self) -> "FamilyParser":
        if not self._filled and self.family is not None:
            self._filled = True
            from ..train.recipe import recipe

            r = recipe(self.family)
            add_fields(self, r.config_class, skip=SKIP, aliases=r.aliases)
        return self

    def parse_known_args(self, args=None, namespace=None):
        self.fill()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.fill()
        return super().format_help()

    def format_usage(self) -> str:
        self.fill()
        return super().format_usage()


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .. import registry
    from ..train.recipe import training_families

    sub = p.add_subparsers(dest="family", metavar="FAMILY", required=True, parser_class=FamilyParser,
                           help="model family to train")
    for name in training_families():
        summary = registry.get(name).summary
        # no abbreviations: '--d' of one family must not silently become another family's '--dtype'
        fp = sub.add_parser(name, help=summary, description=f"Train a model of family {name}: {summary}.", allow_abbrev=False)
        fp.family = name
        _general(fp)


def config_from_args(args):
    """The TrainConfig of the parsed arguments: --config file, then the flags given."""
    from ..errors import UserError
    from ..train import config_for
    from ..train.recipe import recipe

    overrides = {}
    if args.config:
        try:
            with open(args.config) as f:
                overrides = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"cannot read config file {args.config}: {e}") from None
        if not isinstance(overrides, dict):
            raise UserError(f"config file {args.config} must hold a JSON object")
        if overrides.pop("family", args.family) != args.family:
            raise UserError(f"config file {args.config} is for another family than {args.family}")
        overrides.pop("run_id", None)
    names = [f.name for f in dataclasses.fields(recipe(args.family).config_class) if f.name not in SKIP]
    overrides.update(given(args, names))
    return config_for(args.family, **overrides)


def run(args) -> int:
    from ..train import train

    cfg = config_from_args(args)
    result = train(cfg, args.out, progress=not args.no_progress, evaluate=not args.no_eval, threads=args.threads)
    if result.resumed_from:
        print(f"resumed from step {result.resumed_from}")
    print(f"run directory: {result.run_dir}")
    if result.final_metrics:
        print(json.dumps(result.final_metrics, indent=1))
    if args.export:
        from ..train.trainer import export_final

        print(f"exported to {export_final(result.run_dir, args.export)}")
    return 0
