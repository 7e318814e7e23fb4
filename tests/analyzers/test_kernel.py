"""Known answers for kernel diagonality: identity -> 1, uniform -> 1/|S|, brute-force M_hat,
the one-hot population kernel in closed form, label-free masses, streaming = one shot."""
from __future__ import annotations

import math

import numpy as np
import pytest

from icrl_interp.analyzers import kernel as K


def _random_patterns(rng, B, H, pos):
    """Softmax patterns over sources 0..pos-2 (the last position masked as a source)."""
    logits = rng.standard_normal((B, H, pos, pos)) * 2
    logits[..., -1] = -np.inf
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_identity_attention_has_diagonality_one():
    B, S, pos = 3, 4, 13
    states = np.tile(np.arange(pos) % S, (B, 1))
    pat = np.broadcast_to(np.eye(pos), (B, 1, pos, pos)).copy()
    M, counts = K.state_kernel(pat, states, states, S)
    # exact: sums of 0s and 1s and means of 1s
    np.testing.assert_array_equal(M[:, 0], np.broadcast_to(np.eye(S), (B, S, S)))
    acc = K.DiagonalityAccumulator(0.9, S)
    acc.update(M[:, 0])
    res = acc.result()
    assert res["mean"] == 1.0 and res["min"] == 1.0
    assert res["margin"] == pytest.approx(1.0 - 0.95, abs=1e-15)
    assert res["frac_tasks_contracting"] == 1.0
    np.testing.assert_array_equal(counts, [[4, 3, 3, 3]] * B)


def test_uniform_attention_has_diagonality_one_over_states():
    B, S, n = 2, 5, 20  # every state appears n / S times among the sources
    pos = n + 1
    states = np.tile(np.arange(pos) % S, (B, 1))
    pat = np.zeros((B, 1, pos, pos))
    pat[..., :n] = 1.0 / n
    M, _ = K.state_kernel(pat, states, states, S)
    np.testing.assert_allclose(M[:, 0], 1.0 / S, atol=1e-15)
    acc = K.DiagonalityAccumulator(0.5, S)
    acc.update(M[:, 0])
    res = acc.result()
    assert res["mean"] == pytest.approx(1 / S) and res["min"] == pytest.approx(1 / S)
    assert res["margin"] == pytest.approx(1 / S - 0.75)
    assert res["frac_tasks_contracting"] == 0.0  # a share of counts: exact


def test_state_kernel_matches_its_definition_on_random_patterns(rng):
    B, H, S, pos = 6, 2, 4, 11
    pat = _random_patterns(rng, B, H, pos)
    states = rng.integers(0, S, size=(B, pos))
    states[0, -1] = S - 1
    states[0, :-1] = np.minimum(states[0, :-1], S - 2)  # a state seen only at the masked query
    M, counts = K.state_kernel(pat, states, states, S)
    assert np.all(np.isnan(M[0, :, S - 1]))
    for b in range(B):
        for h in range(H):
            for s in range(S):
                targets = [j for j in range(pos) if states[b, j] == s]
                sources = [k for k in range(pos - 1) if states[b, k] == s]  # the last position is masked
                assert counts[b, s] == len(targets)
                if not targets or not sources:
                    assert np.all(np.isnan(M[b, h, s]))
                    continue
                for t in range(S):
                    want = np.mean([sum(pat[b, h, j, k] for k in range(pos) if states[b, k] == t) for j in targets])
                    assert M[b, h, s, t] == pytest.approx(want, abs=1e-13)
            rows = ~np.isnan(M[b, h, :, 0])
            np.testing.assert_allclose(M[b, h, rows].sum(-1), 1.0, atol=1e-12)  # row-stochastic


def test_state_seen_only_at_the_query_is_left_out():
    pos, S = 5, 3
    states = np.array([[0, 1, 0, 1, 2]])  # state 2 only at the query, never a source
    pat = np.zeros((1, 1, pos, pos))
    pat[..., :4] = 0.25
    M, _ = K.state_kernel(pat, states, states, S)
    assert np.all(np.isnan(M[0, 0, 2]))
    mean, mins = K.task_diagonals(M[:, 0])
    assert mean[0] == pytest.approx(0.5) and mins[0] == pytest.approx(0.5)


