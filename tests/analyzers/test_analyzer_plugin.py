"""An analyzer of your own is one file and one `register` call (docs/adding-an-analyzer.md): the one in
tests/analyzers/resid_norm.py, never part of the package, shows up in `icrl-interp analyze` of a
recording, in `analyze --live`, in the report's table, and in other processes through an entry point or
$ICRL_INTERP_ANALYZERS; registration refuses what cannot work; one that raises loses no other section."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from icrl_interp import cli
from icrl_interp.analyzers import Analyzer, Column, analyze, registry
from icrl_interp.core.errors import UserError

from analyzers import resid_norm
from helpers import float_tol

# importing the module registered it (as a plugin's import does): undone at once, so that the tests of other files
# run with the built-in analyzers whatever runs before them (pytest imports every test file before the first test,
# and pytest-xdist runs files in any order); `plugin` registers it for one test at a time
registry.unregister(resid_norm.NAME)

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "data" / "checkpoints" / "linear-td"
RUN = ["--tasks", "16", "--batch-size", "8", "--prompt-seed", "0"]
NAME = resid_norm.NAME


@pytest.fixture
def plugin():
    """The analyzer registered for one test only: the rest of the suite sees the built-in ones."""
    registry.register(resid_norm.ANALYZER)
    yield resid_norm.ANALYZER
    registry.unregister(NAME)


@pytest.fixture(scope="module")
def rec(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rec") / "linear-td.h5"
    assert cli.main(["record", str(CKPT), "--out", str(path), *RUN, "--no-progress"]) == 0
    return path


def expected_norms(path: Path) -> list[float]:
    """The known answer, straight from the file: mean ‖z‖ of hook_resid_post at the last recorded position."""
    with h5py.File(path, "r") as f:
        n_layers = int(f.attrs["n_layers"])
        return [float(np.linalg.norm(f[f"acts/blocks.{l}.hook_resid_post"][:, -1].astype(np.float64), axis=-1).mean())
                for l in range(n_layers)]


def check_section(analysis: dict, expected: list[float]) -> None:
    section = analysis["activations"][NAME]
    tol = float_tol(np.float32, max(expected))  # the activations are float32; the sums float64
    assert section["layers"] == list(range(len(expected))) and section["n_prompts"] == 16
    assert np.allclose(section["mean_norm"], expected, rtol=0, atol=tol)
    per_layer = [x[NAME] for x in analysis["activations"]["layers"]]
    assert per_layer == section["mean_norm"]  # the same numbers, placed into each layer's entry
    assert analysis["sections"][NAME] == "ok"
    assert list(analysis["sections"]) == registry.names()  # after the built-in ones, in order


def test_importing_this_file_leaves_only_the_built_in_analyzers_registered():
    """First in the file, so before any `plugin` fixture has run: what pytest's import of this file registered was
    undone at once (left registered, every analysis of another file run before this one had the plugin's section;
    the cluster tests compare such an analysis with their workers', which have not)."""
    assert NAME not in registry.names()


def test_a_plugin_is_in_analyze_live_and_report(plugin, rec, tmp_path, capsys):
    expected = expected_norms(rec)
    assert len(expected) == 3 and min(expected) > 0

    out = tmp_path / "rec.json"
    assert cli.main(["analyze", str(rec), "--json", str(out)]) == 0
    recorded = json.loads(out.read_text())
    check_section(recorded, expected)
    assert recorded["sections"]["value_error"] == "ok" and recorded["sections"]["probes"] == "ok"  # and the rest
    assert f"   {NAME}: mean residual norm, last layer {expected[-1]:.4g}" in capsys.readouterr().out

    live = tmp_path / "live.json"
    assert cli.main(["analyze", str(CKPT), "--live", *RUN, "--json", str(live)]) == 0
    check_section(json.loads(live.read_text()), expected)  # the same prompts, run live: the same numbers
    capsys.readouterr()

    report = tmp_path / "report"
    assert cli.main(["report", str(rec), "--out", str(report), "--workers", "1"]) == 0
    table = capsys.readouterr().out
    header = next(line for line in table.splitlines() if line.startswith("input")).split()
    assert "|resid|" in header and f"{expected[-1]:.4g}" in table  # its column, in the terminal table
    assert "|resid|: mean norm of the residual stream" in table  # and its legend
    page = (report / "index.html").read_text()
    assert '">residual norm (last layer)</th>' in page and f'">{expected[-1]:.4g}</td>' in page
    summary = json.loads((report / "summary.json").read_text())["rows"][0]
    assert summary[f"activations.{NAME}.mean_norm"] == pytest.approx(expected, abs=float_tol(np.float32, max(expected)))

    registry.unregister(NAME)  # without it: no section, no column
    assert NAME not in analyze(rec)["sections"] and "resid_norm_last" not in [c.key for c in registry.columns()]


def test_a_plugin_that_raises_loses_no_other_section(plugin, rec, monkeypatch):
    def boom(self, chunk):
        raise RuntimeError("norm exploded")

    monkeypatch.setattr(resid_norm.ResidNorm, "update", boom)
    r = analyze(rec)
    assert r["sections"][NAME] == "failed (internal error, RuntimeError): norm exploded"
    assert NAME not in r["activations"] and all(NAME not in x for x in r["activations"]["layers"])
    assert all(r["sections"][k] == "ok" for k in ("weights", "value_error", "probes", "wang_metrics"))


def test_a_plugin_that_does_not_apply_says_why(plugin, rec):
    def not_here(ctx):
        ctx.reasons[NAME] = "not applicable: nothing to norm"

    registry.register(dataclasses.replace(plugin, open=not_here), replace=True)
    r = analyze(rec)
    assert r["sections"][NAME] == r["skipped"][NAME] == "not applicable: nothing to norm"
    assert NAME not in r["activations"] and r["sections"]["value_error"] == "ok"
    registry.register(dataclasses.replace(plugin, open=lambda ctx: None, missing="not applicable: said nothing"),
                      replace=True)
    assert analyze(rec)["sections"][NAME] == "not applicable: said nothing"  # no reason given: its `missing`
    assert analyze(CKPT)["sections"][NAME].startswith("not applicable: a checkpoint has no recorded activations")


def _subprocess(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env}, cwd=REPO)


