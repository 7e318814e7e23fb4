"""Known answers that a mutation sweep found missing: each test fails on one hand-injected one-line bug
of the analyzers and passes on the correct code. Every expected number is recomputed here
independently (float64 loops over the recorded data, or closed forms), never read back from the code
under test.

Mutants caught: chunk_kernel counting states that are never a source; KernelStream reporting the
least diagonal head; the IWS fit ignoring the stationary weighting; NaN kept in the analysis JSON;
the state count from labels one short; Wang's P_others_mean_abs denominator; value_rms of linear-td
computed as sqrt(mean |e|) instead of a root mean square.
"""
from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest

from icrl_interp.analyzers import analyze, convergence, kernel as K, weights
from icrl_interp.core.files import json_clean

from . import analyzer_data as D


# ----------------------------------------------------------------- helpers
def _hand_kernel(states: np.ndarray, pat: np.ndarray, S: int) -> np.ndarray:
    """M_hat(s, s') of one prompt and one head by its definition (loops, float64): rows of states that
    are not both a target and a source (a position some target puts weight on) are NaN."""
    pos = states.shape[0]
    sources = [k for k in range(pos) if np.any(pat[:, k] > 0)]
    M = np.full((S, S), np.nan)
    for s in range(S):
        targets = [j for j in range(pos) if states[j] == s]
        if not targets or not any(states[k] == s for k in sources):
            continue
        for t in range(S):
            M[s, t] = np.mean([sum(float(pat[j, k]) for k in range(pos) if states[k] == t) for j in targets])
    return M


def _diag_stats(Ms: list[np.ndarray]) -> tuple[float, float]:
    """Average over tasks of the mean and of the minimum of the diagonal over the present states."""
    means, mins = [], []
    for M in Ms:
        d = np.diagonal(M)
        d = d[np.isfinite(d)]
        means.append(d.mean())
        mins.append(d.min())
    return float(np.mean(means)), float(np.mean(mins))


def _without_probes(data: dict) -> None:
    """Drop /reference/td_errors: no TD probes run, so these tests depend only on the analyzers under test."""
    data.pop("reference/td_errors", None)


def _uniform_over_context(pat: np.ndarray, n: int) -> np.ndarray:
    """The same shape, every target spreading its weight 1/n over the n context sources (not the query)."""
    out = np.zeros_like(pat)
    out[..., :n] = 1.0 / n
    return out


# ------------------------------------------- chunk_kernel: sources only
def test_chunk_kernel_leaves_out_states_that_are_never_a_source():
    """States 2 (only at the masked query) and 3 (at a column nobody attends to) are targets but never
    sources: their rows are NaN, not a diagonal of 0 that would make the minimum 0."""
    states = np.array([[0, 1, 0, 3, 1, 2]])  # pos 5 is the query
    pos, S = 6, 4
    pat = np.zeros((1, 1, pos, pos))
    # every target: 0.5 on column 0, 0.2 on column 1, 0.1 on column 2, 0.2 on column 4; columns 3, 5 get 0
    pat[..., [0, 1, 2, 4]] = [0.5, 0.2, 0.1, 0.2]
    cc = K.ChunkColumns.build(states, S)
    got = K.chunk_kernel(pat, np.arange(pos), cc)["M"][0, 0]
    # M_hat(0, .) = (0.6, 0.4, 0, 0) for every target; the same for state 1's targets
    want = np.array([[0.6, 0.4, 0.0, 0.0], [0.6, 0.4, 0.0, 0.0], [np.nan] * 4, [np.nan] * 4])
    np.testing.assert_allclose(got, want, atol=1e-15, equal_nan=True)
    np.testing.assert_allclose(got, _hand_kernel(states[0], pat[0, 0], S), atol=1e-15, equal_nan=True)
    mean, mins = K.task_diagonals(got[None])
    assert mean[0] == pytest.approx(0.5, abs=1e-15) and mins[0] == pytest.approx(0.4, abs=1e-15)