@pytest.mark.parametrize("beta2", [1.0, 2.0, 4.0, 8.0])
def test_population_kernel_of_scaled_onehot_features_in_closed_form(beta2, rng):
    B, S = 5, 6
    mu = rng.dirichlet(np.ones(S), size=B)
    x = np.broadcast_to(np.eye(S), (B, S, S)).copy()
    M = K.population_kernel(beta2 * np.eye(S), x, mu)
    e = math.exp(beta2)
    want_diag = mu * e / (mu * e + 1 - mu)
    np.testing.assert_allclose(np.diagonal(M, axis1=1, axis2=2), want_diag, rtol=1e-13)
    np.testing.assert_allclose(M.sum(-1), 1.0, atol=1e-13)
    # off-diagonal: mu(s') / (mu(s) e + 1 - mu(s))
    np.testing.assert_allclose(M[:, 0, 1], mu[:, 1] / (mu[:, 0] * e + 1 - mu[:, 0]), rtol=1e-13)


def test_population_kernel_uses_source_transpose_a_target(rng):
    B, S, d = 2, 4, 3
    x = rng.standard_normal((B, S, d))
    A = rng.standard_normal((d, d))
    mu = rng.dirichlet(np.ones(S), size=B)
    M = K.population_kernel(A, x, mu)
    for b in range(B):
        for s in range(S):
            w = np.array([mu[b, u] * math.exp(x[b, u] @ A @ x[b, s]) for u in range(S)])
            np.testing.assert_allclose(M[b, s], w / w.sum(), rtol=1e-12)


def test_label_free_masses(rng):
    B, S, pos = 4, 3, 10
    states = rng.integers(0, S, size=(B, pos))
    feats = np.eye(S)[states] * 2.5  # one-hot x beta features: equal iff same state
    pat = _random_patterns(rng, B, 1, pos)
    ids = K.feature_ids(feats)
    same = K.same_feature_mass(pat, ids, ids)
    want = [np.mean([sum(pat[b, 0, j, k] for k in range(pos) if states[b, k] == states[b, j]) for j in range(pos)])
            for b in range(B)]
    np.testing.assert_allclose(same, want, atol=1e-13)
    eye = np.broadcast_to(np.eye(pos), (B, 1, pos, pos))
    q = np.arange(pos)
    np.testing.assert_array_equal(K.self_mass(eye, q, q), 1.0)  # exact: sums of 0s and 1s
    # only the query rows recorded: positions 3..9 as targets
    np.testing.assert_allclose(K.self_mass(pat[:, :, 3:], q[3:], q), pat[:, 0, np.arange(3, pos), np.arange(3, pos)].mean(-1))


def test_feature_ids_separate_distinct_vectors(rng):
    f = rng.uniform(-1, 1, size=(3, 50, 4))
    f[:, 10] = f[:, 3]
    ids = K.feature_ids(f)
    assert np.all(ids[:, 10] == ids[:, 3])
    assert len(np.unique(ids[0])) == 49


def test_accumulator_streams_like_one_shot(rng):
    B, S, pos = 40, 4, 12
    pat = _random_patterns(rng, B, 1, pos)
    states = rng.integers(0, S, size=(B, pos))
    M, _ = K.state_kernel(pat, states, states, S)
    one = K.DiagonalityAccumulator(0.3, S)
    one.update(M[:, 0])
    parts = K.DiagonalityAccumulator(0.3, S)
    for lo in range(0, B, 7):
        parts.update(M[lo : lo + 7, 0])
    a, b = one.result(), parts.result()
    for key in ("mean", "min", "margin", "worst_task_min", "frac_tasks_contracting", "n_tasks"):
        assert a[key] == pytest.approx(b[key], abs=1e-14)
    np.testing.assert_allclose(np.array(a["M_hat"], dtype=float), np.array(b["M_hat"], dtype=float), atol=1e-14)
    mean, mins = K.task_diagonals(M[:, 0])
    assert a["mean"] == pytest.approx(np.nanmean(mean)) and a["min"] == pytest.approx(np.nanmean(mins))
    assert K.DiagonalityAccumulator(0.3, S).result() is None


