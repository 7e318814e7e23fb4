"""The demo's failure count (a mutation sweep found it untested): an input that failed with an empty
message still counts, in run_demo's return value, its printed summary and `icrl-interp demo`'s exit
status. The slow parts (building and loading torch models, recording, analysis) are replaced by a report outcome with a known failure."""
from __future__ import annotations

import argparse
from pathlib import Path

from analyzers import analyzer_data as D

from icrl_interp.models import checkpoint, construct
from icrl_interp.report import demo
from icrl_interp.recording import probe_spec
from icrl_interp import report
from icrl_interp.core.errors import UserError
from icrl_interp.report import ReportOutcome, batch


def test_demo_counts_a_failure_with_an_empty_message(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_build_report(inputs, out, config):
        seen["inputs"] = list(inputs)
        ok = batch.Result(batch.ReportInput(Path(inputs[0]), "checkpoint", {"family": "sarsa"}), "ok",
                          analysis={"schema": batch.ANALYSIS_SCHEMA, "family": "sarsa"})
        bad = batch.Result(batch.ReportInput(Path(out) / "broken.h5", "recording"), "failed", error="")
        return ReportOutcome([ok, bad], [], Path(out))

    def no_spec(family):
        raise UserError("no probe spec in this test")  # run_demo then records nothing

    def fake_construct(family, values, target, overwrite=False):  # a theta* checkpoint without torch
        cfg = D.config_for(family)
        return D.write_checkpoint(target, cfg, D.theta_params(cfg))

    monkeypatch.setattr(report, "build_report", fake_build_report)
    monkeypatch.setattr(construct, "construct", fake_construct)
    monkeypatch.setattr(checkpoint, "load", lambda path: None)
    monkeypatch.setattr(demo, "shipped_checkpoints", lambda root=None: [])
    monkeypatch.setattr(probe_spec, "shipped_spec", no_spec)
    judged = []  # the verdicts: skipped with --quick, else their JSON go to the report with the rest
    monkeypatch.setattr(demo, "write_verdicts", lambda recs: judged.append(recs) or [tmp_path / "x.verdict.json"])
    acted = []  # the shipped AD model's closed-loop verdict (tests/report/test_ad_demo.py runs the real one)
    monkeypatch.setattr(demo.ad_demo, "closed_loop_verdict", lambda out, seed: acted.append(out) or
                        {"verdict": {"text": "none fits", "best": None}, "candidates": {}})
    (tmp_path / "rep").mkdir()  # an empty --out (a new one is the demo's own business, tested elsewhere)
    failed = demo.run_demo(demo.DemoConfig(out=tmp_path / "rep", quick=True, families=("sarsa",)))
    assert failed == 1
    assert [p.name for p in seen["inputs"]] == ["theta_star-sarsa"] and judged == []
    text = capsys.readouterr().out
    assert "1 failed" in text and "failed: " in text and "algorithm verdicts: skipped with --quick" in text
    (tmp_path / "rep2").mkdir()
    demo.run_demo(demo.DemoConfig(out=tmp_path / "rep2", quick=False, families=("sarsa",)))
    assert judged == [[]] and [p.name for p in seen["inputs"]] == ["theta_star-sarsa", "x.verdict.json",
                                                                    "ad-dark-room.verdict.json"]
    assert acted == [tmp_path / "rep2" / "inputs" / "ad-dark-room.verdict.json"]  # once, not with --quick

    from icrl_interp.commands import demo as demo_command

    monkeypatch.setattr(demo, "run_demo", lambda config: 1)
    assert demo_command.run(argparse.Namespace(_fields=[])) == 1


def test_demo_reports_the_shipped_runs_snapshots(tmp_path):
    """Snapshots under a shipped checkpoint are not shipped checkpoints themselves (the demo records only the
    final ones) but go to the report with them, so it draws metrics against training step."""
    cfg = D.config_for("sarsa")
    root = tmp_path / "checkpoints"
    final = D.write_checkpoint(root / "sarsa", cfg, D.theta_params(cfg))
    snaps = [D.write_checkpoint(root / "sarsa" / "snapshots" / f"step_{s:06d}", cfg, D.theta_params(cfg)) for s in (20, 10)]
    (root / "sarsa" / "snapshots" / "step_000030").mkdir()  # no checkpoint in it: ignored
    assert demo.shipped_checkpoints(root) == [final]
    assert demo.shipped_snapshots([final]) == sorted(snaps)
    assert demo.shipped_snapshots([]) == []
