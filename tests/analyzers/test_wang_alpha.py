"""One TD step alpha for Wang's VD / SS / IWS (analyzers.td_step): the exact polynomial fit, the task split,
and `analyze` agreeing with `train`'s held-out evaluation on the same checkpoint and tasks."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from icrl_interp.models import checkpoint
from icrl_interp.recording import probe_spec, recorder
from icrl_interp.tasks import reference, sampling
from icrl_interp.analyzers import analyze, convergence, td_step
from icrl_interp.train.recipes import linear_td as linear_td_training

from . import analyzer_data as D

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "checkpoints" / "linear-td"


def _td_data(B=12, n=9, d=3, S=5, seed=0):
    rng = np.random.default_rng(seed)
    phi, nxt = rng.standard_normal((B, n, d)), rng.standard_normal((B, n, d))
    return phi, nxt, rng.standard_normal((B, n)), rng.standard_normal((B, S, d)), rng.dirichlet(np.ones(S), B)


@pytest.mark.parametrize("L", [1, 3, 6])
def test_polynomial_is_batch_td_at_every_step(L):
    phi, nxt, r, _, _ = _td_data()
    C = np.random.default_rng(1).standard_normal((3, 3))
    coef = td_step.td_weight_polynomial(phi, 0.7 * nxt, r, L, C)
    for alpha in (0.05, 0.9, 1.7):
        want = reference.batch_td(phi, nxt, r, np.zeros((12, 3)), 0.7, alpha, L, C).w[:, -1]
        np.testing.assert_allclose(td_step.weights_at(coef, alpha), want, rtol=1e-10, atol=1e-12)


def test_fit_recovers_the_step_and_beats_any_grid():
    phi, nxt, r, states, mu = _td_data()
    coef = td_step.td_weight_polynomial(phi, 0.9 * nxt, r, 3)
    exact = td_step.AlphaFit(3)
    exact.update(np.einsum("bsd,bd->bs", states, td_step.weights_at(coef, 0.37)), coef, states, mu)
    assert exact.alpha() == pytest.approx(0.37, rel=1e-12) and abs(exact.mean_vd(exact.alpha())) < 1e-12
    # a model that is no batch TD at all: the exact minimiser is at least as good as a fine grid's best,
    # and the polynomial VD is the direct one
    v = np.random.default_rng(3).standard_normal(mu.shape)
    fit = td_step.AlphaFit(3)
    fit.update(v, coef, states, mu)

    def direct(a):
        w = reference.batch_td(phi, nxt, r, np.zeros((12, 3)), 0.9, a, 3).w[:, -1]
        return float(np.mean(convergence.vd_ss_iws(v, np.einsum("bsd,bd->bs", states, w), states, states, states,
                                                   mu, w)["VD"]))

    grid = np.linspace(0.0, 3.0, 3001)
    best = grid[np.argmin([direct(a) for a in grid])]
    assert fit.mean_vd(0.8) == pytest.approx(direct(0.8), rel=1e-10)
    assert fit.alpha() == pytest.approx(best, abs=2e-3) and direct(fit.alpha()) <= direct(best) + 1e-15


def test_the_step_is_fitted_on_calibration_tasks_and_scored_on_the_others():
    """Calibration tasks are batch TD at 0.6 exactly; evaluation tasks are that plus a constant eps at every
    state, so on them VD = eps^2 (sum mu = 1). Fitting on all tasks would move alpha off 0.6; scoring all
    tasks would give a smaller VD."""
    phi, nxt, r, states, mu = _td_data(B=64)
    ids = np.arange(64)
    cal = td_step.calibration_tasks(ids)
    assert 0 < cal.sum() < 64 and np.array_equal(cal, td_step.calibration_tasks(ids.copy()))
    coef = td_step.td_weight_polynomial(phi, 0.9 * nxt, r, 2)
    w = td_step.weights_at(coef, 0.6)
    v = np.einsum("bsd,bd->bs", states, w) + np.where(cal, 0.0, 0.1)[:, None]
    ev = td_step.WangEvaluation(2)
    ev.update(ids, v, np.broadcast_to(w[:, None], states.shape), coef, states, mu)
    res, per = ev.result()
    assert res["alpha"] == pytest.approx(0.6, rel=1e-9) and res["alpha_source"] == "fitted"
    assert res["VD"] == pytest.approx(0.01, rel=1e-9) and res["n_tasks"] == int((~cal).sum())
    assert np.array_equal(np.sort(per["task_id"]), ids[~cal])
    given = td_step.WangEvaluation(2, alpha=0.6)
    given.update(ids, v, np.broadcast_to(w[:, None], states.shape), coef, states, mu)
    res = given.result()[0]
    assert res["alpha_source"] == "given" and res["n_tasks"] == 64
    assert res["VD"] == pytest.approx(0.01 * (~cal).mean(), rel=1e-9)


# ------------------------------------------------------------------ analyze == train
def _record(ck: Path, out: Path, n: int = 96) -> Path:
    cfg, _ = checkpoint.read(ck)
    source = recorder.PromptSource(config=cfg, n_total=n, seed=0)
    recorder.record(checkpoint.load(ck), out, probe_spec.shipped_spec(cfg.family), source, batch_size=48,
                    checkpoint_sha256=checkpoint.sha256(ck), progress=False)
    return out


def _train_eval_on_recording(ck: Path, rec: Path) -> dict:
    """`train`'s evaluation (model forward passes + autograd) on the recorded tasks."""
    cfg, _ = checkpoint.read(ck)
    lay, gamma = cfg.model.layout, cfg.model.gamma
    with h5py.File(rec, "r") as f:
        z, ids = f["prompts/z"][:, :-1], f["prompts/task_id"][:]
        phi_s, mu = f["tasks/phi"][:], f["tasks/stationary"][:]
    ctx = (z[..., lay.slice("phi")], sampling.unscale(z[..., lay.slice("gamma_phi_next")], gamma),
           z[..., lay.slice("reward")][..., 0])
    return linear_td_training.evaluate_tasks(checkpoint.load(ck), gamma, ctx, phi_s, mu, ids)