# ------------------------------------------- recordings for the kernel
@pytest.fixture(scope="module")
def two_head_recording(tmp_path_factory):
    """softmax-td theta* patterns as head 1 and uniform-over-context patterns as head 0: head 1 is the
    more diagonal one, so the reported head must be 1."""
    cfg = D.config_for("softmax-td")
    n = cfg.task.n

    def two_heads(data):
        for key in [k for k in data if k.endswith("attn.hook_pattern")]:
            star = data[key]
            data[key] = np.concatenate([_uniform_over_context(star, n), star], axis=1)
        _without_probes(data)

    path = tmp_path_factory.mktemp("two_heads") / "rec.h5"
    return D.write_recording(path, "softmax-td", n_prompts=8, batch=8, hooks=("score", "resid_post"),
                             transform=two_heads)


def test_streaming_kernel_reports_the_most_diagonal_head(two_head_recording):
    r = analyze(two_head_recording)
    S = D.CONFIGS["softmax-td"]["task"]["n_states"]
    with h5py.File(two_head_recording, "r") as f:
        states = f["prompts/state"][:]
        pats = {l: f[f"acts/blocks.{l}.attn.hook_pattern"][:] for l in (0, 5)}
    for l, pat in pats.items():
        kd = r["activations"]["layers"][l]["kernel_diagonality"]
        per_head = [_diag_stats([_hand_kernel(states[b], pat[b, h], S) for b in range(len(states))]) for h in range(2)]
        assert per_head[1][1] > per_head[0][1] + 0.3  # the heads really differ
        assert kd["head"] == 1
        assert kd["mean"] == pytest.approx(per_head[1][0], abs=1e-12)
        assert kd["min"] == pytest.approx(per_head[1][1], abs=1e-12)
        for h in range(2):
            assert kd["per_head"][h]["min"] == pytest.approx(per_head[h][1], abs=1e-12)
            assert kd["per_head"][h]["mean"] == pytest.approx(per_head[h][0], abs=1e-12)
        # the uniform head's diagonal is the share of context columns holding the state: closed form
        ctx = states[:, :-1]
        shares = [np.bincount(ctx[b], minlength=S)[np.unique(ctx[b])] / ctx.shape[1] for b in range(len(ctx))]
        assert kd["per_head"][0]["min"] == pytest.approx(np.mean([s.min() for s in shares]), abs=1e-12)


def test_state_count_from_labels_when_the_recording_has_no_task_data(tmp_path):
    """Without /tasks the number of states is max(label) + 1 (5 here): M_hat is 5 x 5 with the
    task-averaged hand values."""
    def drop_tasks(data):
        for key in [k for k in data if k.startswith("tasks/")]:
            del data[key]
        _without_probes(data)

    path = D.write_recording(tmp_path / "rec.h5", "softmax-td", n_prompts=8, batch=8, hooks=("score", "resid_post"),
                             transform=drop_tasks)
    with h5py.File(path, "r") as f:
        assert "tasks" not in f or "tasks/values" not in f
        states = f["prompts/state"][:]
        pat = f["acts/blocks.0.attn.hook_pattern"][:]
    S = int(states.max()) + 1
    assert S == 5
    r = analyze(path)
    assert "value_error" in r["skipped"]  # really no task data: the labels gave the state count
    kd = r["activations"]["layers"][0]["kernel_diagonality"]
    Ms = [_hand_kernel(states[b], pat[b, 0], S) for b in range(len(states))]
    M_sum = sum(np.where(np.isfinite(M), M, 0.0) for M in Ms)
    M_count = sum(np.isfinite(M).all(-1).astype(float) for M in Ms)
    want = M_sum / M_count[:, None]
    got = np.array([[np.nan if v is None else v for v in row] for row in kd["M_hat"]])
    assert got.shape == (5, 5)
    np.testing.assert_allclose(got, want, atol=1e-12)
    mean, mn = _diag_stats(Ms)
    assert kd["mean"] == pytest.approx(mean, abs=1e-12) and kd["min"] == pytest.approx(mn, abs=1e-12)


