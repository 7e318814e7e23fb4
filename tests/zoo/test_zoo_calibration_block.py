"""The zoo run's interval calibration (`zoo.run.calibration_block`, docs/zoo.md "Reading zoo.json"): the full set
runs the simulation of zoo/calibration.py, stores it in DIR/calibration.json (resumed by fingerprint), and its pooled
coverage -- never the noise-free rows' -- decides the coverage target; the command and the report print it."""
from __future__ import annotations

import json

import pytest

from icrl_interp import cli
from icrl_interp.core.outputs import is_ours
from icrl_interp.report import known_answers
from icrl_interp.zoo import calibration as K
from icrl_interp.zoo import registry as R
from icrl_interp.zoo import run as Z

from .test_zoo_run import TINY, _row

TARGET = "coverage_in_0.90_0.99"
TINY_CAL = {"calibration_replicates": 1, "calibration_tasks": 30}


def _calibration(covered: int, checked: int, seed: int = 0) -> dict:
    """A calibration as `calibrate` returns it, with one cell of one parameter: `covered` of `checked` replicates."""
    p = {"replicates": checked, "covered": covered, "coverage": covered / checked,
         "coverage_ci": K.wilson(covered, checked), "wrong_value_covered": 0.0, "median_width": 0.2}
    cells = [{"teacher": dict(K.TEACHERS[0]), "truth": K.truth_of(K.TEACHERS[0]), "noise": 0.3,
              "parameters": {"alpha": p}}]
    return {"schema": K.SCHEMA, "versions": {}, "seed": seed, "settings": {**K.SETTINGS, "replicates": checked},
            "noises": [0.3], "target": list(K.TARGET), "cells": cells, "summary": K.summarize(cells),
            "seconds": 1.0, "cpu_seconds": 1.0}


def _fake_calibrate(calls: list):
    def fake(replicates, seed=0, tasks=None, progress=False):
        calls.append((replicates, seed, tasks))
        return _calibration(95, 100, seed)
    return fake


def test_the_coverage_target_is_the_calibrations_never_the_noise_free_rows():
    """Rows whose every interval holds the truth (100 %, as the noise-free teachers' do) with a calibration at 95 %:
    the target holds; the same rows with a calibration at 80 %: it fails; rows at 95 % without a calibration: not
    measured (None). Mutant: the target read from the rows' coverage (false, false, true)."""
    full = [_row("a", "td0", "td0", inside=(True, True, True)), _row("b", "lstd", "lstd", inside=(True,))]
    s = Z.summarize(full, _calibration(95, 100))
    assert s["interval_coverage_noise_free"] == 1.0 and s["targets"][TARGET] is True  # 4/4: exact
    assert (s["calibration_covered"], s["calibration_checked"]) == (95, 100)
    assert s["calibration_coverage"] == pytest.approx(0.95, abs=1e-15)
    assert s["calibration_coverage_ci"] == pytest.approx(K.wilson(95, 100), abs=1e-15)
    assert Z.summarize(full, _calibration(80, 100))["targets"][TARGET] is False
    mostly = [_row(f"r{i}", "td0", "td0", inside=(i > 0,)) for i in range(20)]  # 19 / 20 = 95 %
    none = Z.summarize(mostly)
    assert none["interval_coverage_noise_free"] == pytest.approx(0.95, abs=1e-15)
    assert none["targets"][TARGET] is None and none["calibration_coverage"] is None
    assert Z.summarize(mostly, _calibration(80, 100))["targets"][TARGET] is False


def test_a_resumed_run_reuses_a_matching_calibration_and_recomputes_a_stale_or_broken_one(tmp_path, monkeypatch):
    """One real (tiny) calibration, stored in DIR/calibration.json and carried into zoo.json; run again, it is
    reused; another zoo seed, other replicates or a broken file are recomputed. Mutant: the fingerprint ignored
    (a stale calibration reused)."""
    monkeypatch.setattr(K, "NOISES", (0.3,))  # one cell: the plumbing, not the numbers
    monkeypatch.setattr(K, "TEACHERS", K.TEACHERS[:1])
    first = Z.run(tmp_path, "full", 0, progress=False, only=[], settings=TINY_CAL)
    cal, stored = first["calibration"], json.loads((tmp_path / Z.CALIBRATION_FILE).read_text())
    assert cal == {k: stored[k] for k in Z.CALIBRATION_KEYS} and "versions" not in cal
    assert (cal["seed"], cal["settings"]["replicates"], cal["settings"]["tasks"]) == (0, 1, 30)
    pooled = cal["summary"]["overall"]
    assert pooled["checked"] == len(cal["cells"][0]["parameters"]) >= 3  # 1 replicate x each parameter
    assert first["summary"]["calibration_coverage"] == pooled["coverage"]
    assert json.loads((tmp_path / "zoo.json").read_text())["calibration"] == cal

    calls = []
    monkeypatch.setattr(K, "calibrate", _fake_calibrate(calls))
    assert Z.run(tmp_path, "full", 0, progress=False, only=[], settings=TINY_CAL)["calibration"] == cal
    assert calls == []  # reused
    Z.run(tmp_path, "full", 1, progress=False, only=[], settings=TINY_CAL)  # a fresh zoo: fresh replicates
    assert calls == [(1, 1, 30)]
    Z.run(tmp_path, "full", 1, progress=False, only=[], settings=TINY_CAL)
    assert len(calls) == 1  # the fresh zoo's is reused in turn
    Z.run(tmp_path, "full", 1, progress=False, only=[], settings={**TINY_CAL, "calibration_replicates": 2})
    assert calls[-1] == (2, 1, 30)
    (tmp_path / Z.CALIBRATION_FILE).write_text('{"fingerprint": ')  # cut short
    again = Z.run(tmp_path, "full", 1, progress=False, only=[], settings={**TINY_CAL, "calibration_replicates": 2})
    assert len(calls) == 3 and again["summary"]["calibration_covered"] == 95
    assert not list(tmp_path.glob("*.tmp"))


