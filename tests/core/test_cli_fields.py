"""Dataclass fields are the CLI: one flag per field, the field docstring as help, bools as --x/--no-x,
required fields, several values, metavars, hidden flags, and only the flags the user gave come back."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest

from icrl_interp.core import cli_fields
from icrl_interp.core.errors import UserError


@dataclass
class Base:
    steps: int = 10
    """Optimizer steps."""


@dataclass
class Options(Base):
    n_states: int = 5
    """States of
    the chain."""
    rate: float = 0.5
    """A rate (in %)."""
    name: str = "x"
    tied: bool = True
    """Share weights."""
    d: int | None = None
    """Optional width."""


def _parser():
    p = argparse.ArgumentParser()
    names = cli_fields.add_fields(p, Options, skip=("name",))
    return p, names


def test_docs_come_from_the_lines_under_the_fields():
    docs = cli_fields.field_docs(Options)
    assert docs == {"steps": "Optimizer steps.", "n_states": "States of the chain.", "rate": "A rate (in %).",
                    "tied": "Share weights.", "d": "Optional width."}


def test_flags_types_and_given():
    p, names = _parser()
    assert names == ["steps", "n_states", "rate", "tied", "d"]
    args = p.parse_args(["--n-states", "7", "--rate", "0.25", "--no-tied", "--d", "none"])
    assert cli_fields.given(args, names) == {"n_states": 7, "rate": 0.25, "tied": False}
    assert cli_fields.given(p.parse_args(["--n-states", "3", "--d", "4"]), names) == {"n_states": 3, "d": 4}
    help_text = p.format_help()
    assert "States of the chain. (default: 5)" in help_text and "--name" not in help_text
    with pytest.raises(SystemExit):
        p.parse_args(["--steps", "ten"])


def test_build_turns_bad_options_into_user_errors():
    assert cli_fields.build(Options, {"steps": 3}).steps == 3
    with pytest.raises(UserError, match="Options"):
        cli_fields.build(Options, {"nope": 1})


@dataclass
class WithChoices:
    kind: str = "a"
    """One of a few."""
    family: str | None = dataclasses.field(default=None, metadata={"choices": lambda: ["x", "y"]})
    """Computed choices."""


def test_choices_from_field_metadata(capsys):
    p = argparse.ArgumentParser()
    names = cli_fields.add_fields(p, WithChoices)
    assert cli_fields.given(p.parse_args(["--family", "y"]), names) == {"family": "y"}
    with pytest.raises(SystemExit):
        p.parse_args(["--family", "z"])
    assert "invalid choice" in capsys.readouterr().err


@dataclass
class Command:
    out: str = dataclasses.field(metadata={"metavar": "DIR"})
    """Where it goes."""
    steer: tuple[float, ...] = (-2.0, 1.0)
    """Scales."""
    secret: str | None = dataclasses.field(default=None, metadata={"hidden": True})
    """For tests."""


def test_required_fields_several_values_metavars_and_hidden_flags(capsys):
    p = argparse.ArgumentParser()
    names = cli_fields.add_fields(p, Command)
    args = p.parse_args(["--out", "d", "--steer", "1", "0.5", "--secret", "x"])
    assert cli_fields.given(args, names) == {"out": "d", "steer": (1.0, 0.5), "secret": "x"}
    assert cli_fields.parsed(p.parse_args(["--out", "d"]), Command) == Command(out="d")  # the defaults fill the rest
    assert cli_fields.parsed(p.parse_args(["--out", "d", "--steer"]), Command).steer == ()  # none given: no scales
    help_text = " ".join(p.format_help().split())
    assert "--out DIR Where it goes." in help_text and "Scales. (default: -2 1)" in help_text
    assert "--secret" not in help_text and "For tests" not in help_text
    assert cli_fields.given_flags(args, Command) == ["--out", "--steer", "--secret"]
    with pytest.raises(SystemExit):
        p.parse_args([])
    assert "the following arguments are required: --out" in capsys.readouterr().err
