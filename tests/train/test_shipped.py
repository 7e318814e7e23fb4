"""The shipped checkpoints in data/checkpoints/: each reproduces its paper's numbers (measured here on
fresh held-out tasks and by `analyze`, within the tolerances docs/reproductions.md states), its
final_metrics.json says what it measures, its training snapshots belong to the same run, and each is
reproducible from its training config (reruns under `-m slow`; a tiny softmax-td configuration in the
default run checks Xie's emergence in seconds)."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from icrl_interp.models import checkpoint
from icrl_interp.analyzers import analyze
from icrl_interp.train import config_from_dict, list_checkpoints, recipe, train

DATA = Path(__file__).resolve().parents[2] / "data" / "checkpoints"
REAL = ["linear-td", "sarsa", "softmax-td", "actor-critic"]
"""Full-size reproductions (tens of seconds to minutes of training each)."""
TINY_SOFTMAX = dict(family="softmax-td", steps=800, seed=0, lr=0.03, checkpoint_every=200, eval_tasks=64, n_states=4,
                    beta=1.0, n=20, n_layers=3, gamma=0.9, tied=True, form="tsm", objective="neu", masks=True,
                    tasks_per_step=32)
"""A tiny softmax-td configuration (about 5 s): NEU falls and Xie's sign pattern emerges."""


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
def tiny_softmax(tmp_path_factory):
    return train(config_from_dict(TINY_SOFTMAX), tmp_path_factory.mktemp("softmax-td"), progress=False)


def _check_rerun(family: str, run) -> None:
    shipped = _shipped(family)
    # the config, and so its hash, is unchanged: the run is the shipped run
    assert run.final_metrics["run_id"] == shipped["run_id"] == checkpoint.load(DATA / family).origin["run_id"]
    # Same machine: identical. Other BLAS builds may differ in the last float32 bits, so allow a margin
    # (sarsa's relative errors of ~7e-7 are float32 noise: compared to 1e-6 absolute).
    tiny_abs = 1e-6 if family in ("sarsa", "actor-critic") else 1e-3
    assert _close({k: v for k, v in shipped.items() if k != "run_id"},
                  {k: v for k, v in run.final_metrics.items() if k != "run_id"}, rel=0.02, abs_=tiny_abs)
    want = load_file(str(DATA / family / "model.safetensors"))
    got = {k: p.detach().numpy() for k, p in run.model.named_parameters()}
    assert all(np.allclose(got[k], want[k], rtol=1e-2, atol=1e-3) for k in want)
    assert checkpoint.load(DATA / family).origin["kind"] == "trained"
    # and every shipped snapshot is the run's checkpoint at its step
    ckpts = dict(list_checkpoints(run.run_dir))
    for snap in _snapshots(family):
        got = load_file(str(ckpts[checkpoint.load(snap).origin["step"]] / "model.safetensors"))
        want = load_file(str(snap / "model.safetensors"))
        assert all(np.allclose(got[k], want[k], rtol=1e-2, atol=1e-3) for k in want)


def _snapshots(family: str) -> list[Path]:
    return sorted((DATA / family / "snapshots").glob("step_*"))


@pytest.mark.parametrize("family", REAL)
def test_snapshots_are_earlier_checkpoints_of_the_shipped_run(family):
    """Each shipped run carries a handful of training snapshots for the report's metrics-over-training view:
    the same run id, steps at the run's checkpoint interval before the final step, different weights."""
    final = checkpoint.load(DATA / family).origin
    every = _config(family).checkpoint_every
    snaps = _snapshots(family)
    assert len(snaps) >= 3
    steps = []
    for snap in snaps:
        origin = checkpoint.load(snap).origin
        assert origin["run_id"] == final["run_id"] and origin["kind"] == "trained"
        assert snap.name == f"step_{origin['step']:06d}" and origin["step"] % every == 0
        assert (snap / "model.safetensors").read_bytes() != (DATA / family / "model.safetensors").read_bytes()
        steps.append(origin["step"])
    assert steps == sorted(steps) and steps[-1] < final["step"]


@pytest.mark.slow
@pytest.mark.parametrize("family", REAL)
def test_rerun_reproduces_the_shipped_reproduction(family, tmp_path):
    _check_rerun(family, train(_config(family), tmp_path, progress=False))


def _evaluate(family: str, tasks: int, seed: int = 2026, path: Path | None = None) -> dict:
    """The family's held-out evaluation of the shipped weights (or a snapshot's) on fresh tasks (not the
    training run's)."""
    cfg = _config(family, eval_tasks=tasks)
    return recipe(family).evaluate(checkpoint.load(path or DATA / family), cfg, np.random.default_rng(seed))


def test_shipped_sarsa_reproduces_liang_lai_full_row():
    """Paper (b), full SARSA: raw relative errors < 0.015 (P12) and < 0.012 (V21bar) after the best c,
    lazy blocks exactly 0, loss -> machine precision; measured 7e-7 / 6e-7 (float32)."""
    cfg = _config("sarsa")
    assert cfg.sa_features == "gaussian" and cfg.d == 36  # random features (Assumption 1)
    m = _evaluate("sarsa", 64)
    assert m["rel_err_P12"] < 1e-5 and m["rel_err_V21"] < 1e-5  # paper: < 0.015 / < 0.012
    assert m["lazy_P22"] == 0.0 and m["lazy_V22"] == 0.0  # exact: the trainer masks them to literal zeros
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
    assert w["block_sparsity"]["lazy_drift"] == 0.0  # exact: the trainer masks the lazy blocks to literal zeros


