"""mkdocs hook: generate the CLI reference from the argparse parsers.

A page that contains the marker `<!-- flag-vocabulary -->` gets the tables of
`icrl_interp.core.vocabulary` (every flag with its meaning and commands; the old spellings);
a page that contains the marker `<!-- cli-reference -->` gets it replaced by the
`--help` text of `icrl-interp` and of every subcommand in `icrl_interp.cli.COMMANDS`,
built in-process (no subprocess, nothing hand-copied). Each subcommand module is
imported the way the CLI imports it; a module that fails to import, or a
subcommand missing from the parser, fails the build instead of being skipped.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from contextlib import contextmanager
from pathlib import Path

MARKER = "<!-- cli-reference -->"
VOCABULARY = "<!-- flag-vocabulary -->"
"""Replaced by the tables of `icrl_interp.core.vocabulary`: every flag, and the old spellings refused."""
WIDTH = 100  # help text is wrapped at this many columns, whatever the terminal


class CLIReferenceError(RuntimeError):
    """The CLI reference could not be generated (the docs build must fail)."""


@contextmanager
def _columns(width: int):
    """argparse wraps help at $COLUMNS; pin it so the page does not depend on the terminal."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _ensure_importable(repo_root: Path | None) -> None:
    if repo_root is not None and str(repo_root) not in sys.path:
        sys.path.insert(0, str(repo_root))


def cli_help_sections(repo_root: Path | None = None, width: int = WIDTH) -> list[tuple[str, str]]:
    """[(command line, help text)]: `icrl-interp` first, then each subcommand in table order."""
    _ensure_importable(repo_root)
    try:
        cli = importlib.import_module("icrl_interp.cli")
    except Exception as e:  # noqa: BLE001 - any failure must stop the build
        raise CLIReferenceError(f"cannot import icrl_interp.cli: {type(e).__name__}: {e}") from e
    commands = getattr(cli, "COMMANDS", None)
    if not isinstance(commands, dict) or not commands:
        raise CLIReferenceError("icrl_interp.cli.COMMANDS is missing or empty")

    # Import every subcommand module first, so a broken one is named in the error.
    for name, entry in commands.items():
        module = entry[0] if isinstance(entry, (tuple, list)) else entry
        try:
            mod = importlib.import_module(module)
        except Exception as e:  # noqa: BLE001
            raise CLIReferenceError(
                f"subcommand {name!r}: cannot import {module}: {type(e).__name__}: {e}") from e
        if not callable(getattr(mod, "add_arguments", None)):
            raise CLIReferenceError(f"subcommand {name!r}: {module} has no add_arguments(parser)")

    with _columns(width):
        try:
            parser = cli.build_parser()
        except Exception as e:  # noqa: BLE001
            raise CLIReferenceError(f"icrl_interp.cli.build_parser() failed: {type(e).__name__}: {e}") from e
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if len(subparsers) != 1:
            raise CLIReferenceError("icrl-interp parser has no (or several) subcommand groups")
        choices = subparsers[0].choices
        sections = [("icrl-interp", parser.format_help())]
        for name in commands:
            if name not in choices:
                raise CLIReferenceError(f"subcommand {name!r} is in COMMANDS but not in the parser")
            sections.extend(_walk(f"icrl-interp {name}", choices[name]))
    return sections


def _walk(title: str, parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """The parser's help, then that of any nested subcommands (e.g. `construct FAMILY`)."""
    sections = [(title, parser.format_help())]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                sections.extend(_walk(f"{title} {name}", sub))
    return sections


def render(sections: list[tuple[str, str]]) -> str:
    """Markdown: one heading and one text block per command."""
    parts = []
    for title, text in sections:
        if "```" in text:
            raise CLIReferenceError(f"help of {title!r} contains a code fence")
        level = "#" * min(2 + title.count(" "), 6)  # icrl-interp: h2, subcommands: h3, nested: h4
        parts.append(f"{level} `{title}`\n\n```text\n{text.rstrip()}\n```\n")
    return "\n".join(parts)


def vocabulary_tables(repo_root: Path | None = None) -> str:
    """Markdown: the flag vocabulary (flag, meaning, commands) and the old spellings with their new ones."""
    _ensure_importable(repo_root)
    vocabulary = importlib.import_module("icrl_interp.core.vocabulary")
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    rows = ["| flag | meaning | commands |", "|---|---|---|"]
    rows += [f"| `{name}` | {cell(f.meaning)} | {', '.join(f.commands)} |"
             for name, f in sorted(vocabulary.FLAGS.items())]
    old = ["| old spelling | command | now |", "|---|---|---|"]
    old += [f"| `{name}` | {command} | {', '.join(f'`{n}`' for n in new)} |"
            for name, where in sorted(vocabulary.RENAMED.items()) for command, new in where.items()]
    return "\n".join(rows) + "\n\nOld spellings, each refused in one line naming the new one:\n\n" + "\n".join(old) + "\n"


def on_page_markdown(markdown, page, config, files, **kwargs):  # mkdocs event
    if MARKER not in markdown and VOCABULARY not in markdown:
        return markdown
    from mkdocs.exceptions import PluginError

    repo_root = Path(config.config_file_path).resolve().parent if config.config_file_path else None
    try:
        if VOCABULARY in markdown:
            markdown = markdown.replace(VOCABULARY, vocabulary_tables(repo_root))
        if MARKER in markdown:
            markdown = markdown.replace(MARKER, render(cli_help_sections(repo_root)))
    except CLIReferenceError as e:
        raise PluginError(f"CLI reference ({page.file.src_path}): {e}") from e
    return markdown
