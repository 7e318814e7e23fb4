"""The documentation: the mkdocs site builds with --strict, its CLI reference covers every
subcommand, and README.md stays short with working links."""
from __future__ import annotations

import argparse
import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MKDOCS_YML = REPO / "mkdocs.yml"
README = REPO / "README.md"
HOOK = REPO / "docs" / "hooks" / "cli_reference.py"
README_MAX_LINES = 250


def _build(site_dir: Path) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.fail("mkdocs / mkdocs-material are not installed: pip install -e '.[test]'")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir),
         "-f", str(MKDOCS_YML)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    site_dir = tmp_path_factory.mktemp("site")
    return _build(site_dir), site_dir


def test_mkdocs_build_strict(site):
    result, site_dir = site
    assert result.returncode == 0, (
        f"mkdocs build --strict failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    assert (site_dir / "index.html").is_file()
    assert (site_dir / "cli.html").is_file()


def _page_text(path: Path) -> str:
    """The visible text of a built page: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


def _squash(text: str) -> str:
    return " ".join(text.split())


def _load_hook():
    spec = importlib.util.spec_from_file_location("_docs_cli_reference_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_lists_every_subcommand(site):
    result, site_dir = site
    assert result.returncode == 0, f"docs build failed:\n{result.stdout}\n{result.stderr}"
    from icrl_interp import cli

    page = _squash(_page_text(site_dir / "cli.html"))
    hook = _load_hook()
    assert cli.COMMANDS, "no subcommands registered"
    # The parsers as the CLI builds them, formatted at the hook's width.
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(hook.WIDTH)
    try:
        parser = cli.build_parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        helps = {name: sub.choices[name].format_help() for name in cli.COMMANDS}
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    for name, entry in cli.COMMANDS.items():
        one_line = entry[1] if isinstance(entry, (tuple, list)) and len(entry) > 1 else None
        assert f"usage: icrl-interp {name}" in page, f"CLI reference lacks `icrl-interp {name}`"
        if one_line:
            assert _squash(one_line) in page, f"CLI reference lacks the summary of {name!r}"
        assert _squash(helps[name]) in page, f"CLI reference lacks the full --help of {name!r}"


def _markdown_links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)   # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)                # nor do code spans
    return re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)


def test_readme_short_and_links_resolve():
    text = README.read_text(encoding="utf-8")
    n_lines = len(text.splitlines())
    assert n_lines <= README_MAX_LINES, f"README.md has {n_lines} lines (at most {README_MAX_LINES})"
    links = _markdown_links(text)
    assert links, "README.md links nowhere (it should point into docs/)"
    missing = []
    for target in links:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # external URL or in-page anchor
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not (REPO / path).exists():
            missing.append(target)
    assert not missing, f"README.md links to missing files: {missing}"
    assert any(t.startswith("docs/") for t in links), "README.md should link the docs pages"