def test_other_processes_find_a_plugin_by_entry_point_or_environment(rec, tmp_path):
    """An installed package's entry point (a dist-info directory on the path, as pip leaves one), and
    $ICRL_INTERP_ANALYZERS; a module that does not import is one line naming it."""
    site = tmp_path / "site"
    info = site / "icrl_resid_norm-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: icrl-resid-norm\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINTS}]\n{NAME} = analyzers.resid_norm\n")
    tests = str(REPO / "tests")
    code = ("import json; from icrl_interp.analyzers import analyze, registry; "
            f"print(json.dumps([registry.names(), analyze({str(rec)!r})['sections']]))")
    for env in ({"PYTHONPATH": os.pathsep.join([str(site), tests])},
                {"PYTHONPATH": tests, registry.ENV_VAR: "analyzers.resid_norm"}):
        done = _subprocess(code, env)
        assert done.returncode == 0, done.stderr
        names, sections = json.loads(done.stdout)
        assert names[-1] == NAME and sections[NAME] == "ok", env
    done = _subprocess("from icrl_interp.analyzers import registry; registry.names()",
                       {registry.ENV_VAR: "no_such_analyzer_module"})
    assert done.returncode != 0 and "cannot import analyzer module 'no_such_analyzer_module'" in done.stderr
    done = _subprocess("from icrl_interp.analyzers import registry; print(registry.names())", {})
    assert NAME not in done.stdout  # neither installed nor named: not there


@pytest.mark.parametrize("change, words", [
    ({"name": ""}, "non-empty name"),
    ({"name": "a.b"}, "without dots"),
    ({"open": None}, "open must be callable"),
    ({"place": "layers"}, "place must be one of analysis, weights, activations"),
    ({"roles": ("resid_post", "mlp_out")}, "unknown roles 'mlp_out'"),
    ({"columns": (("k", "h", "{}"),)}, "columns must be Column"),
    ({"name": "value_error"}, "already registered"),
    ({"columns": (Column("value_error", "again", lambda a: None),)}, "column 'value_error' is already analyzer 'value_error'"),
])
def test_registration_refuses_what_cannot_work(change, words):
    bad = Analyzer(name="mine", summary="s", open=lambda ctx: None)
    for key, value in change.items():  # past the runtime type checks of the test run: what a plain run gets
        object.__setattr__(bad, key, value)
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        registry.register(bad)
    assert registry.names()[-1] != "mine"


def test_replace_swaps_an_analyzer_in_place():
    old = registry.get("readouts")
    try:
        new = registry.register(Analyzer(name="readouts", summary="mine", open=lambda ctx: None), replace=True)
        assert registry.get("readouts") is new and registry.names().index("readouts") == 6
    finally:
        registry.register(old, replace=True)
    assert registry.get("readouts") is old
    with pytest.raises(UserError, match="unknown analyzer 'nope' \\(known: weights, population_kernel"):
        registry.get("nope")


def test_the_docs_page_shows_this_very_module():
    """docs/adding-an-analyzer.md walks through resid_norm.py: its code block is the module, line for line."""
    page = (REPO / "docs" / "adding-an-analyzer.md").read_text()
    block = page.split("## 2. The module\n\n```python\n", 1)[1].split("```", 1)[0]
    module = Path(resid_norm.__file__).read_text()
    assert block.strip() == module[module.index("import numpy as np"):].strip()


def test_a_column_that_cannot_read_an_analysis_leaves_its_cell_empty(plugin):
    from icrl_interp.report import headline
    from icrl_interp.report.batch import ReportInput, Result

    odd = Analyzer(name="odd", summary="s", open=lambda ctx: None, columns=(
        Column("raises", "raises", lambda a: 1 / 0), Column("text", "text", lambda a: "n/a", "{:.3g}")))
    registry.register(odd)
    try:
        r = Result(ReportInput(Path("x.h5"), "recording"), "ok", analysis={"activations": None})
        cells = headline.formatted(r)
        assert cells["raises"] == "—" and cells["text"] == "n/a" and cells["resid_norm_last"] == "—"
        assert "raises" in headline.text_table([r]).splitlines()[0]  # the table is still drawn
    finally:
        registry.unregister("odd")
