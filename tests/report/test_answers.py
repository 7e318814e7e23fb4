"""The report leads with the answer: per model its verdict (label, fitted parameters with intervals, clear) and
its causal conclusion, before the metrics (`report.answers`), and a zoo's known answers as a confusion matrix
(`report.known_answers`). The JSON are read defensively: the newest keys when present, today's otherwise."""
from __future__ import annotations

import json
from pathlib import Path

from icrl_interp.report import answers, known_answers
from icrl_interp.report.batch import ReportInput, Result
from icrl_interp.report.headline import text_table
from icrl_interp.report.html import render


def _verdict(name: str, verdict: dict, output: dict | None = None) -> Result:
    row = {"best": verdict.get("best"), "fits": verdict.get("fits"), "best_r2": 0.9, "best_r2_ci": [0.8, 0.95],
           "runner_up": None, "margin": None, "margin_ci": None}
    doc = {"schema": "icrl_interp.verdict/1", "task": {"family": "linear-td"}, "verdict": verdict,
           "output": {"layer": "output", "verdict": row, **(output or {})}, "layers": [], "candidates": {}}
    return Result(ReportInput(Path(f"/x/{name}.json"), "verdict"), "ok", verdict=doc)


def _causal(name: str, section: dict) -> Result:
    doc = {"schema": "icrl_interp.causal/1", "source": "m.py:make", "causal": {"layer": 0, **section}}
    return Result(ReportInput(Path(f"/x/{name}.json"), "causal"), "ok", causal=doc)


NEW_VERDICT = {"best": "td0", "label": "td0", "runner_up": "td_lambda_0.5", "margin": 0.08, "margin_ci": [0.03, 0.11],
               "fits": True, "clear": True, "text": "td0 (margin ...)",
               "params": {"alpha": {"value": 0.5, "ci": [0.4, 0.7]}, "gamma": {"value": 0.9, "ci": [0.85, 0.95]}}}
NEW_CAUSAL = {"conclusion": "no", "conclusion_reason": "the selective direction moves the output no more than random"}


def test_verdict_and_causal_of_one_model_make_one_row_with_intervals_and_the_conclusion():
    rows = answers.answers([_verdict("torch_verdict", NEW_VERDICT), _causal("torch-causal", NEW_CAUSAL),
                            _causal("other.causal", {"conclusion": {"answer": "inconclusive", "reason": "more tasks"},
                                                     "task": {"family": "sarsa"}})])
    assert [r["model"] for r in rows] == ["torch", "other"]  # paired by name; the suffix spellings all strip
    torch_row, other = rows
    assert torch_row["verdict"] == "td0" and torch_row["clear"] == "yes"
    assert torch_row["params"] == "alpha 0.5 [0.4, 0.7], gamma 0.9 [0.85, 0.95]"
    assert torch_row["margin"] == "0.08 [0.03, 0.11] over td_lambda_0.5"
    adjusted = dict(NEW_VERDICT, margin_ci_adjusted=[-0.01, 0.2])  # the interval `clear` is decided on wins
    assert answers.answers([_verdict("a", adjusted)])[0]["margin"] == "0.08 [-0.01, 0.2] adjusted over td_lambda_0.5"
    assert torch_row["causal"] == "no (layer 0)" and torch_row["reason"].startswith("the selective direction")
    assert (other["verdict"], other["causal"], other["reason"]) == ("not run", "inconclusive (layer 0)", "more tasks")
    assert (torch_row["task"], other["task"]) == ("linear-td", "sarsa")  # the verdict's task, else the causal test's
    assert torch_row["verdict_text"] == "td0 (margin ...)"


def test_a_label_wins_over_best_and_none_fits_is_never_a_candidate():
    decoy = dict(NEW_VERDICT, label="reward regression (no bootstrapping)", clear=False)
    assert answers.answers([_verdict("d", decoy)])[0]["verdict"] == "reward regression (no bootstrapping)"
    old = {k: v for k, v in NEW_VERDICT.items() if k not in ("label", "params")}
    assert answers.answers([_verdict("a", dict(old, fits=False, best=None))])[0]["verdict"] == "none fits"
    none = answers.answers([_verdict("a", dict(old, fits=False))])[0]
    assert (none["verdict"], none["margin"]) == ("none fits", "—")  # best named anyway; no margin between misfits
    assert answers.answers([_verdict("b", old)])[0]["verdict"] == "td0"