@pytest.fixture(scope="module")
def off_step(tmp_path_factory):
    """theta* of batch TD at alpha 0.6 in a checkpoint whose config says alpha = 1 (as a trained one does)."""
    root = tmp_path_factory.mktemp("wang_alpha")
    cfg = D.config_for("linear-td", alpha=1.0)
    params = D.theta_params(cfg)
    params = {k: 0.6 * v if k.endswith(".P") else v for k, v in params.items()}
    ck = D.write_checkpoint(root / "ck", cfg, params)
    return ck, _record(ck, root / "off.h5")


def test_analyze_fits_the_step_a_trained_checkpoint_does_not_state(off_step):
    ck, rec = off_step
    m = analyze(rec)["activations"]["wang_metrics"]
    assert m["alpha"] == pytest.approx(0.6, rel=1e-8) and m["alpha_source"] == "fitted"
    assert m["VD"] < 1e-12 and m["SS"] == pytest.approx(1.0, abs=1e-9) and m["IWS"] == pytest.approx(1.0, abs=1e-6)
    at_one = analyze(rec, wang_alpha=1.0)["activations"]["wang_metrics"]  # the checkpoint's own alpha
    assert at_one["alpha"] == 1.0 and at_one["alpha_source"] == "given" and at_one["VD"] > 1e-3


@pytest.mark.parametrize("which", ["off-step theta*", "shipped trained"])
def test_analyze_and_train_give_the_same_numbers_on_the_same_tasks(off_step, tmp_path, which):
    ck = off_step[0] if which == "off-step theta*" else SHIPPED
    rec = off_step[1] if which == "off-step theta*" else _record(SHIPPED, tmp_path / "shipped.h5")
    a = analyze(rec)["activations"]["wang_metrics"]
    t = _train_eval_on_recording(ck, rec)
    assert t["alpha_fit"] == pytest.approx(a["alpha"], rel=1e-5) and t["n_tasks"] == a["n_tasks"]
    if which == "shipped trained":  # a real fit, far from the checkpoint's alpha = 1
        assert abs(a["alpha"] - 1.0) > 0.02 and checkpoint.read(ck)[0].model.alpha == 1.0
    assert t["VD"] == pytest.approx(a["VD"], rel=1e-4, abs=1e-12)
    assert t["SS"] == pytest.approx(a["SS"], abs=1e-6) and t["IWS"] == pytest.approx(a["IWS"], abs=1e-6)


