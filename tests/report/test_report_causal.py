"""Causal JSON files (`icrl-interp causal --json`, schema icrl_interp.causal/2) as report inputs: a row of
kind 'causal' whose numbers are the JSON's, its figure in the manifest and a "Causal tests" section in the
page; a foreign .json named on the command line is a failed row, one found while scanning a directory is
ignored; a foreign model's recording and its causal JSON leave no section unexplained."""
from __future__ import annotations

import csv
import io
import json
import shutil

import pytest
import torch

import helpers
from icrl_interp.interventions import causal
from icrl_interp.models import checkpoint
from icrl_interp.analyzers import inputs
from icrl_interp.cli import main
from icrl_interp.models.construct import construct, task_config
from icrl_interp.core.files import write_json
from icrl_interp.recording.recorder import record_model
from icrl_interp.report import ReportConfig, batch, build_report
from icrl_interp.report.headline import text_table

SMALL = dict(tasks=24, random_draws=4, bootstrap=50, steer=[-1.0, 1.0], refits=0)
"""A causal test small enough for a unit test (the numbers only have to travel, not to be precise)."""


@pytest.fixture(scope="module")
def theta(tmp_path_factory):
    """θ* linear-td (d 3, n 6, 2 layers), its causal JSON at layer 0 (with the random-init baseline)."""
    root = tmp_path_factory.mktemp("causal-report")
    ckpt = construct("linear-td", {"d": 3, "n": 6, "n_layers": 2}, root / "star")
    section = causal.causal_test(checkpoint.load(ckpt), checkpoint.read(ckpt)[0], 0, **SMALL)
    path = root / "jsons" / "star_causal.json"
    path.parent.mkdir()
    write_json(path, {"schema": causal.SCHEMA, "source": str(ckpt), "causal": section})
    return root, ckpt, path, json.loads(path.read_text())


def _rows(out):
    return json.loads((out / "summary.json").read_text())["rows"]


def _csv(out):
    return list(csv.DictReader(io.StringIO((out / "summary.csv").read_text())))


def test_the_schema_constant_is_the_causal_modules(theta):
    assert inputs.CAUSAL_SCHEMA == causal.SCHEMA
    _, _, path, _ = theta
    assert inputs.is_causal_json(path)