def test_rows_do_not_depend_on_the_calibration_settings():
    """A stored row stays valid when only the calibration's settings differ (rows judged before they existed are
    reused). Mutant: the calibration keys in the row's fingerprint."""
    entry = R.entries("default")[0]
    assert Z.fingerprint(entry, {**TINY, **TINY_CAL}) == Z.fingerprint(entry, TINY)
    assert Z.fingerprint(entry, {**TINY, "tasks": 49}) != Z.fingerprint(entry, TINY)


def test_rows_judged_under_other_thresholds_are_judged_again(monkeypatch):
    """A stored row holds the answers of the thresholds it was judged under: changing a frozen threshold (here the
    causal conclusion's input share) changes the row's fingerprint, so a resumed run does not reuse a stale answer.
    Mutant: the thresholds left out of the fingerprint."""
    from icrl_interp.interventions import conclusion

    entry = R.entries("default")[0]
    before = Z.fingerprint(entry, TINY)
    monkeypatch.setitem(conclusion.THRESHOLDS, "input_share", 0.75)
    assert Z.thresholds()["causal.conclusion"]["input_share"] == 0.75
    assert Z.fingerprint(entry, TINY) != before


def test_the_default_set_runs_no_calibration_and_the_full_set_does(tmp_path, monkeypatch):
    """The default set (in the test suite: fast) writes no calibration and leaves the target unmeasured; the full set
    asks for its replicates, seeded with the zoo seed. Mutants: a calibration in the default set, none in the full."""
    calls = []
    monkeypatch.setattr(K, "calibrate", _fake_calibrate(calls))
    d = Z.run(tmp_path / "d", "default", 0, progress=False, only=[])
    assert d["calibration"] is None and d["summary"]["targets"][TARGET] is None and calls == []
    assert not (tmp_path / "d" / Z.CALIBRATION_FILE).exists()
    f = Z.run(tmp_path / "f", "full", 3, progress=False, only=[])
    assert calls == [(Z.SETTINGS["full"]["calibration_replicates"], 3, None)] and calls[0][0] >= 1
    assert f["summary"]["targets"][TARGET] is True and (tmp_path / "f" / Z.CALIBRATION_FILE).is_file()


def test_zoo_run_full_prints_the_coverage_and_draws_it_and_the_report_shows_it(tmp_path, monkeypatch, capsys):
    """`zoo run --set full` (one entry, judged by a stand-in; the calibration a canned 3131 / 3200) prints the pooled
    coverage with its Wilson interval and writes calibration.png beside zoo.json; the report's known-answers section
    carries the same line, and a zoo without a calibration carries none."""
    calls, real = [], R.entries
    monkeypatch.setattr(K, "calibrate", lambda replicates, seed=0, tasks=None, progress=False:
                        calls.append(seed) or _calibration(3131, 3200))
    monkeypatch.setattr(R, "entries", lambda name, seed=0: real("default", seed)[:1])
    monkeypatch.setattr(Z, "judge", lambda entry, settings: {
        **_row(entry.name, "td0", "td0", inside=(True,)), "seconds": 0.1, "cpu_seconds": 0.1})
    out = tmp_path / "zoo"
    assert cli.main(["zoo", "run", "--out", str(out), "--set", "full", "--no-progress"]) == 0
    line = "3131/3200 intervals cover the truth (97.8%, Wilson 95% [97.3%, 98.3%])"  # as docs/zoo.md measured it
    printed = capsys.readouterr().out
    assert line in printed and str(out / "calibration.png") in printed and calls == [0]
    assert is_ours(out / "calibration.png") and is_ours(out / "confusion.png")
    found = known_answers.find([out])
    assert line in known_answers.text(found) and line in known_answers.html_section(found)
    doc = json.loads((out / "zoo.json").read_text())
    doc.pop("calibration")
    assert known_answers.calibration_text(doc) == "" and "intervals cover" not in known_answers.text([(out, doc)])