def test_one_pass_chunk_kernel_equals_the_definitions(rng):
    B, H, S, pos = 7, 2, 4, 12
    pat = _random_patterns(rng, B, H, pos).astype(np.float32)
    states = rng.integers(0, S, size=(B, pos))
    states[0, 3] = -1  # an unlabelled column
    feats = rng.uniform(-1, 1, size=(B, 5, 3))[np.arange(B)[:, None], rng.integers(0, 5, size=(B, pos))]
    ids = K.feature_ids(feats)
    codes = K.feature_codes(ids)
    assert np.all((codes[:, :, None] == codes[:, None, :]) == (ids[:, :, None] == ids[:, None, :]))
    cc = K.ChunkColumns.build(states, S, codes)
    q = np.arange(2, pos)  # only some query rows recorded
    got = K.chunk_kernel(pat[:, :, q], q, cc)
    M, _ = K.state_kernel(pat[:, :, q].astype(np.float64), states[:, q], states, S)
    np.testing.assert_allclose(got["M"], M, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(got["same_mass"], K.same_feature_mass(pat[:, :, q].astype(np.float64), ids[:, q], ids),
                               atol=1e-6)
    np.testing.assert_allclose(got["row_sums"], 1.0, atol=1e-5)


def test_chunk_kernel_reuses_state_columns_when_features_identify_states(rng):
    B, S, pos = 5, 4, 10
    pat = _random_patterns(rng, B, 1, pos)
    states = rng.integers(0, S, size=(B, pos))
    ids = K.feature_ids(np.eye(S)[states] * 3.0)  # one-hot features: same feature <-> same state
    cc = K.ChunkColumns.build(states, S, K.feature_codes(ids))
    assert cc.codes_are_states and cc.cols.shape[-1] == S + 1
    q = np.arange(pos)
    got = K.chunk_kernel(pat, q, cc)
    np.testing.assert_allclose(got["same_mass"], K.same_feature_mass(pat, ids, ids), atol=1e-12)


def test_same_partition_needs_the_map_both_ways(rng):
    """`same_partition` against its O(pos^2) definition; each direction alone is not enough."""
    a = np.array([[0, 1, 1, 2]])
    assert K.same_partition(a, np.array([[5, 3, 3, 0]]))  # relabelled: the same partition
    assert not K.same_partition(a, np.array([[0, 1, 1, 1]]))  # a -> b is a map, b -> a is not (2 and 1 merged)
    assert not K.same_partition(a, np.array([[0, 1, 2, 3]]))  # b -> a is a map, a -> b is not (1 split)
    for _ in range(20):
        x = rng.integers(0, 4, size=(6, 9))
        y = rng.permutation(4)[x] if rng.random() < 0.5 else rng.integers(0, 4, size=(6, 9))
        want = np.array_equal(x[:, :, None] == x[:, None, :], y[:, :, None] == y[:, None, :])
        assert K.same_partition(x, y) == want


def test_chunk_columns_with_unlabelled_states_and_features(rng):
    """The indicator columns, built in place: state one-hot (zero row for state -1), the constant, the codes."""
    states = np.array([[0, 2, -1, 2], [1, 1, 0, -1]])
    codes = np.array([[0, 1, 1, 2], [0, 0, 1, 1]])
    cc = K.ChunkColumns.build(states, 3, codes)
    assert not cc.codes_are_states and cc.cols.dtype == np.float32
    want = np.concatenate([K.onehot(states, 3), np.ones(states.shape + (1,)), np.eye(3)[codes]], axis=-1)
    np.testing.assert_array_equal(cc.cols, want)  # exact: 0s and 1s
    free = K.ChunkColumns.build(np.full((2, 4), -1), 0, codes)  # no labels: the constant and the codes only
    np.testing.assert_array_equal(free.cols, np.concatenate([np.ones((2, 4, 1)), np.eye(3)[codes]], axis=-1))


def test_population_kernel_layers_with_equal_score_blocks_share_one_accumulation(rng):
    """Layers 1 and 3 share a score block, layer 2 has its own, layer 0 none: three layers reported, each equal
    to its own one-layer accumulation (bit for bit: the same arithmetic), two kernels computed per chunk."""
    from icrl_interp.tasks.layouts import build_layout

    S, f = 4, 3
    layout = build_layout("softmax-td", [("x", f)], "x")
    A, A1 = rng.normal(size=(f, f)), rng.normal(size=(f, f))
    params = {"blocks.1.attn.A": A, "blocks.2.attn.A": A1, "blocks.3.attn.A": A.copy()}
    pk = K.PopulationKernel(params, layout, 4, 0.5, S)
    assert len(pk.kernels) == 2
    phi, mu = rng.normal(size=(10, S, f)), rng.dirichlet(np.ones(S), size=10)
    pk.add(phi[:6], mu[:6])
    pk.add(phi[6:], mu[6:])
    rows = pk.result("t")
    assert [r["layer"] for r in rows] == [1, 2, 3]
    for r, B in zip(rows, (A, A1, A)):
        one = K.DiagonalityAccumulator(0.5, S)
        one.update(K.population_kernel(B, phi[:6], mu[:6]))
        one.update(K.population_kernel(B, phi[6:], mu[6:]))
        assert {k: v for k, v in r.items() if k not in ("layer", "tasks")} == one.result(with_matrix=False)
    assert rows[0]["min"] != rows[1]["min"]


def test_self_mass_of_a_float32_pattern_is_accumulated_in_float64():
    """A float32 pattern's per-prompt self mass is the float64 mean of its (head, pair) weights, not a float32 one:
    summed over a chunk in float32 it moved with the chunk size (5e-8 of its value between a live analysis and its
    recording's)."""
    rng = np.random.default_rng(3)
    pat = rng.random((64, 8, 50, 50)).astype(np.float32) / 3
    q = np.arange(50)
    got = K.self_mass(pat, q, q)
    exact = pat.astype(np.float64)[:, :, q, q].mean(axis=(1, 2))  # float64 throughout: exact to rounding of 400 terms
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, exact, rtol=64 * np.finfo(np.float64).eps)
    # the chunk's total, as the kernel stream adds it, is the same for any split of the prompts
    np.testing.assert_allclose(got[:40].sum() + got[40:].sum(), got.sum(), rtol=16 * np.finfo(np.float64).eps)


