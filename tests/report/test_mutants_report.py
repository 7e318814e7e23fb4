"""Batch-report known answers that a mutation sweep found missing.

Mutants caught: the report cache surviving a package version change; a failure with an empty message
not counted as failed (batch rows, summary.json, ReportOutcome.n_failed, the page, the terminal table).
"""
from __future__ import annotations

import json

import report_fake as F

from icrl_interp.core.errors import UserError
from icrl_interp.report import ReportConfig, batch, build_report
from icrl_interp.report.headline import text_table

FAKE = "report_fake:analyze"
SILENT = "test_mutants_report:fail_without_a_message"


def fail_without_a_message(path: str) -> dict:
    """An analyzer whose failure has an empty message (one_line(UserError('')) == '')."""
    raise UserError("")


# ------------------------------------------------------------------ cache and version
def test_cache_entry_is_keyed_by_the_package_version(tmp_path, monkeypatch):
    analysis = F.make_analysis("softmax-td", "trained", 0.5)
    sha = "ab" * 32
    monkeypatch.setattr(batch, "__version__", "7.0.0")
    batch.store_cached(tmp_path, sha, FAKE, analysis)
    assert json.loads((tmp_path / f"{sha}.json").read_text())["icrl_interp"] == "7.0.0"
    assert batch.load_cached(tmp_path, sha, FAKE) == json.loads(json.dumps(analysis))
    monkeypatch.setattr(batch, "__version__", "7.0.1")
    assert batch.load_cached(tmp_path, sha, FAKE) is None


def test_a_new_package_version_re_analyzes_a_cached_input(tmp_path, monkeypatch):
    log = tmp_path / "analyzer.log"
    monkeypatch.setenv(F.LOG_ENV, str(log))
    rec = F.write_recording(tmp_path / "rec.h5", F.make_analysis("softmax-td", "trained", 0.7))
    out = tmp_path / "out"
    calls = lambda: log.read_text().splitlines() if log.exists() else []  # noqa: E731

    def run():
        items = batch.collect_inputs([rec])
        return batch.run_batch(items, out, workers=1, analyzer=FAKE, progress=False, control=None)

    monkeypatch.setattr(batch, "__version__", "7.0.0")
    first = run()
    second = run()
    assert [r.cached for r in first] == [False] and [r.cached for r in second] == [True] and len(calls()) == 1
    monkeypatch.setattr(batch, "__version__", "7.1.0")
    third = run()
    assert [r.cached for r in third] == [False] and [r.status for r in third] == ["ok"] and len(calls()) == 2
    assert third[0].analysis == second[0].analysis  # exact: copies of the cached numbers


# ------------------------------------------------------------------ empty failure messages
def test_a_failure_with_an_empty_message_is_counted_as_failed(tmp_path):
    ok = F.write_recording(tmp_path / "ok.h5", F.make_analysis("softmax-td", "trained", 0.7))
    assert batch.analyze_job(SILENT, str(ok)) == ("failed", "")
    items = batch.collect_inputs([ok])
    results = batch.run_batch(items, tmp_path / "out", workers=1, analyzer=SILENT, progress=False, control=None)
    assert [(r.status, r.error) for r in results] == [("failed", "")]
    assert json.loads(batch.summary_json(results))["n_failed"] == 1
    assert json.loads(batch.summary_json(results))["rows"][0]["status"] == "failed"
    assert f"FAILED {ok}: " in text_table(results)


def test_report_outcome_counts_an_empty_failure(tmp_path):
    good = F.write_recording(tmp_path / "in" / "good.h5", F.make_analysis("softmax-td", "trained", 0.7))
    config = ReportConfig(workers=1, analyzer=SILENT, progress=False, control_mdps=0)
    outcome = build_report([good], tmp_path / "out", config)
    assert outcome.n_failed == 1 and [r.status for r in outcome.results] == ["failed"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["n_inputs"] == 1 and summary["n_failed"] == 1
    assert "1 inputs, 0 analyzed, 1 failed" in (tmp_path / "out" / "index.html").read_text()
