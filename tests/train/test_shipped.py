"""The shipped checkpoints in data/checkpoints/: each reproduces its paper's numbers (measured here on
fresh held-out tasks and by `analyze`, within the tolerances docs/reproductions.md states), its
final_metrics.json says what it measures, and each is reproducible from its training config (the
real reproductions rerun under `-m slow`; the tiny softmax-td configuration in the default run)."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from icrl_interp import checkpoint
from icrl_interp.analyzers import analyze
from icrl_interp.train import config_from_dict, recipe, train

DATA = Path(__file__).resolve().parents[2] / "data" / "checkpoints"
REAL = ["linear-td", "sarsa"]
"""Full-size reproductions (tens of seconds of training each)."""
TINY = ["softmax-td"]
"""Tiny configurations (seconds)."""


def _config(family: str, **changes):
    data = json.loads((DATA / family / "train_config.json").read_text())
    return config_from_dict({**data, **changes})


def _shipped(family: str) -> dict:
    return json.loads((DATA / family / "final_metrics.json").read_text())


def _close(a, b, rel, abs_):
    if isinstance(a, dict):
        return all(_close(a[k], b[k], rel, abs_) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, rel, abs_) for x, y in zip(a, b))
    if isinstance(a, str) or a is None:
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Re-run every shipped tiny configuration once (about 5-10 s each)."""
    return {f: train(_config(f), tmp_path_factory.mktemp(f), progress=False) for f in TINY}


def _check_rerun(family: str, run) -> None:
    shipped = _shipped(family)
    # the config, and so its hash, is unchanged: the run is the shipped run
    assert run.final_metrics["run_id"] == shipped["run_id"] == checkpoint.load(DATA / family).origin["run_id"]
    # Same machine: identical. Other BLAS builds may differ in the last float32 bits, so allow a margin
    # (sarsa's relative errors of ~7e-7 are float32 noise: compared to 1e-6 absolute).
    tiny_abs = 1e-6 if family == "sarsa" else 1e-3
    assert _close({k: v for k, v in shipped.items() if k != "run_id"},
                  {k: v for k, v in run.final_metrics.items() if k != "run_id"}, rel=0.02, abs_=tiny_abs)
    want = load_file(str(DATA / family / "model.safetensors"))
    got = {k: p.detach().numpy() for k, p in run.model.named_parameters()}
    assert all(np.allclose(got[k], want[k], rtol=1e-2, atol=1e-3) for k in want)
    assert checkpoint.load(DATA / family).origin["kind"] == "trained"


@pytest.mark.parametrize("family", TINY)
def test_rerun_reproduces_the_shipped_tiny_checkpoint(family, tiny_runs):
    _check_rerun(family, tiny_runs[family])


@pytest.mark.slow
@pytest.mark.parametrize("family", REAL)
def test_rerun_reproduces_the_shipped_reproduction(family, tmp_path):
    _check_rerun(family, train(_config(family), tmp_path, progress=False))


def _evaluate(family: str, tasks: int, seed: int = 2026) -> dict:
    """The family's held-out evaluation of the shipped weights on fresh tasks (not the training run's)."""
    cfg = _config(family, eval_tasks=tasks)
    return recipe(family).evaluate(checkpoint.load(DATA / family), cfg, np.random.default_rng(seed))


def test_shipped_sarsa_reproduces_liang_lai_full_row():
    """Paper (b), full SARSA: raw relative errors < 0.015 (P12) and < 0.012 (V21bar) after the best c,
    lazy blocks exactly 0, loss -> machine precision; measured 7e-7 / 6e-7 (float32)."""
    cfg = _config("sarsa")
    assert cfg.sa_features == "gaussian" and cfg.d == 36  # random features (Assumption 1)
    m = _evaluate("sarsa", 64)
    assert m["rel_err_P12"] < 1e-5 and m["rel_err_V21"] < 1e-5  # paper: < 0.015 / < 0.012
    assert m["lazy_P22"] == 0.0 and m["lazy_V22"] == 0.0
    assert m["loss_relative_to_update"] < 1e-10
    shipped = _shipped("sarsa")
    assert shipped["rel_err_P12"] == pytest.approx(m["rel_err_P12"], rel=1e-9)  # weights only: same numbers
    # analyze reads the same weights the same way: V21's unread row apart, not in the headline error
    w = analyze(DATA / "sarsa")["weights"]
    mf = w["manifold"]
    assert mf["rel_err"]["P12"] == pytest.approx(m["rel_err_P12"], rel=1e-9)
    assert mf["rel_err"]["V21"] == pytest.approx(m["rel_err_V21"], rel=1e-9)
    assert mf["unidentifiable"]["V21"]["rel_err_all_rows"] == pytest.approx(shipped["rel_err_V21_all_rows"], rel=1e-9)
    assert mf["unidentifiable"]["V21"]["rel_err_all_rows"] > 100 * mf["rel_err"]["V21"]  # the init of that row
    assert w["block_sparsity"]["lazy_drift"] == 0.0


def test_shipped_linear_td_reproduces_wang():
    """Paper (c): held-out SS = IWS and VD against batch TD at the fitted step reach (c)'s own code's quality
    (SS 0.979, VD 0.0103); P's bottom-right entry dominates and Q ~ (-c I, +c' I). Measured on 1024 fresh
    tasks (483 scored): SS 0.984, VD 0.0075 (other seeds: 0.979-0.984, 0.0074-0.0087)."""
    m = _evaluate("linear-td", 1024)
    shipped = _shipped("linear-td")
    assert m["SS"] >= shipped["SS"] - 0.01 and m["SS"] > 0.975 and m["VD"] < 0.0105
    assert m["IWS"] == pytest.approx(m["SS"], abs=1e-6)  # linear in the query: SS = IWS
    assert 0.5 < m["alpha_fit"] < 2.0 and m["msve_tf"] < 1.01 * m["msve_td"]
    pq = m["layers"][0]
    assert pq["P_last"] > 5 * pq["P_others_mean_abs"]  # one dominant bottom-right entry of P
    assert pq["Q_tl_trace"] < 0 < pq["Q_tr_trace"]  # Q ~ (-c I, +c' I)


def _losses(run):
    return [json.loads(x)["loss"] for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_xie_tiny_neu_falls_and_sign_pattern_emerges(tiny_runs):
    run = tiny_runs["softmax-td"]
    losses = _losses(run)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) / 5  # NEU falls by at least 5x
    m = run.final_metrics
    assert m["layers"][0]["sign_pattern"] == "+,+,-"
    errs = m["value_error_inf_by_depth"]
    assert all(b < a for a, b in zip(errs, errs[1:]))  # value error decreases with depth