def test_a_causal_json_is_a_row_with_its_numbers_figure_and_page_section(theta, capsys):
    root, ckpt, path, doc = theta
    out = root / "out"
    assert main(["report", str(path), str(ckpt), "--out", str(out), "--no-progress", "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    assert "causal tests" in printed and "star_causal [causal]" in printed
    rows = _rows(out)
    assert [(r["kind"], r["status"]) for r in rows] == [("causal", "ok"), ("checkpoint", "ok")]
    row, section = rows[0], doc["causal"]
    out_change = section["erasure"]["output_change"]
    assert (row["family"], row["task_family"], row["context_length"]) == ("linear-td", "linear-td", 6)
    assert (row["causal.layer"], row["causal.method"], row["causal.hook"]) == (0, "leace", "blocks.0.hook_resid_post")
    assert row["causal.source"] == str(ckpt) and row["sha256"] and row["error"] == "" and row["reasons"] == ""
    # exact: the summary copies the JSON's numbers (and a float's repr reads back to the same float)
    assert row["causal.erasure.output_change.td.mean"] == out_change["td"]["mean"]
    assert row["causal.erasure.output_change.td.ci"] == out_change["td"]["ci"]
    assert row["causal.erasure.output_change.random.mean"] == out_change["random"]["mean"]
    assert row["causal.erasure.output_change.random.ci"] == out_change["random"]["ci"]
    assert row["causal.erasure.output_change.ratio.value"] == out_change["ratio"]["value"]
    assert row["causal.erasure.output_change.cohen_d.ci"] == out_change["cohen_d"]["ci"]
    assert row["causal.steering.1.td.change"] == section["steering"][1]["td"]["change"]
    comparison = section["baseline"]["comparison"]
    assert row["causal.baseline.comparison.erasure.output_change.difference.mean"] == \
        comparison["erasure"]["output_change"]["difference"]["mean"]
    assert row["causal.baseline.comparison.exceeds_random_init"] == comparison["exceeds_random_init"]
    # the per-draw lists stay in the JSON (and the cache), out of both summaries
    assert not [k for k in row if k.endswith(".draws")]
    csv_row = _csv(out)[0]
    assert not [k for k in csv_row if k.endswith(".draws")]
    assert float(csv_row["causal.erasure.output_change.td.mean"]) == out_change["td"]["mean"]
    assert json.loads(csv_row["causal.erasure.output_change.td.ci"]) == out_change["td"]["ci"]
    # the figure: written by report.causal.write_figure, in the manifest, shown in the Causal tests section
    figs = sorted(p.name for p in (out / "figures").glob("causal-*.png"))
    assert len(figs) == 1 and figs[0].startswith("causal-000-linear-td-l0-leace-")
    assert (out / "figures" / figs[0]).stat().st_size > 1000
    assert figs[0] in json.loads((out / "figures" / "manifest.json").read_text())["files"]
    page = (out / "index.html").read_text()
    assert page.index('id="causal-tests"') < page.index(f'src="figures/{figs[0]}"')
    assert "Causal tests" in page and f"{out_change['td']['mean']:.3g}" in page
    # re-run: the JSON comes from the cache, the summaries are byte-identical
    before = (out / "summary.json").read_bytes(), (out / "summary.csv").read_bytes()
    outcome = build_report([path, ckpt], out, ReportConfig(workers=1, progress=False))
    assert outcome.results[0].cached
    assert ((out / "summary.json").read_bytes(), (out / "summary.csv").read_bytes()) == before  # copies of the cache


def test_a_foreign_json_named_explicitly_is_a_failed_row(theta):
    root, _, path, _ = theta
    bad = root / "bad"
    bad.mkdir()
    (bad / "other.json").write_text(json.dumps({"schema": "icrl_interp.analysis/1", "causal": {}}))
    (bad / "garbage.json").write_text("{not json")
    (bad / "list.json").write_text("[1, 2]")
    out = root / "out-bad"
    assert main(["report", str(bad / "other.json"), str(bad / "garbage.json"), str(bad / "list.json"), str(path),
                 "--out", str(out), "--no-progress", "--workers", "1"]) == 1
    rows = _rows(out)
    assert [(r["kind"], r["status"]) for r in rows] == [("causal", "failed")] * 3 + [("causal", "ok")]
    errors = [r["error"] for r in rows[:3]]
    assert all("\n" not in e and e.startswith("not a causal JSON file") for e in errors)
    assert "'icrl_interp.analysis/1'" in errors[0] and "not valid JSON" in errors[1] and "JSON list" in errors[2]
    assert len(list((out / "cache").glob("*.json"))) == 1  # the good one; failures are not cached
    assert "other.json: failed: not a causal JSON file" in (out / "index.html").read_text()


def test_a_scanned_directory_ignores_foreign_json(theta):
    root, _, path, _ = theta
    scan = root / "scan"
    (scan / "sub").mkdir(parents=True)
    shutil.copy(path, scan / "sub" / "copy.json")
    (scan / "random.json").write_text(json.dumps({"schema": "something/1", "causal": {}}))
    (scan / "list.json").write_text("[]")
    (scan / "notes.txt").write_text("icrl_interp.causal/2")
    found = inputs.discover([scan], causal=True)
    assert [(f.kind, f.path.name) for f in found] == [("causal", "copy.json")]
    assert [f.kind for f in inputs.discover([scan])] == ["missing"]  # `analyze` takes no causal JSON
    out = root / "out-scan"
    outcome = build_report([scan], out, ReportConfig(workers=1, progress=False))
    assert [(r.input.kind, r.status, r.input.path.name) for r in outcome.results] == [("causal", "ok", "copy.json")]


def test_status_of_a_causal_section(theta):
    root, _, _, doc = theta
    d = root / "statuses"
    d.mkdir()
    no_baseline = {**doc, "causal": {k: v for k, v in doc["causal"].items() if k != "baseline"}}
    failed_baseline = {**doc, "causal": {**doc["causal"], "baseline": {"kind": "random-init", "seed": 0,
                                                                       "error": "the copy has another width"}}}
    empty = {**doc, "causal": {k: v for k, v in doc["causal"].items() if k != "erasure"}}
    for name, value in (("a", no_baseline), ("b", failed_baseline), ("c", empty)):
        write_json(d / f"{name}.json", value)
    outcome = build_report([d], root / "out-statuses", ReportConfig(workers=1, progress=False))
    got = [(r.status, r.reasons) for r in outcome.results]
    assert got[0] == ("ok", "")
    assert got[1] == ("partial", "random-init baseline: not run: the copy has another width")
    assert got[2][0] == "nothing analyzed" and "erasure.output_change.td.mean" in got[2][1]
    rows = _rows(root / "out-statuses")
    assert not [k for k in rows[0] if k.startswith("causal.baseline")]
    assert rows[1]["causal.baseline.error"] == "the copy has another width"
    assert outcome.n_failed == 1  # nothing analyzed counts as failed
    assert [bool(f.files) for f in outcome.figures if f.section == "causal"] == [True, True]
    table = text_table(outcome.results)
    assert "no baseline in the JSON" in table and "not run: the copy has another width" in table


# ------------------------------------------------------------------ a model of your own
ROLES = {"resid_post": "blocks.{layer}", "pattern": "blocks.{layer}.attn#1", "readout": ["ln_f", "head"]}
TASK = {"d": 3, "n": 6, "n_layers": 2}


def Net():  # noqa: N802 - the user's model: no family, its own embedding (linear-td prompts of d = 3 have 7 rows)
    return helpers.Net(d=8, d_in=7)


def test_a_foreign_model_recording_and_its_causal_json_leave_no_section_unexplained(tmp_path):
    torch.manual_seed(0)
    model = Net()
    record_model(model, "linear-td", tmp_path / "net.h5", task_options=TASK, probe=ROLES, tasks=32, batch_size=16,
                 progress=False)
    section = causal.causal_test(model, task_config("linear-td", TASK), 0, roles=ROLES, **SMALL)
    write_json(tmp_path / "net_causal.json", {"schema": causal.SCHEMA, "source": "net.py:Net", "causal": section})
    out = tmp_path / "out"
    assert main(["report", str(tmp_path / "net.h5"), str(tmp_path / "net_causal.json"), "--out", str(out),
                 "--no-progress", "--workers", "1"]) == 0
    rec, cau = _rows(out)
    assert (rec["kind"], cau["kind"]) == ("recording", "causal")
    assert cau["family"] == "generic" and cau["causal.model.family"] is None and cau["status"] == "ok"
    assert cau["causal.erasure.output_change.td.mean"] == section["erasure"]["output_change"]["td"]["mean"]  # a copy
    # every analysis section is computed or says why not, in the row and on the page
    sections = {k.split(".", 1)[1]: v for k, v in rec.items() if k.startswith("sections.")}
    assert sections and all(v == "ok" or (isinstance(v, str) and len(v) > len("not applicable: ")) for v in sections.values())
    assert rec["status"] == "ok" or rec["reasons"]
    page = (out / "index.html").read_text()
    for name, why in sections.items():
        if why != "ok":
            assert f"<b>{name}</b>: " in page, f"the page does not say why {name} was not computed"
    assert 'id="causal-tests"' in page and "net_causal [causal]" in page
    manifest = json.loads((out / "figures" / "manifest.json").read_text())["files"]
    assert any(f.startswith("causal-000-generic-l0-leace-") for f in manifest)