def test_todays_keys_are_the_fallback():
    """No `params`: the output's fit of the best candidate, with `*_ci` where recorded and '(no interval)' where
    not; no `conclusion`: the random-init comparison, said to be only that."""
    old = {k: v for k, v in NEW_VERDICT.items() if k not in ("label", "params")}
    fit = {"hyperparameters": {"alpha": 0.5, "gamma": 0.9}, "hyperparameter_ci": {"alpha": [0.4, 0.6], "gamma": None},
           "step": 3, "step_ci": [2, 4]}
    causal = {"baseline": {"comparison": {"exceeds_random_init": "yes (intervals apart)"}}}
    (row,) = answers.answers([_verdict("m_verdict", old, {"behaviour": {"td0": fit}}), _causal("m_causal", causal)])
    assert row["params"] == "alpha 0.5 [0.4, 0.6], gamma 0.9 (no interval), step 3 [2, 4]"
    assert row["causal"] == "exceeds random init: yes (layer 0)"
    assert row["reason"].startswith("(intervals apart)") and "only the random-init comparison" in row["reason"]


def test_the_terminal_and_the_page_open_with_the_answers(tmp_path):
    results = [_verdict("torch_verdict", NEW_VERDICT), _causal("torch_causal", NEW_CAUSAL)]
    text = text_table(results)
    lines = text.splitlines()
    assert lines[0].startswith("which algorithm each model runs")
    assert lines[1].startswith("  torch (linear-td): td0 — clear; causal: no (layer 0)")
    assert text.index("alpha 0.5 [0.4, 0.7]") < text.index("probe sel.")  # before the metrics table
    assert "      margin 0.08 [0.03, 0.11] over td_lambda_0.5\n" in text and "td0 (margin ...)" not in text
    none = dict(NEW_VERDICT, label=None, fits=False, text="none fits: the closest candidate (td0) ...")
    assert "      none fits: the closest candidate (td0) ..." in text_table([_verdict("n", none)])  # why none fits
    page = render(results, [], tmp_path)
    assert page.index('id="answers"') < page.index("<h2>Overview</h2>") < page.index("<h2>All inputs</h2>")
    assert "alpha 0.5 [0.4, 0.7]" in page[:page.index("<h2>Overview</h2>")]
    bare = render([], [], tmp_path)  # no verdict: the page says how to get one
    assert "no verdict or causal JSON among the inputs" in bare and not text_table([]).startswith("which")


ZOO_ROWS = [
    {"truth": {"algorithm": "td0", "kind": "teacher"}, "verdict": {"best": "td0", "fits": True, "clear": True},
     "score": {"named_right": True, "right": False}},  # named, parameters outside: the zoo's `right` counts
    {"truth": {"algorithm": "td0", "kind": "teacher"}, "verdict": {"best": "td_lambda_0.5", "fits": True, "clear": False},
     "causal": {"conclusion": "yes"}},
    {"truth": {"algorithm": "immediate_reward", "decoy": True},
     "verdict": {"best": "td0", "fits": True, "clear": True, "label": "reward regression"}, "causal": {"conclusion": "yes"}},
    {"truth": "mean_reward", "kind": "decoy", "verdict": {"best": "td0", "fits": False}, "causal": "no"},
]


def test_a_zoo_is_a_confusion_matrix_with_its_clear_wrong_verdicts(tmp_path):
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    (zoo / "zoo.json").write_text(json.dumps({"rows": ZOO_ROWS}))
    (tmp_path / "other.json").write_text(json.dumps({"schema": "x"}))  # not a zoo: no rows
    (tmp_path / "entry").mkdir()  # a trained zoo entry's own zoo.json (its ground truth), not a zoo's results
    (tmp_path / "entry" / "zoo.json").write_text(json.dumps({"truth": {"algorithm": "td0"}}))
    found = known_answers.find([zoo, tmp_path / "other.json", zoo / "zoo.json", tmp_path / "entry"])
    assert [p for p, _ in found] == [zoo / "zoo.json"]  # the dir and the file name the same zoo once
    truths, verdicts, counts, totals = known_answers.confusion(found[0][1])
    assert truths == ["decoy: immediate_reward", "decoy: mean_reward", "td0"]
    assert verdicts == ["none fits", "reward regression", "td0", "td_lambda_0.5"]
    assert counts[("td0", "td0")] == 1 and counts[("td0", "td_lambda_0.5")] == 1
    assert counts[("decoy: mean_reward", "none fits")] == 1
    assert counts[("decoy: immediate_reward", "reward regression")] == 1
    assert totals == {"models": 4, "right": 2, "clear and wrong": 1, "decoys with causal yes": 1}
    page = render([], [], tmp_path, zoos=found)
    assert page.index('id="known-answers"') < page.index("<h2>Overview</h2>") and "clear and wrong: 1" in page
    assert '<tr><td class="l">td0</td><td></td><td></td><td>1</td><td>1</td></tr>' in page  # the matrix's td0 row
    assert "clear and wrong 1" in text_table([], zoos=found)
    # a zoo alone is not an input to analyze; a folder that also holds a recording still is
    assert known_answers.without_zoos([zoo, zoo / "zoo.json", tmp_path / "other.json"]) == [tmp_path / "other.json"]
    (zoo / "m.h5").write_bytes(b"not read here")
    assert known_answers.without_zoos([zoo]) == [zoo]
