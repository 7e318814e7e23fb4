"""The zoo's table (registry), the scoring of the verdict's answers against the truth, zoo.json and its figure,
resuming, and the `zoo run` command's one-line errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from icrl_interp import cli
from icrl_interp.core.outputs import is_ours
from icrl_interp.families import registry as families
from icrl_interp.verdicts.candidates import CANDIDATES
from icrl_interp.zoo import registry as R
from icrl_interp.zoo import run as Z

TINY = {"tasks": 48, "bootstrap": 40, "causal_tasks": 32, "random_draws": 4, "max_step": 4}


# ------------------------------------------------------------------ the table
def test_full_zoo_has_enough_models_and_decoys_with_known_truths():
    full = R.entries("full")
    assert len(full) >= 24 and sum(e.truth.decoy for e in full) >= 8
    assert {e.name for e in R.entries("default")} < {e.name for e in full}
    for e in full:
        assert e.family in families.names()
        if not e.truth.decoy:
            assert e.truth.algorithm in CANDIDATES, e.name  # the verdict's own candidate names
            assert e.truth.right() == (e.truth.algorithm,)
        else:
            assert set(e.truth.right()) == {R.NONE_FITS, R.REWARD_REGRESSION}
    wrong_discount = [e for e in full if e.truth.algorithm == "td0" and e.truth.params["gamma"] == 0.5]
    assert wrong_discount and all(e.config().model.gamma == 0.9 for e in wrong_discount)  # gamma' != the task's


def test_a_fresh_zoo_draws_other_step_sizes_and_seeds_but_the_same_models():
    z0, z1 = R.builtin(0), R.builtin(1)  # the providers' trained entries exist for the seeds they were trained with
    assert [e.name for e in z0] == [e.name for e in z1]
    assert not {e.seed for e in z0} & {e.seed for e in z1}
    moved = [(a.truth.params["alpha"], b.truth.params["alpha"]) for a, b in zip(z0, z1) if "alpha" in a.truth.params]
    assert moved and all(x != y and abs(np.log(y / x)) <= R.JITTER for x, y in moved)
    assert z0[0].truth.params["alpha"] == 1.0  # seed 0: the table's values (exact: copied, not computed)
    assert [e.truth.params for e in R.builtin(1)] == [e.truth.params for e in z1]  # reproducible


def test_unknown_set_and_bad_seed_are_user_errors():
    from icrl_interp.core.errors import UserError

    with pytest.raises(UserError, match="--set"):
        R.entries("most")
    with pytest.raises(UserError, match="--zoo-seed"):
        R.entries("full", -1)


# ------------------------------------------------------------------ scoring
def test_labels_and_conclusions_are_read_before_and_after_the_api_changes():
    assert Z.label_of({"verdict": {"label": R.REWARD_REGRESSION, "best": "td0", "fits": True}}) == R.REWARD_REGRESSION
    assert Z.label_of({"verdict": {"best": "td0", "fits": True}}) == "td0"
    assert Z.label_of({"verdict": {"best": "td0", "fits": False}}) == R.NONE_FITS
    assert Z.conclusion_of({"conclusion": "inconclusive", "conclusion_reason": "few tasks"}) == ("inconclusive",
                                                                                                  "few tasks")
    old = {"baseline": {"comparison": {"exceeds_random_init": "yes: intervals do not overlap"}}}
    assert Z.conclusion_of(old)[0] == "yes"
    assert Z.conclusion_of(None) == (None, None)


def test_params_inside_intervals_is_inclusive_and_matches_aliases():
    got = Z.params_inside({"alpha": 1.0, "gamma": 0.5, "beta": 2.0},
                          {"alpha": {"value": 1.0, "ci": [1.0, 1.0]}, "gamma_prime": {"value": 0.6, "ci": [0.55, 0.7]},
                           "beta": {"value": 2.0, "ci": None}})
    assert got["alpha"]["inside"] is True  # an interval [1, 1] holds the grid value 1
    assert got["gamma"]["inside"] is False  # 0.5 < 0.55
    assert "beta" not in got  # no interval: not checked


def test_score_counts_clear_wrong_and_decoys():
    td = R.Truth("td0", {"alpha": 1.0})
    dec = R.Truth("last_reward", decoy=True, accepted=(R.REWARD_REGRESSION, R.NONE_FITS))
    assert Z.score(td, "td_lambda_0.5", True, {}, None)["clear_wrong"] is True
    assert Z.score(td, "td0", True, {"alpha": {"inside": False}}, "yes") == {
        "named_right": True, "params_checked": 1, "params_inside": 0, "right": False, "clear_wrong": False,
        "causal_right": True}
    assert Z.score(dec, R.NONE_FITS, False, {}, "yes")["causal_right"] is False  # a decoy is never "yes"
    assert "causal_right" not in Z.score(td, "td0", False, {}, "no", kind="exact")  # reported, not scored
    assert Z.score(dec, "td0", True, {}, "no")["clear_wrong"] is True


def _row(name, algo, label, decoy=False, clear=False, inside=(), conclusion=None, kind="exact"):
    truth = R.Truth(algo, decoy=decoy, accepted=(R.NONE_FITS, R.REWARD_REGRESSION) if decoy else ())
    pv = {f"p{i}": {"inside": x} for i, x in enumerate(inside)}
    return {"name": name, "kind": kind, "truth": {"algorithm": algo, "decoy": decoy}, "verdict": {"label": label},
            "params_vs_truth": pv, "causal": None if conclusion is None else {"conclusion": conclusion},
            "score": Z.score(truth, label, clear, pv, conclusion, kind)}


def test_summary_and_confusion_count_what_they_say():
    rows = [_row("a", "td0", "td0", inside=(True, True), conclusion="yes", kind="trained"),
            _row("b", "td0", "td_lambda_0.5", clear=True, conclusion="no", kind="trained"),
            _row("c", "lstd", "lstd", inside=(False,)),
            _row("d", "last_reward", R.NONE_FITS, decoy=True, conclusion="yes"),
            _row("e", "immediate_reward", R.REWARD_REGRESSION, decoy=True)]
    s = Z.summarize(rows)
    assert (s["models"], s["decoys"], s["non_decoys_right"], s["decoys_refused"], s["clear_wrong"]) == (5, 2, 1, 2, 1)
    assert s["accuracy_non_decoys"] == pytest.approx(1 / 3) and s["named_right_non_decoys"] == pytest.approx(2 / 3)
    assert s["interval_coverage_noise_free"] == pytest.approx(2 / 3) and s["causal_yes_rate_trained_targets"] == 0.5
    assert (s["causal_decoys_yes"], s["decoys_reward_regression"]) == (1, 1)
    assert s["failures"] == ["b", "c"] and s["targets"]["no_clear_wrong"] is False
    conf = Z.confusion(rows)
    cell = lambda y, x: conf["counts"][conf["rows"].index(y)][conf["columns"].index(x)]  # noqa: E731
    assert cell("td0", "td0") == 1 and cell("td0", "td_lambda_0.5") == 1
    assert cell("decoy: last_reward", R.NONE_FITS) == 1
    assert sum(map(sum, conf["counts"])) == 5 and conf["columns"][-2:] == [R.NONE_FITS, R.REWARD_REGRESSION]


# ------------------------------------------------------------------ running
def test_run_writes_zoo_json_and_the_figure_and_resumes(tmp_path, monkeypatch):
    """Two entries with tiny settings, through the real verdict and causal test: the schema, the rows, the figure;
    a second run reuses the stored rows (judge is not called again)."""
    from icrl_interp.report.zoo import write_figure

    names = ["td0_a1_k2_L1", "decoy_last_reward"]
    result = Z.run(tmp_path, "full", 0, progress=False, only=names, settings=TINY)
    data = json.loads((tmp_path / "zoo.json").read_text())
    assert data["schema"] == Z.SCHEMA and data == json.loads(json.dumps(result))
    assert [r["name"] for r in data["rows"]] == names and data["thresholds"]["verdict.min_r2"] == 0.5
    for row in data["rows"]:
        assert {"truth", "verdict", "causal", "probe", "score", "params_vs_truth"} <= set(row)
        assert row["verdict"]["label"] and isinstance(row["verdict"]["clear"], bool)
    assert data["rows"][0]["causal"] is None and data["rows"][1]["causal"]["layer"] == 0  # a one-layer model: no test
    assert data["summary"]["models"] == 2 and sum(map(sum, data["confusion"]["counts"])) == 2
    cpu = [r["cpu_seconds"] for r in data["rows"]]
    assert all(c > 0 for c in cpu) and data["row_cpu_seconds"] == pytest.approx(sum(cpu), abs=0.051)  # rounded to 0.1
    png = write_figure(data, tmp_path / "confusion.png")
    assert png.read_bytes().startswith(b"\x89PNG") and is_ours(png)

    monkeypatch.setattr(Z, "judge", lambda *a, **k: pytest.fail("a stored row was judged again"))
    again = Z.run(tmp_path, "full", 0, progress=False, only=names, settings=TINY)
    assert again["rows"] == result["rows"]


def test_judging_runs_on_one_thread_and_restores_the_pools(monkeypatch):
    """The zoo's many small forward passes and fits run on one torch and one BLAS thread (two threads on the loaded
    2-core machine cost 25x the CPU of one), and the pools are given back afterwards, also on an error. Mutants:
    no cap, or no restore."""
    import torch
    from threadpoolctl import threadpool_info

    monkeypatch.delenv("ICRL_INTERP_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = []

    def fake(entry, settings, progress):
        seen.append((torch.get_num_threads(), {p["num_threads"] for p in threadpool_info()}))
        raise RuntimeError("stop")

    monkeypatch.setattr(Z, "_judge", fake)
    try:
        with pytest.raises(RuntimeError, match="stop"):
            Z.judge(R.entries("default")[0], TINY)
        assert seen == [(1, {1})] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_default_set_runs_from_the_command_line(tmp_path):
    """The whole default set with its own settings (about a minute on an idle 2-core machine)."""
    out = tmp_path / "zoo"
    assert cli.main(["zoo", "run", "--out", str(out), "--no-progress"]) == 0
    data = json.loads((out / "zoo.json").read_text())
    assert {r["name"] for r in data["rows"]} == {e.name for e in R.entries("default")}
    assert (out / "confusion.png").is_file() and data["summary"]["clear_wrong"] == 0


def test_command_user_errors_are_one_line(tmp_path, capsys):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for argv, needle in ((["--out", str(tmp_path / "z"), "--zoo-seed", "-1"], "--zoo-seed"),
                         (["--out", str(tmp_path / "no" / "z")], "does not exist"),
                         (["--out", str(foreign)], "not a zoo directory")):
        assert cli.main(["zoo", "run", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1
    assert (foreign / "notes.txt").read_text() == "mine" and not (tmp_path / "z").exists()
