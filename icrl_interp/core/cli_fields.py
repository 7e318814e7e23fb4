"""Command-line flags from a dataclass: its fields and their docstrings are the CLI (one source of truth).

A field `n_states: int = 10` with the docstring line under it becomes `--n-states N` with that help;
`bool` fields become `--flag / --no-flag`; `field(metadata={"choices": seq_or_callable})` restricts values. Only flags the user gives are returned, so a config file
or the dataclass defaults fill the rest. Aliases keep older flag spellings working.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import typing
from functools import lru_cache

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
    """(python type, optional) of a field: int, float, str or bool."""
    hints = typing.get_type_hints(cls)
    t = hints.get(f.name, str)
    args = [a for a in typing.get_args(t) if a is not type(None)]
    optional = len(args) < len(typing.get_args(t))
    if args:
        t = args[0]
    return (t if t in (int, float, str, bool) else str), optional


def _parse(kind, optional: bool):
    def parse(text: str):
        if optional and text.lower() in ("none", "null"):
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
    parse.__name__ = kind.__name__
    return parse


def add_fields(parser: "argparse._ActionsContainer", cls: type, skip: tuple[str, ...] = (),
               aliases: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """Add one flag per field of dataclass `cls` (default None = not given); returns the field names."""
    docs, aliases = field_docs(cls), aliases or {}
    names = []
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        kind, optional = _base_type(cls, f)
        flags = [f"--{f.name.replace('_', '-')}", *aliases.get(f.name, ())]
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        help_text = docs.get(f.name, "")
        help_text = f"{help_text} (default: {default})" if help_text else f"default: {default}"
        help_text = help_text.replace("%", "%%")
        if kind is bool:
            parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            choices = f.metadata.get("choices")  # a sequence, or a callable giving one (e.g. registry.names)
            choices = list(choices() if callable(choices) else choices) if choices is not None else None
            parser.add_argument(*flags, dest=f.name, type=_parse(kind, optional), default=None, choices=choices,
                                metavar=f.name.upper() if choices is None else None, help=help_text)
        names.append(f.name)
    return names


def given(args: argparse.Namespace, names: list[str]) -> dict:
    """The fields the user gave on the command line."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def build(cls: type, values: dict):
    """`cls(**values)` with a one-line error for a bad value."""
    try:
        return cls(**values)
    except TypeError as e:
        raise UserError(f"invalid options for {cls.__name__}: {e}") from None
