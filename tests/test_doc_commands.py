"""Every `icrl-interp …` line of the documentation is a command the CLI accepts, and each input form of
each command runs.

1. Parsing. Every `icrl-interp` command line of README.md, docs/*.md and examples/README.md is parsed
   by the real parser (`cli.build_parser()`): the lines of code blocks (backslash continuations
   joined, `# comments` dropped) must parse completely. Inline code spans (`icrl-interp record
   --model`) often name a command or a flag in prose: they must use real subcommands, real flags and
   valid values, but may leave out required arguments. Usage notation is read as a reader would:
   `…` / `...` placeholders are dropped, `[optional]` groups are given, `a|b` takes `a`, and the
   placeholder words of PLACEHOLDERS get a real value (FAMILY a family, A a number). A line that
   does not parse fails with its file and line.
2. Running. One line per subcommand and input form (checkpoint, recording, `--model`, `--prompts`,
   `--live`) runs through `cli.main` at tiny size and must exit 0 and write what it says.
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import importlib
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

from icrl_interp import cli
from icrl_interp.families import registry

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "examples" / "README.md"]
LINE = re.compile(r"^\s*(?:\$\s+)?(?:[A-Z_]+=\S*\s+)*(?:\S*/)?icrl-interp(?=\s|$)")
"""A command line in a code block: optional prompt `$ ` and VAR=value assignments, then the program."""
INLINE = re.compile(r"`\s*(?:\S*/)?icrl-interp(?=\s|`)([^`]*)`")
PLACEHOLDERS = {"FAMILY": "linear-td", "CMD": "analyze", "A": "1", "B": "1", "S": "1"}
"""Placeholder words of the docs' usage lines and a value that stands for them."""
MENTION_ERRORS = ("the following arguments are required",)
"""What an inline mention may leave out (a prose reference to `record --model` is not a whole command),
besides the value of the flag it ends with."""


def doc_commands(path: Path) -> list[tuple[int, str, bool, str]]:
    """(line number, the command after `icrl-interp`, whether it is a whole command, the families module an
    `export ICRL_INTERP_FAMILIES=…` line of its code block makes known) of a Markdown file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, prose, fence, families, i = [], [], False, "", 0
    while i < len(lines):
        line, start = lines[i], i + 1
        if line.lstrip().startswith("```"):
            fence, families = not fence, ""
        elif fence:
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            families = (re.findall(rf"{registry.ENV_VAR}=(\S+)", line) or [families])[0]
            m = LINE.match(line)
            if m:
                found.append((start, line[m.end():], True, families))
        else:
            prose.append((start, line))
        i += 1
    text = "\n".join(line for _, line in prose)
    for m in INLINE.finditer(text):
        rest = m.group(1).replace("\n", " ").strip()
        if rest and not rest.split()[0].endswith(":"):  # `icrl-interp CMD: error: …` quotes a message
            found.append((prose[text.count("\n", 0, m.start())][0], rest, False, ""))
    return sorted(found)


def argv_of(command: str) -> list[str]:
    """The argv a reader would type for a documented usage line (see the module docstring)."""
    argv = []
    for token in shlex.split(command.replace("…", "..."), comments=True):
        if token == "..." and argv and argv[-1].startswith("--"):
            argv.append("VALUE")  # `--weights …`: the flag's value left out
            continue
        token = token.strip("[]").removesuffix("...")
        if not token:
            continue
        token = token.split("|")[0] if "|" in token and not token.startswith("$(") else token
        token = PLACEHOLDERS.get(token, re.sub(r"\bFAMILY\b", PLACEHOLDERS["FAMILY"], token))
        argv.append(token)
    return argv


@functools.cache
def _parser():
    return cli.build_parser()  # parsing leaves no state in it: one parser serves every line


@contextlib.contextmanager
def _known(families: str):
    """The parser, with the families module `families` (a docs example: tests/families) registered meanwhile."""
    if not families:
        yield _parser()
        return
    sys.path.insert(0, str(REPO / "tests" / "families"))
    sys.modules.pop(families, None)  # importing registers the family: an earlier import (another test) would not
    try:
        module = importlib.import_module(families)
    finally:
        sys.path.remove(str(REPO / "tests" / "families"))
    try:
        yield cli.build_parser()
    finally:
        sys.modules.pop(families, None)
        registry.unregister(module.NAME)


def parse_error(argv: list[str], families: str = "") -> str | None:
    """The parser's one-line error for `argv`, or None when it parses (--help and --version included)."""
    err = io.StringIO()
    with _known(families) as parser, contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            return None if e.code == 0 else err.getvalue().strip() or f"exit {e.code}"
    return None


