"""Command-line flags from a dataclass: its fields and their docstrings are the CLI (one source of truth).

A field `n_states: int = 10` with the docstring line under it becomes `--n-states N` with that help; a field
without a default is a required flag; `bool` fields become `--flag / --no-flag`; `tuple[float, ...]` fields
take any number of values. Field metadata: `choices` (a sequence, or a callable giving one) restricts the
values, `metavar` names the value in --help, `hidden` leaves the flag out of --help, and `flag` spells the
flag of a field whose name is kept in a file format (`AnalyzeOptions.seed` is `--split-seed`). Every flag is
one of the vocabulary's (`core.vocabulary.FLAGS`: one spelling per meaning across the commands). Only the
flags the user gives are returned, so a config file or the dataclass defaults fill the rest.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import typing
from functools import lru_cache

from . import vocabulary
from .errors import UserError


@lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """{field name: the string literal under it} over the class and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # source not available: no help text
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:] + [None]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _base_type(cls: type, f: dataclasses.Field):
    """(python type, optional, several) of a field: int, float, str or bool; `several` for tuple[T, ...]."""
    hints = typing.get_type_hints(cls)
    t = hints.get(f.name, str)
    args = [a for a in typing.get_args(t) if a is not type(None)]
    optional = len(args) < len(typing.get_args(t))
    if args and typing.get_origin(t) is not tuple:
        t = args[0]
    several = typing.get_origin(t) is tuple
    if several:
        t = typing.get_args(t)[0]
    return (t if t in (int, float, str, bool) else str), optional, several


def flag_of(f: dataclasses.Field) -> str:
    """The flag of a field: `metadata["flag"]`, else `--` and its name with dashes."""
    return f.metadata.get("flag") or f"--{f.name.replace('_', '-')}"


def flag(cls: type, name: str) -> str:
    """The flag of field `name` of dataclass `cls` (for messages)."""
    return flag_of(next(f for f in dataclasses.fields(cls) if f.name == name))


def _shown(default) -> str:
    return " ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in default) if isinstance(default, tuple) \
        else str(default)


class _Parse:
    """The argparse `type` of a field: `kind(text)`, None for "none"/"null" when optional, a one-line error
    otherwise; named as `kind` (argparse and the vocabulary test read `__name__`).

    A module-level class, not a closure made per flag: the test suite's runtime type checker (jaxtyping's
    import hook, pyproject's addopts) decorates a nested def anew each time its outer function runs, about
    1 ms per flag, and every `cli.main` builds a parser of ~500 flags (measured: 0.45 -> 0.12 s CPU per parser)."""

    def __init__(self, kind, optional: bool):
        self.kind, self.optional, self.__name__ = kind, optional, kind.__name__

    def __call__(self, text: str):
        if self.optional and text.lower() in ("none", "null"):
            return None
        try:
            return self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.kind.__name__}, got {text!r}") from None


def add_fields(parser: "argparse._ActionsContainer", cls: type, skip: tuple[str, ...] = ()) -> list[str]:
    """Add one flag per field of dataclass `cls` (default None = not given); returns the field names."""
    docs = field_docs(cls)
    names = []
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        kind, optional, several = _base_type(cls, f)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        help_text = docs.get(f.name, "")
        if not required:
            help_text = f"{help_text} (default: {_shown(default)})" if help_text else f"default: {_shown(default)}"
        help_text = argparse.SUPPRESS if f.metadata.get("hidden") else help_text.replace("%", "%%")
        name = flag_of(f)
        if kind is bool:
            parser.add_argument(name, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                                required=required, help=help_text)
        else:
            choices = f.metadata.get("choices")  # a sequence, or a callable giving one (e.g. registry.names)
            choices = list(choices() if callable(choices) else choices) if choices is not None else None
            metavar = f.metadata.get("metavar") or (name[2:].upper().replace("-", "_") if choices is None else None)
            parser.add_argument(name, dest=f.name, type=_Parse(kind, optional), default=None, choices=choices,
                                nargs="*" if several else None, required=required, metavar=metavar, help=help_text)
        names.append(f.name)
    return names


def given(args: argparse.Namespace, names: list[str]) -> dict:
    """The fields the user gave on the command line (several values as a tuple)."""
    values = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    return {n: tuple(v) if isinstance(v, list) else v for n, v in values.items()}


def build(cls: type, values: dict):
    """`cls(**values)` with a one-line error for a bad value (old option names of the vocabulary are read, with
    a DeprecationWarning)."""
    values = vocabulary.current_options(values, {f.name for f in dataclasses.fields(cls)})
    try:
        return cls(**values)
    except TypeError as e:
        raise UserError(f"invalid options for {cls.__name__}: {e}") from None


def parsed(args: argparse.Namespace, cls: type):
    """The dataclass `cls` of the parsed flags: the fields the user gave, the defaults for the rest."""
    return build(cls, given(args, [f.name for f in dataclasses.fields(cls) if f.init]))


def given_flags(args: argparse.Namespace, cls: type, names=None) -> list[str]:
    """The flags of the fields `names` (default: all) of `cls` the user gave, in that order (for a message)."""
    names = [f.name for f in dataclasses.fields(cls) if f.init] if names is None else names
    return [flag(cls, n) for n in names if getattr(args, n, None) is not None]