# ---------------------------------------------------- IWS weighting
def test_iws_fit_is_weighted_by_the_stationary_distribution():
    """v_tf outside the span of the features: the d_pi-weighted least-squares weight differs from the
    unweighted one, and IWS must use the weighted one."""
    phi = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, -1.0]]])
    d_pi = np.array([[0.1, 0.2, 0.6, 0.1]])
    v_tf = np.array([[1.0, 2.0, 0.0, 5.0]])  # not representable: no w gives these four values
    # hand: minimise sum_s d(s) (w.phi(s) - v(s))^2 via sqrt(d)-scaled ordinary least squares
    sw = np.sqrt(d_pi[0])
    w_hand = np.linalg.lstsq(phi[0] * sw[:, None], v_tf[0] * sw, rcond=None)[0]
    # normal equations in closed form: X^T D X = [[0.8, 0.5], [0.5, 0.9]], X^T D v = [0.6, -0.1]
    np.testing.assert_allclose(w_hand, np.linalg.solve([[0.8, 0.5], [0.5, 0.9]], [0.6, -0.1]), atol=1e-14)
    w_unweighted = np.linalg.lstsq(phi[0], v_tf[0], rcond=None)[0]
    assert np.linalg.norm(w_hand - w_unweighted) > 0.5  # the weighting changes the answer here: (2, -1)
    np.testing.assert_allclose(w_unweighted, [2.0, -1.0], atol=1e-14)
    np.testing.assert_allclose(convergence.wls_weights(phi, d_pi, v_tf)[0], w_hand, atol=1e-13)
    w_td = np.array([[1.0, 0.0]])
    v_td = phi[0] @ w_td[0]
    grad_tf = np.broadcast_to(w_hand, (1, 4, 2))
    m = convergence.vd_ss_iws(v_tf, v_td[None], grad_tf, np.broadcast_to(w_td[:, None], (1, 4, 2)), phi, d_pi, w_td)
    assert m["IWS"][0] == pytest.approx(w_hand[0] / np.linalg.norm(w_hand), abs=1e-13)  # 0.8408
    assert abs(m["IWS"][0] - 2.0 / math.sqrt(5.0)) > 0.05  # the unweighted fit would give 0.8944
    assert m["VD"][0] == pytest.approx(float(np.sum(d_pi[0] * (v_tf[0] - v_td) ** 2)), abs=1e-13)
    assert m["VD"][0] == pytest.approx(3.0, abs=1e-13)  # 0.2 * 4 + 0.6 * 1 + 0.1 * 16


# ------------------------------------------------------- NaN in JSON
def test_json_clean_turns_non_finite_numbers_into_null():
    raw = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": np.float32("nan"), "d": np.array([1.0, np.nan]),
           "e": (np.float64(2.0), np.int64(3)), 4: np.bool_(True)}
    assert json_clean(raw) == {"a": None, "b": [None, None, 1.5], "c": None, "d": [1.0, None], "e": [2.0, 3],
                               "4": True}


def test_analysis_json_has_null_where_a_metric_is_undefined(tmp_path):
    """A softmax-td checkpoint whose value map is zero: every cosine with V* is 0/0 (undefined), so the
    analysis has null there, while the score scale keeps its known value 8."""
    cfg = D.config_for("softmax-td")
    params = D.theta_params(cfg)
    params["blocks.0.attn.V"] = np.zeros_like(params["blocks.0.attn.V"])
    r = analyze(D.write_checkpoint(tmp_path / "ck", cfg, params))
    json.dumps(r, allow_nan=False)
    m = r["weights"]["manifold"]
    assert m["gauge_cosine"] is None and m["value_row_cosine"] is None
    assert m["per_layer"][0]["value_row_cosine"] is None and m["per_layer"][0]["value_row"] == [0.0, 0.0, 0.0]
    assert m["scale"] == 8.0 and m["rel_err"]["A"] == 0.0  # exact: sums of 8s and 1s, and 8 * 1 - 8
    assert r["weights"]["sign_pattern"] == "0,0,0"