def doc_failures(path: Path) -> list[str]:
    failures = []
    for lineno, command, whole, families in doc_commands(path):
        argv = argv_of(command)
        if not argv:
            continue  # `icrl-interp …`: the program named in prose, no command
        error = parse_error(argv, families)
        mention = not whole and (any(e in (error or "") for e in MENTION_ERRORS)
                                 or f"argument {argv[-1]}: expected one argument" in (error or ""))
        if error and not mention:
            failures.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{lineno}: "
                            f"icrl-interp {command.strip()}\n    {error}")
    return failures


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(REPO)) for p in DOCS])
def test_every_documented_command_line_parses(path):
    failures = doc_failures(path)
    assert not failures, "documented command lines the CLI does not accept:\n" + "\n".join(failures)


def test_the_docs_hold_the_command_lines_the_checks_read():
    """The extraction finds the lines it must (a broken extractor would pass every doc vacuously)."""
    found = {p.relative_to(REPO).as_posix(): doc_commands(p) for p in DOCS}
    assert sum(len(v) for v in found.values()) > 100
    readme = [(c, whole) for _, c, whole, _ in found["README.md"]]
    assert (" record ckpt/star --out star.h5 --tasks 512", True) in [(c.split("#")[0].rstrip(), w) for c, w in readme]
    joined = [c for c, w in readme if w and c.startswith(" record --model")]  # a backslash continuation, joined
    assert joined and "--probe roles.toml --out mine.h5" in joined[0]
    assert any(c.startswith("analyze --live --model") and not w for c, w in readme)  # inline, over a line break
    assert any(fam == "mc_eval" for *_, fam in found["docs/adding-a-family.md"])  # its `export` line is read


