"""Verdict JSON files (`icrl-interp verdict --json`, schema icrl_interp.verdict/1) as report inputs: a row
of kind 'verdict' with the verdict's fields in the summaries, its figure in the manifest and an "Algorithm
verdicts" section (table + figure); one found while scanning a directory is an input too; a broken one is
a failed row."""
from __future__ import annotations

import json

from icrl_interp.analyzers import inputs
from icrl_interp.cli import main
from icrl_interp.core.files import write_json
from icrl_interp.verdicts import behaviour as VD
from icrl_interp.report import ReportConfig, build_report
from verdicts.test_verdict import GENERATORS, synthetic  # tests/ is on sys.path (conftest)


def _verdict(tmp_path, name="mc"):
    v = VD.run(synthetic(GENERATORS["mc_regression"], tasks=80), resamples=50, steps=4)
    path = tmp_path / "jsons" / f"{name}.json"
    path.parent.mkdir(exist_ok=True)
    write_json(path, v)
    return path, json.loads(path.read_text())


def test_a_verdict_json_is_a_row_with_its_table_and_figure(tmp_path, capsys):
    path, v = _verdict(tmp_path)
    assert inputs.is_verdict_json(path) and not inputs.is_causal_json(path)
    out = tmp_path / "out"
    assert main(["report", str(path.parent), "--out", str(out), "--no-progress", "--workers", "1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (row,) = summary["rows"]
    assert (row["kind"], row["status"]) == ("verdict", "ok")
    assert row["verdict.best"] == v["verdict"]["best"] == "mc_regression"
    assert row["verdict.margin_ci"] == v["verdict"]["margin_ci"] and row["task_family"] == "linear-td"
    figs = sorted(p.name for p in (out / "figures").glob("verdict-*.png"))
    assert len(figs) == 1 and (out / "figures" / figs[0]).stat().st_size > 1000
    assert figs[0] in json.loads((out / "figures" / "manifest.json").read_text())["files"]
    page = (out / "index.html").read_text()
    assert page.index('id="algorithm-verdicts"') < page.index(f'src="figures/{figs[0]}"')
    assert "<table class='verdict'>" in page and "mc_regression" in page
    terminal = capsys.readouterr().out  # the answer first: the model's verdict before the metrics table
    assert terminal.index("  mc (linear-td): mc_regression") < terminal.index("probe sel.")
    before = (out / "summary.json").read_bytes()
    outcome = build_report([path.parent], out, ReportConfig(workers=1, progress=False))
    assert outcome.results[0].cached and (out / "summary.json").read_bytes() == before


def test_a_broken_verdict_json_is_a_failed_row(tmp_path):
    path, v = _verdict(tmp_path)
    del v["layers"]
    path.write_text(json.dumps(v))
    out = tmp_path / "out"
    main(["report", str(path), "--out", str(out), "--no-progress", "--workers", "1"])
    (row,) = json.loads((out / "summary.json").read_text())["rows"]
    assert row["status"] == "failed" and "without its 'layers' field" in row["error"]