@pytest.mark.parametrize("cores", [1, 2])
def test_kernel_statistics_are_prepared_where_the_chunk_is_read(tmp_path, monkeypatch, cores):
    """With a core to spare the kernel statistics of a chunk (`chunk_kernel`) are computed in the reader thread,
    ahead of the analysis (`KernelStream.prepare`), while the analysis is busy with the chunk before (made slow here:
    the first chunk, which the analysis waits for at once, is handed over unprepared); on one core in the caller.
    The analysis is the same, bit for bit."""
    import json
    import threading
    import time

    from icrl_interp.analyzers import probes
    from icrl_interp.analyzers.analyze import analyze
    from icrl_interp.core import threads

    from . import analyzer_data as D

    monkeypatch.delenv(threads.ENV, raising=False)
    path = D.write_recording(tmp_path / "r.h5", "softmax-td", n_prompts=96, batch=32)
    where, real = [], K.chunk_kernel
    monkeypatch.setattr(K, "chunk_kernel", lambda *a: where.append(threading.current_thread().name) or real(*a))
    slow = probes.Probes.update
    monkeypatch.setattr(probes.Probes, "update", lambda self, chunk: time.sleep(0.05) or slow(self, chunk))
    monkeypatch.setattr(threads, "allowed_cores", lambda: cores)
    got = analyze(path, chunk_mib=0.1)
    readers = [w.startswith("icrl-interp-reader") for w in where]
    layers = len(got["activations"]["layers"])
    assert len(where) > 2 * layers
    if cores > 1:  # all but the first chunk's, at most
        assert sum(readers) >= len(where) - layers and readers[-1]
    else:
        assert not any(readers)
    monkeypatch.setattr(threads, "allowed_cores", lambda: 1)
    alone = analyze(path, chunk_mib=0.1)
    assert json.dumps(got, sort_keys=True) == json.dumps(alone, sort_keys=True)  # exact
    assert got["activations"]["layers"][0]["kernel_diagonality"] is not None


