"""The `icrl-interp` console script.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`run(args) -> int`; heavy imports (torch, transformer_lens) stay inside `run`
so that `--help` is instant. Every flag is one of `core.vocabulary.FLAGS`, and the old spellings of
`core.vocabulary.RENAMED` are refused in one line naming the new one. A `UserError` prints as one line and exits 2, and so does an
`OSError` (a permission, a full disk: the environment, not a bug) or running out of memory.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ._version import __version__
from .core import vocabulary
from .core.errors import UserError, one_line

# name -> (module, one-line help). Add a line here when a command lands.
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": ("icrl_interp.commands.envs", "sample tasks and print their exact values (a quick sanity check)"),
    "construct": ("icrl_interp.commands.construct", "write a theta* checkpoint of a construction"),
    "inspect": ("icrl_interp.commands.inspect", "print a checkpoint's config and parameter shapes / norms"),
    "demo": ("icrl_interp.commands.demo", "end-to-end demo on embedded defaults: theta* + shipped checkpoints -> report"),
    "record": ("icrl_interp.commands.record", "record a checkpoint's hooked activations into an HDF5 file"),
    "analyze": ("icrl_interp.commands.analyze", "analyze checkpoints / recordings: block sparsity, manifold, kernel, TD probes, convergence"),
    "report": ("icrl_interp.commands.report", "analyze many checkpoints / recordings / runs into an HTML report"),
    "train": ("icrl_interp.commands.train", "pretrain a model of a family into a resumable run directory"),
    "sweep": ("icrl_interp.commands.sweep", "train a TOML grid of configs x seeds (resumable runs), then report over them"),
    "control": ("icrl_interp.commands.control", "in-context control on held-out MDPs: random / teacher / transformer / oracle returns"),
    "causal": ("icrl_interp.commands.causal", "erase / steer the TD-error direction at a layer against random directions: its causal effect on the output"),
    "verdict": ("icrl_interp.commands.verdict", "which candidate RL algorithm (TD(0), TD(lambda), Monte Carlo, LSTD, SARSA, Q-learning, ...) a model runs: behaviour, probes, causal erasure per layer"),
    "zoo": ("icrl_interp.commands.zoo", "models with known answers (exact teachers, trained mimics, decoys) judged by the verdict and the causal test: zoo.json + confusion matrix"),
    "collect": ("icrl_interp.commands.collect", "learning histories of a source agent (random, Q-learning, SARSA, ...) in a Gymnasium environment, as an episodes file"),
}


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: 'icrl-interp CMD: error: ... (see --help)', exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
        _refuse_renamed(p, name)
    return parser


def _refuse_renamed(parser: argparse.ArgumentParser, command: str) -> None:
    """The old spellings of `core.vocabulary.RENAMED` refused by `command` and its sub-commands (one line each)."""
    vocabulary.refuse_renamed(parser, command)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                _refuse_renamed(child, f"{command} {name}")


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()  # loads the family registry: a broken family module is a user error
    except UserError as e:
        print(f"icrl-interp: error: {e}", file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error already printed as one line
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    def fail(message: str) -> int:
        print(f"icrl-interp {args.command}: error: {' '.join(message.split())}", file=sys.stderr)
        return 2

    try:
        return int(args._run(args) or 0)
    except UserError as e:
        return fail(str(e))
    except OSError as e:
        return fail(f"{e.filename}: {e.strerror or one_line(e)}" if e.filename else one_line(e))
    except MemoryError as e:
        return fail(f"out of memory ({one_line(e)}); use smaller sizes")
    except KeyboardInterrupt:
        print(f"icrl-interp {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