def test_a_bad_line_is_reported_with_its_file_and_line(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("Text `icrl-interp record --model` and `icrl-interp analyze --nope`.\n\n```\n"
                   "icrl-interp construct FAMILY --out ck   # a comment\n"
                   "icrl-interp analyze x.h5 \\\n    --bogus-flag 3\n"
                   "icrl-interp record CKPT --out r.h5 [--tasks N] ...\n"
                   "icrl-interp verdict REC.h5 --figure\n```\n")
    failures = doc_failures(doc)
    assert [f.split(": icrl-interp")[0] for f in failures] == [f"{doc}:1", f"{doc}:5", f"{doc}:7", f"{doc}:8"]
    assert "--nope" in failures[0] and "--bogus-flag" in failures[1] and "expected int, got 'N'" in failures[2]
    assert "--figure: expected one argument" in failures[3]  # in a code block a flag needs its value


def test_usage_notation_becomes_an_argv():
    assert argv_of("causal CKPT --layer 0 [--method mean|leace|zero] ... …") == [
        "causal", "CKPT", "--layer", "0", "--method", "mean"]
    assert argv_of("train FAMILY --config data/checkpoints/FAMILY/c.json  # why") == [
        "train", "linear-td", "--config", "data/checkpoints/linear-td/c.json"]
    assert argv_of("analyze INPUT... --scheduler \"$(python -c 'print(1)')\"") == [
        "analyze", "INPUT", "--scheduler", "$(python -c 'print(1)')"]


# ------------------------------------------------------------------ each input form runs
MODEL = ["--model", str(REPO / "examples" / "torch_model.py") + ":make", "--task", "linear-td", "--d", "4",
         "--n", "6", "--probe", str(REPO / "examples" / "torch_model.toml")]
"""The documented example model (examples/torch_model.py) on a tiny linear-td task."""
SMALL = ["--tasks", "12", "--batch-size", "6"]
VERDICT = ["--bootstrap", "10", "--random-draws", "2", "--causal-tasks", "4"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A tiny θ* checkpoint (linear-td, d 2, n 6, 2 layers) and its recording."""
    t = tmp_path_factory.mktemp("doc-runs")
    assert cli.main(["construct", "linear-td", "--out", str(t / "ck"), "--d", "2", "--n", "6", "--n-layers", "2"]) == 0
    assert cli.main(["record", str(t / "ck"), "--out", str(t / "rec.h5"), *SMALL, "--no-progress"]) == 0
    return t


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def run(argv: list[str]) -> None:
    assert cli.main(argv) == 0, argv


def test_record_each_input_form(work, tmp_path):
    run(["record", str(work / "ck"), "--out", str(tmp_path / "a.h5"), *SMALL, "--no-progress"])  # checkpoint
    run(["record", *MODEL, "--out", str(tmp_path / "m.h5"), *SMALL, "--no-progress"])  # --model
    z = np.random.default_rng(0).standard_normal((6, 7, 5))  # linear-td d 2: 2d + 1 rows, n + 1 columns
    np.savez(tmp_path / "p.npz", z=z)
    run(["record", str(work / "ck"), "--prompts", str(tmp_path / "p.npz"), "--out", str(tmp_path / "p.h5"),
         "--no-progress"])  # --prompts
    run(["record", str(work / "ck"), "--out", str(tmp_path / "l.h5"), "--also-analyze", "--json",
         str(tmp_path / "l.json"), *SMALL, "--no-progress"])  # analyzed live as it records
    import h5py

    with h5py.File(tmp_path / "m.h5") as f:
        assert f["prompts/z"].shape == (12, 7, 9) and "outputs/model" in f and f.attrs["complete"]
    with h5py.File(tmp_path / "p.h5") as f:
        np.testing.assert_array_equal(f["prompts/z"][:], z.astype(f["prompts/z"].dtype))  # the file's own prompts
    assert _json(tmp_path / "l.json")["live"]["recording"] == str(tmp_path / "l.h5")


def test_analyze_each_input_form(work, tmp_path):
    out = {k: tmp_path / f"{k}.json" for k in ("ck", "rec", "live", "model", "prompts")}
    run(["analyze", str(work / "ck"), "--json", str(out["ck"])])  # checkpoint: its weights
    run(["analyze", str(work / "rec.h5"), "--json", str(out["rec"])])  # recording
    run(["analyze", str(work / "ck"), "--live", *SMALL, "--json", str(out["live"])])  # --live, a checkpoint
    run(["analyze", "--live", *MODEL, *SMALL, "--json", str(out["model"])])  # --live --model (docs' own form)
    np.savez(tmp_path / "p.npz", z=np.random.default_rng(1).standard_normal((6, 7, 5)))
    run(["analyze", str(work / "ck"), "--live", "--prompts", str(tmp_path / "p.npz"), "--json", str(out["prompts"])])
    a = {k: _json(p) for k, p in out.items()}
    assert a["ck"]["kind"] == "checkpoint" and a["ck"]["weights"] and a["ck"]["activations"] is None
    assert a["rec"]["kind"] == "recording" and len(a["rec"]["activations"]["layers"]) == 2
    assert a["live"]["kind"] == "live" and a["live"]["live"]["prompts"] == 12
    assert a["model"]["live"]["prompts"] == 12 and a["model"]["activations"]["readouts"]
    assert a["model"]["source"] == MODEL[1] and a["model"]["task_family"] == "linear-td"
    assert a["prompts"]["live"]["prompts"] == 6
    for k in ("rec", "live"):  # a live analysis is the analysis of the recording of the same prompts
        assert a[k]["activations"]["layers"][0]["td_probe_r2"] is not None


def test_causal_each_input_form(work, tmp_path):
    tiny = ["--layer", "0", "--tasks", "12", "--random-draws", "2", "--bootstrap", "10", "--steer", "1",
            "--baseline", "none"]
    run(["causal", str(work / "ck"), *tiny, "--json", str(tmp_path / "c.json")])  # checkpoint
    run(["causal", *MODEL, *tiny, "--json", str(tmp_path / "m.json")])  # --model
    for name in ("c", "m"):
        c = _json(tmp_path / f"{name}.json")
        assert c["schema"] == "icrl_interp.causal/2" and c["causal"]["erasure"]["output_change"]["td"]


def test_verdict_each_input_form(work, tmp_path):
    run(["verdict", str(work / "rec.h5"), "--bootstrap", "10", "--json", str(tmp_path / "r.json")])  # recording
    run(["verdict", str(work / "ck"), *SMALL, *VERDICT, "--json", str(tmp_path / "c.json")])  # checkpoint
    run(["verdict", *MODEL, *SMALL, *VERDICT, "--json", str(tmp_path / "m.json")])  # --model
    run(["record", *MODEL, "--out", str(tmp_path / "m.h5"), *SMALL, "--no-progress"])
    run(["verdict", str(tmp_path / "m.h5"), MODEL[0], MODEL[1], *VERDICT, "--json",
         str(tmp_path / "rm.json")])  # a recording with its model: the recording's [roles] edit the model
    v = {k: _json(tmp_path / f"{k}.json") for k in ("r", "c", "m", "rm")}
    assert not any(layer["causation"]["available"] for layer in v["r"]["layers"])  # a recording alone
    for k in ("c", "m", "rm"):
        assert all(layer["causation"]["available"] for layer in v[k]["layers"]), k
    for k, one in v.items():  # the headline never names a best it nulls
        text = one["verdict"]["text"]
        assert (one["verdict"]["best"] is None) == text.startswith("none fits"), (k, one["verdict"])
        assert one["verdict"]["best"] is None or text.startswith(one["verdict"]["best"])
        assert "best" not in text


def test_report_inspect_control_construct_train_envs(work, tmp_path, capsys):
    run(["report", str(work / "ck"), str(work / "rec.h5"), "--out", str(tmp_path / "rep"), "--workers", "1",
         "--live-tasks", "12", "--no-progress"])
    rows = _json(tmp_path / "rep" / "summary.json")["rows"]
    assert [r["kind"] for r in rows] == ["checkpoint", "recording"] and all(r["status"] == "ok" for r in rows)
    run(["inspect", str(work / "ck")])
    run(["control", str(REPO / "data" / "checkpoints" / "sarsa"), "--mdps", "2", "--iterations", "2", "--no-progress",
         "--json", str(tmp_path / "ctl.json")])
    assert _json(tmp_path / "ctl.json")["schema"].startswith("icrl_interp.control/")
    run(["construct", "actor-critic", "--out", str(tmp_path / "ac"), "--n-states", "2", "--n-actions", "2", "--n", "6"])
    run(["train", "sarsa", "--out", str(tmp_path / "run"), "--n-states", "2", "--n-actions", "2", "--n", "8",
         "--tasks-per-step", "4", "--eval-tasks", "4", "--steps", "2", "--no-progress", "--no-eval"])
    run(["envs", "boyan", "--tasks", "2", "--n-states", "4"])
    assert "step_000002" in capsys.readouterr().out or (tmp_path / "run" / "checkpoints").is_dir()