@pytest.mark.parametrize("L,S,d", [(3, 5, 3), (1, 7, 2), (6, 4, 5)])
def test_prompt_summary_gives_the_direct_metrics_at_any_step(L, S, d):
    """The O(L^2) summary kept per evaluation prompt reproduces `convergence.vd_ss_iws` at every alpha, with a
    per-state gradient (a wrong weighting of the unit gradients, or of the residual, changes SS / VD)."""
    phi, nxt, r, states, mu = _td_data(B=20, d=d, S=S, seed=L)
    rng = np.random.default_rng(7)
    coef = td_step.td_weight_polynomial(phi, 0.8 * nxt, r, L)
    v, g = rng.standard_normal(mu.shape), rng.standard_normal((20, S, d))
    g[0, 1] = 0.0  # a zero gradient: its cosine is undefined, so that prompt's SS is NaN in both
    summary = td_step.PromptSummary.of(np.arange(20), v, g, coef, states, mu)
    assert summary.r_vd.shape == summary.r_w.shape == (20, (L + 1) * (L + 2) // 2)  # packed triangles: not S, d
    for alpha in (0.0, 0.3, 1.4):
        w = td_step.weights_at(coef, alpha)
        want = convergence.vd_ss_iws(v, np.einsum("bsd,bd->bs", states, w), g, np.broadcast_to(w[:, None], g.shape),
                                     states, mu, w)
        got = summary.metrics(alpha)
        for k in ("VD", "SS", "IWS"):
            np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-13)
    assert np.isnan(summary.metrics(0.3)["SS"][0]) and not np.isnan(summary.metrics(0.3)["SS"][1:]).any()


def test_prompt_summary_keeps_a_zero_value_difference_exact():
    """A model that is batch TD exactly has VD ~ 1e-32, not the ~1e-16 that summing polynomial coefficients
    would leave (the QR factor keeps the residual, not its square)."""
    phi, nxt, r, states, mu = _td_data(B=16, seed=4)
    coef = td_step.td_weight_polynomial(phi, 0.9 * nxt, r, 3)
    w = td_step.weights_at(coef, 0.55)
    v = 1e3 * np.einsum("bsd,bd->bs", states, w)
    summary = td_step.PromptSummary.of(np.arange(16), v, np.broadcast_to(w[:, None], states.shape), 1e3 * coef, states, mu)
    m = summary.metrics(0.55)
    assert m["VD"].max() < 1e-20 and np.allclose(m["SS"], 1.0, atol=1e-12) and np.allclose(m["IWS"], 1.0, atol=1e-9)


def test_prompt_summary_packing_and_blocks_change_no_bit(monkeypatch):
    """The summaries keep their QR triangles packed (memory of a long live analysis) and `metrics` unpacks them
    a block at a time: the numbers are those of the full k x k triangles in one product, bit for bit (the same
    per-prompt products; a wrong triangle index, a transposed unpack or a block that skips or repeats
    prompts changes them). `concat` keeps the parts' order and lets go of the parts."""
    phi, nxt, r, states, mu = _td_data(B=20, d=5, S=6, seed=3)  # d, S >= k = 4: square triangles to compare with
    rng = np.random.default_rng(11)
    coef = td_step.td_weight_polynomial(phi, 0.8 * nxt, r, 3)
    v, g = rng.standard_normal(mu.shape), rng.standard_normal((20, 6, 5))
    k = coef.shape[1]
    resid = -np.einsum("bsd,bkd->bsk", states, coef)
    resid[..., 0] += v
    full = {"vd": np.linalg.qr(np.sqrt(mu)[..., None] * resid, mode="r"),
            "w": np.linalg.qr(np.swapaxes(coef, 1, 2), mode="r")}
    assert all(m.shape == (20, k, k) for m in full.values())
    assert not np.allclose(full["vd"], np.swapaxes(full["vd"], 1, 2))  # a transposed unpack would differ
    parts = [td_step.PromptSummary.of(np.arange(a, b), v[a:b], g[a:b], coef[a:b], states[a:b], mu[a:b])
             for a, b in ((0, 7), (7, 20))]
    monkeypatch.setattr(td_step.PromptSummary, "METRICS_BLOCK", 3)  # 20 prompts: 7 blocks, the last one short
    summary = td_step.PromptSummary.concat(parts)
    assert parts[0].r_vd is None and parts[1].task_id is None
    np.testing.assert_array_equal(summary.task_id, np.arange(20))  # exact: integers
    for alpha in (0.37, 1.2):  # not 0: w_0 = 0, so IWS is NaN there
        a = alpha ** np.arange(k)
        got = summary.metrics(alpha)
        w_norm = np.linalg.norm(full["w"] @ a, axis=-1)
        # exact by construction: the same triangles (QR of the same rows) and the same per-prompt products
        np.testing.assert_array_equal(got["VD"], np.sum((full["vd"] @ a) ** 2, axis=-1))
        np.testing.assert_array_equal(got["IWS"], (summary.iws_num @ a) / w_norm)