def test_shipped_linear_td_reproduces_wang():
    """Paper (c): held-out SS = IWS and VD against batch TD at the fitted step pass (c)'s own code's quality
    (SS 0.979, VD 0.0103), and P is sparser than (c)'s (other entries 0.093 there); P's bottom-right entry
    dominates and Q ~ (-c I, +c' I). Measured on 1024 fresh tasks: SS 0.990, VD 0.0042 (other seeds:
    0.987-0.989, 0.0041), P others 0.046."""
    m = _evaluate("linear-td", 1024)
    shipped = _shipped("linear-td")
    assert m["SS"] >= shipped["SS"] - 0.01 and m["SS"] > 0.975 and m["VD"] < 0.0105
    assert m["IWS"] == pytest.approx(m["SS"], abs=1e-6)  # linear in the query: SS = IWS
    assert 0.5 < m["alpha_fit"] < 2.0 and m["msve_tf"] < 1.01 * m["msve_td"]
    pq = m["layers"][0]
    assert pq["P_last"] > 5 * pq["P_others_mean_abs"]  # one dominant bottom-right entry of P
    assert pq["P_others_mean_abs"] < 0.093  # as sparse as (c)'s P, or sparser
    assert pq["Q_tl_trace"] < 0 < pq["Q_tr_trace"]  # Q ~ (-c I, +c' I)
    # emergence: the first snapshot (step 25) is far from batch TD on the same tasks
    early = _evaluate("linear-td", 1024, path=_snapshots("linear-td")[0])
    assert early["SS"] < m["SS"] - 0.05 and early["VD"] > 2 * m["VD"]


def _losses(run):
    return [json.loads(x)["loss"] for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_xie_tiny_neu_falls_and_sign_pattern_emerges(tiny_softmax):
    run = tiny_softmax
    losses = _losses(run)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) / 5  # NEU falls by at least 5x
    m = run.final_metrics
    assert m["layers"][0]["sign_pattern"] == "+,+,-"
    errs = m["value_error_inf_by_depth"]
    assert all(b < a for a, b in zip(errs, errs[1:]))  # value error decreases with depth


def test_shipped_softmax_td_reaches_xie_assumption_5_1():
    """Paper (a): the trained kernel passes the Assumption 5.1 margin min_s M(s, s) > (1 + gamma)/2 on average
    over fresh tasks (gamma = 0.5), with the (+, +, -) value row and a value error falling with depth; the
    first snapshot (step 200) is still below the margin (emergence)."""
    m = _evaluate("softmax-td", 256)
    layer = m["layers"][0]
    assert layer["margin"] > 0 and layer["kernel_diag_min"] > 0.75 and layer["sign_pattern"] == "+,+,-"
    errs = m["value_error_inf_by_depth"]
    assert all(b < a for a, b in zip(errs, errs[1:]))
    # the snapshot on 64 tasks: still below the margin, i.e. negative (measured -0.075 on 256 tasks; -0.053 to -0.085
    # on 4 seeds of 64, standard deviation 0.015: 0 is 5 of them away); the final weights on these 64 tasks: +0.005
    early = _evaluate("softmax-td", 64, path=_snapshots("softmax-td")[0])["layers"][0]
    assert early["margin"] < 0 < layer["margin"]


def test_shipped_actor_critic_reproduces_liang_lai_full_row():
    """Paper (b), full actor-critic: raw relative errors < 0.018 (P12) and < 0.014 (V21bar) after the best c,
    lazy blocks exactly 0; measured 1.2e-3 / 3.1e-4 with random features and the critic fix (critic and actor
    each fitted to ~1e-6 of their own update). `analyze` reads the same numbers from the weights."""
    cfg = _config("actor-critic")
    assert cfg.sa_features == "gaussian" and cfg.critic_lr_factor == cfg.critic_step / cfg.alpha
    m = _evaluate("actor-critic", 64)
    assert m["rel_err_P12"] < 0.018 and m["rel_err_V21"] < 0.014  # the paper's bounds
    assert m["rel_err_P12"] < 0.005 and m["rel_err_V21"] < 0.002  # what this run reaches
    assert m["lazy_P22"] == 0.0 and m["lazy_V22"] == 0.0  # exact: masked to literal zeros
    assert max(m["loss_relative_by_block"].values()) < 1e-5  # the critic is trained too, not only the actor
    mf = analyze(DATA / "actor-critic")["weights"]["manifold"]
    assert mf["rel_err"]["P12"] == pytest.approx(m["rel_err_P12"], rel=1e-9)
    assert mf["rel_err"]["V21"] == pytest.approx(m["rel_err_V21"], rel=1e-9)
    early = _evaluate("actor-critic", 64, path=_snapshots("actor-critic")[0])
    assert early["rel_err_P12"] > m["rel_err_P12"]