def test_an_error_while_preparing_a_layer_drops_that_layer_with_its_reason(tmp_path, monkeypatch):
    """An error of `chunk_kernel` in the reader thread reaches the layer's update: that layer's kernel is skipped
    with the reason, the other layers and analyzers go on. (The analysis is made slow so that the reader prepares
    every chunk after the first; the error comes at the third.)"""
    import threading
    import time

    from icrl_interp.analyzers import probes
    from icrl_interp.analyzers.analyze import analyze
    from icrl_interp.core import threads

    from . import analyzer_data as D

    monkeypatch.delenv(threads.ENV, raising=False)
    monkeypatch.setattr(threads, "allowed_cores", lambda: 2)
    path = D.write_recording(tmp_path / "r.h5", "softmax-td", n_prompts=96, batch=32)
    real, calls, failed = K.KernelStream._kernel, [], []

    def kernel(self, data, shared):
        if self.path == "acts/blocks.1.attn.hook_pattern":
            calls.append(threading.current_thread().name)
            if len(calls) == 3:
                failed.append(calls[-1])
                raise ValueError("bad pattern")
        return real(self, data, shared)

    monkeypatch.setattr(K.KernelStream, "_kernel", kernel)
    slow = probes.Probes.update
    monkeypatch.setattr(probes.Probes, "update", lambda self, chunk: time.sleep(0.02) or slow(self, chunk))
    r = analyze(path, chunk_mib=0.1)
    layers = r["activations"]["layers"]
    assert "bad pattern" in r["skipped"]["kernel_diagonality.layer1"]
    assert layers[0]["kernel_diagonality"] is not None and layers[1].get("kernel_diagonality") is None
    assert all(layer["td_probe_r2"] is not None for layer in layers)
    assert failed and failed[0].startswith("icrl-interp-reader")  # it was raised in the reader thread
    assert len(calls) <= 4  # layer 1 was dropped: not prepared again (but for the one chunk read meanwhile)


def test_what_the_reader_has_not_prepared_when_the_analysis_asks_the_analysis_computes(tmp_path, monkeypatch):
    """The reader thread prepares a chunk while the analysis works on the chunk before; once the analysis waits for
    it (`hurry`), the reader hands the chunk over and the streams compute the rest themselves (`base.prepared`), so
    the slower side sheds the work. Layer 0's statistics made slow in the reader: the analysis waits meanwhile, so
    layer 1's are computed in the caller. The analysis is the same, bit for bit, as on one core. Kills a driver that
    ignores `hurry` and an `ahead` that never says the caller waits."""
    import json
    import threading
    import time

    from icrl_interp.analyzers.analyze import analyze
    from icrl_interp.core import threads

    from . import analyzer_data as D

    monkeypatch.delenv(threads.ENV, raising=False)
    path = D.write_recording(tmp_path / "r.h5", "softmax-td", n_prompts=96, batch=32)
    real, where = K.KernelStream._kernel, []

    def kernel(self, data, shared):
        reader = threading.current_thread().name.startswith("icrl-interp-reader")
        where.append((self.path, reader))
        if reader and self.path == "acts/blocks.0.attn.hook_pattern":
            time.sleep(0.25)  # the analysis of the chunk before is done long before: it waits for this one
        return real(self, data, shared)

    monkeypatch.setattr(K.KernelStream, "_kernel", kernel)
    monkeypatch.setattr(threads, "allowed_cores", lambda: 2)
    got = analyze(path, chunk_mib=3.0)
    layer1 = [reader for p, reader in where if p == "acts/blocks.1.attn.hook_pattern"]
    assert len(layer1) > 2 and not any(layer1), len(layer1)  # every chunk's layer 1 in the caller
    assert any(reader for p, reader in where if p == "acts/blocks.0.attn.hook_pattern")
    monkeypatch.setattr(threads, "allowed_cores", lambda: 1)
    alone = analyze(path, chunk_mib=3.0)
    assert json.dumps(got, sort_keys=True) == json.dumps(alone, sort_keys=True)  # exact
