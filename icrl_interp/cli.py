"""The `icrl-interp` console script.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`run(args) -> int`; heavy imports (torch, transformer_lens) stay inside `run`
so that `--help` is instant. A `UserError` prints as one line and exits 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ._version import __version__
from .errors import UserError

# name -> (module, one-line help). Add a line here when a command lands.
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": ("icrl_interp.commands.envs", "sample tasks and print their exact values (a quick sanity check)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="icrl-interp",
        description="Mechanistic interpretability for in-context reinforcement learning in transformers.",
    )
    parser.add_argument("--version", action="version", version=f"icrl-interp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(module)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UserError as e:
        print(f"icrl-interp {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"icrl-interp {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