# ------------------------------------------------- Wang's P/Q summary
def test_pq_summary_known_answer():
    d = 2
    lay = D.layout_of(D.config_for("linear-td", d=d))
    D_model = lay.d_model  # 5
    P = np.arange(D_model * D_model, dtype=np.float64).reshape(D_model, D_model) - 10.0
    P[-1, -1] = -7.0  # sign s = -1
    Q = np.arange(D_model * D_model, dtype=np.float64).reshape(D_model, D_model)
    res = weights.pq_summary(P, Q, lay)
    others = sum(abs(P[i, j]) for i in range(D_model) for j in range(D_model) if (i, j) != (D_model - 1, D_model - 1))
    assert res["sign"] == -1.0 and res["P_last"] == 7.0  # exact here and for the traces: small integers
    assert res["P_others_mean_abs"] == pytest.approx(others / 24, abs=1e-14)  # 24 other entries of a 5 x 5 P
    assert res["P_others_mean_abs"] == pytest.approx(146.0 / 24, abs=1e-14)
    assert res["Q_tl_trace"] == -(Q[0, 0] + Q[1, 1]) == -6.0  # phi rows/cols 0..1
    assert res["Q_tr_trace"] == -(Q[0, 2] + Q[1, 3]) == -10.0  # phi rows x gamma_phi_next cols 2..3


# ------------------------------------------------------- value RMS
@pytest.fixture(scope="module")
def value_recordings(tmp_path_factory):
    root = tmp_path_factory.mktemp("value_rms")
    return {fam: D.write_recording(root / f"{fam}.h5", fam, n_prompts=16, batch=16, hooks=("resid_post",),
                                   transform=_without_probes)
            for fam in ("linear-td", "softmax-td")}


def _linear_td_query_errors(path) -> dict[int, np.ndarray]:
    """Per layer, v_hat(s_q) - v_pi(s_q) per prompt, from the recorded readout -z[-1, reward]."""
    lay = D.layout_of(D.config_for("linear-td"))
    out = {}
    with h5py.File(path, "r") as f:
        q = f["prompts/state"][:, -1]
        v_true = f["tasks/values"][:][np.arange(len(q)), q]
        for l in range(D.CONFIGS["linear-td"]["model"]["n_layers"]):
            z = f[f"acts/blocks.{l}.hook_resid_post"][:]
            out[l] = -z[:, -1, lay.slice("reward").start] - v_true
    return out


def test_linear_td_value_error_is_the_mean_absolute_query_error(value_recordings):
    r = analyze(value_recordings["linear-td"])
    for l, e in _linear_td_query_errors(value_recordings["linear-td"]).items():
        assert r["activations"]["layers"][l]["value_error"] == pytest.approx(np.mean(np.abs(e)), rel=1e-12)


def test_softmax_td_value_rms_is_the_mu_weighted_rms(value_recordings):
    """positions: per task sqrt(sum_s mu e^2 / sum_s mu) over the states in the context, mean over tasks."""
    path = value_recordings["softmax-td"]
    lay = D.layout_of(D.config_for("softmax-td"))
    r = analyze(path)
    with h5py.File(path, "r") as f:
        states, v_true, mu = f["prompts/state"][:], f["tasks/values"][:], f["tasks/stationary"][:]
        for l in (0, 3):
            v_pos = f[f"acts/blocks.{l}.hook_resid_post"][:, :, lay.slice("current_mem").start]
            inf, rms = [], []
            for b in range(len(states)):
                seen = sorted(set(states[b].tolist()))
                e = np.array([np.mean(v_pos[b][states[b] == s]) - v_true[b, s] for s in seen])
                w = mu[b, seen]
                inf.append(np.abs(e).max())
                rms.append(math.sqrt(float(np.sum(w * e**2) / np.sum(w))))
            layer = r["activations"]["layers"][l]
            assert layer["value_error"] == pytest.approx(np.mean(inf), rel=1e-12)
            assert layer["value_rms"] == pytest.approx(np.mean(rms), rel=1e-12)


def test_linear_td_value_rms_is_a_root_mean_square(value_recordings):
    r = analyze(value_recordings["linear-td"])
    for l, e in _linear_td_query_errors(value_recordings["linear-td"]).items():
        assert r["activations"]["layers"][l]["value_rms"] == pytest.approx(math.sqrt(np.mean(e**2)), rel=1e-12)
