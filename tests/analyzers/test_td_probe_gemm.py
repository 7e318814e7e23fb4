"""The TD probes' per-chunk products (icrl_interp/analyzers/td_probe.py: `numpy_products`, `TorchProducts`,
`on_device`): each fold's X^T X, X^T Y and column sums against the Gram matrix of Z = [X - x0, Y, 1]
written out per fold; the torch path (the one a GPU runs, here on the CPU) against the numpy path, in
float64 and in float32; the statistics held in float64 across chunks whatever the GEMMs' dtype.

Mutants killed: a transposed or wrong-fold product (X_f^T Y_g, XX of the next fold), a dropped shift or
sum, the fold padding of the batched GEMM leaking rows into another fold, the accumulation in float32,
float32 GEMMs for float32 features on the numpy path or by default on the torch path (the penalty choice
needs float64 products: td_probe's note on floats), `on_device` ignoring the device."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import float_tol

from icrl_interp.analyzers import td_probe as T

K = 4  # training folds; fold K is the held-out one


def _chunk(rng, B=40, n=6, F=5, t=3, dtype=np.float64):
    """(X [B, n, F], Y [B, n, t], task folds, kept prompts) of one chunk, the features far from 0."""
    X = (rng.standard_normal((B, n, F)) * [1.0, 4.0, 0.3, 2.0, 1.0][:F] + 3.0).astype(dtype)
    Y = rng.standard_normal((B, n, t))
    fold = T.task_folds(rng.integers(0, 1 << 40, B), 1, 0.25, K)
    keep = rng.random(B) > 0.1
    return X, Y, fold, keep


def _direct(X, Y, fold, keep, x0):
    """Per fold, Z^T Z of Z = [X - x0, Y, 1] over the kept prompts of the fold, written out in float64 (the shift too)."""
    F = X.shape[-1]
    out = []
    for f in range(K + 1):
        sel = keep & (fold == f)
        Z = np.concatenate([X[sel].reshape(-1, F).astype(np.float64) - x0, Y[sel].reshape(-1, Y.shape[-1]),
                            np.ones((int(sel.sum()) * X.shape[1], 1))], 1).astype(np.float64)
        out.append(Z.T @ Z)
    return np.stack(out)


def _products(fn, X, Y, fold, keep, x0):
    order, bounds = T.fold_grouping(fold, keep, K)
    cols = X.shape[1]
    rows = order[: bounds[-1]]
    XX, XY, sx = fn([X], rows, x0[None], Y[rows].reshape(-1, Y.shape[-1]), bounds * cols)
    return XX[0], XY[0], sx[0]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("fn", [T.numpy_products, T.TorchProducts("cpu")], ids=["numpy", "torch"])
def test_products_are_each_folds_gram_blocks(rng, fn, dtype):
    """float64 products whatever the features' dtype: float32 features too are within k eps64 of the
    float64 Gram blocks (a float32 GEMM would be ~1e7 times further off)."""
    X, Y, fold, keep = _chunk(rng, dtype=dtype)
    F = X.shape[-1]
    x0 = X.reshape(-1, F).mean(0)
    XX, XY, sx = _products(fn, X, Y, fold, keep, x0)
    G = _direct(X, Y, fold, keep, x0)
    tol = float_tol(np.float64, np.abs(G).max() * X.shape[0] * X.shape[1])
    np.testing.assert_allclose(XX, G[:, :F, :F], rtol=0, atol=tol)
    np.testing.assert_allclose(XY, G[:, :F, F:-1], rtol=0, atol=tol)
    np.testing.assert_allclose(sx, G[:, :F, -1], rtol=0, atol=tol)
    assert np.abs(sx).max() > 1.0 and np.abs(XY).max() > 1.0  # the blocks are not trivially 0 (a dropped shift shows)


def _accumulate(products, chunks, F, t):
    acc = T.ProbeAccumulator(F, t, k=K, products=products)
    for X, Y, fold, keep in chunks:
        acc.update(X, [Y], T.fold_grouping(fold, keep, K))
    return acc


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_torch_path_equals_the_numpy_path_across_chunks(rng, dtype):
    """Many chunks: the torch path's statistics and fits equal the numpy path's within k eps of the GEMMs'
    dtype at the scale of the sums (float32 features here through the float32 option), and both are held
    in float64."""
    chunks = [_chunk(rng, dtype=dtype) for _ in range(25)]
    F, t = chunks[0][0].shape[-1], chunks[0][1].shape[-1]
    ref = _accumulate(T.numpy_products, chunks, F, t)
    got = _accumulate(T.TorchProducts("cpu", dtype=np.dtype(dtype).name), chunks, F, t)
    assert ref.G.dtype == got.G.dtype == np.float64  # the sums across chunks are float64
    rows = sum(c[0].shape[0] * c[0].shape[1] for c in chunks)
    scale = np.abs(ref.G).max()
    tol = float_tol(dtype, scale, k=64 * np.sqrt(rows))
    np.testing.assert_allclose(got.G, ref.G, rtol=0, atol=tol)
    a, b = ref.result(), got.result()
    np.testing.assert_allclose(b["r2"], a["r2"], rtol=0, atol=float_tol(dtype, 1.0, k=64 * np.sqrt(rows)))


def test_float32_gemms_accumulate_in_float64(rng):
    """float64 features through float32 GEMMs (`TorchProducts(dtype='float32')`) stay within k eps32 of the
    all-float64 statistics, which the late chunks of small features move by far more than that."""
    big = _chunk(rng)
    big = (big[0] * 1e3, *big[1:])
    small = [(c[0] * 1e-2, *c[1:]) for c in (_chunk(rng) for _ in range(40))]
    chunks = [big, *small]
    F, t = big[0].shape[-1], big[1].shape[-1]
    ref = _accumulate(T.numpy_products, chunks, F, t)
    got = _accumulate(T.TorchProducts("cpu", dtype="float32"), chunks, F, t)
    assert got.G.dtype == np.float64
    per_chunk = [np.abs(_direct(*c, ref.x0)).max() * c[0].shape[0] * c[0].shape[1] for c in chunks]
    tol = float_tol(np.float32, sum(per_chunk), k=4)  # each chunk's float32 GEMM error, summed exactly in float64
    np.testing.assert_allclose(got.G, ref.G, rtol=0, atol=tol)
    late = ref.G - _accumulate(T.numpy_products, chunks[:1], F, t).G
    assert np.abs(late).max() > 100 * tol  # the small chunks matter at this tolerance


def test_on_device_picks_the_torch_path_off_the_cpu():
    assert T.ProbeAccumulator(2, 1).products is T.numpy_products
    with T.on_device(torch.device("cpu")):
        assert T.ProbeAccumulator(2, 1).products is T.numpy_products  # the CPU keeps numpy: live == recording bits
    with T.on_device("cuda:0"):  # constructing needs no GPU; only computing would
        acc = T.ProbeAccumulator(2, 1)
        assert isinstance(acc.products, T.TorchProducts) and acc.products.device.type == "cuda"
    assert T.ProbeAccumulator(2, 1).products is T.numpy_products  # restored after the block


@pytest.mark.parametrize("F", [1, 5])
def test_sets_stacked_in_one_call_give_each_set_its_own_products(rng, F):
    """`numpy_products` of several feature sets at once (a chunk's probes of one shape: `update_together`) gives
    every set, bit for bit, the products it gives alone, whatever it is stacked with; so which probes share a
    call (the random-init baselines join the input baseline's call) never changes a result. Exact by
    construction: each set's block is contiguous as if alone, a batched matmul is one BLAS call per set on that
    block, and the sums add in the order numpy sums one block (row by row; a single column pairwise).

    Mutants: one set's shift x0 used for all, the sets' sums or products swapped or taken over another axis, a
    lone feature's sums added row by row (einsum's order) instead of numpy's pairwise sum of a column."""
    chunks = [_chunk(rng, B=300, F=F, dtype=dt) for dt in (np.float32, np.float64, np.float32)]  # ~300 rows a fold
    fold, keep = chunks[0][2], chunks[0][3]
    Xs = [c[0] * (1.0 + i) + i for i, c in enumerate(chunks)]  # sets of other scales and means
    x0 = np.stack([X.reshape(-1, F).mean(0) for X in Xs])
    order, bounds = T.fold_grouping(fold, keep, K)
    rows, cols = order[: bounds[-1]], Xs[0].shape[1]
    Y = chunks[0][1][rows].reshape(-1, chunks[0][1].shape[-1])
    together = T.numpy_products(Xs, rows, x0, Y, bounds * cols)
    for p, X in enumerate(Xs):
        alone = T.numpy_products([X], rows, x0[p : p + 1], Y, bounds * cols)
        for got, want in zip(together, alone):
            np.testing.assert_array_equal(got[p], want[0])  # exact by construction (docstring)
    # set 1 (float64: sums of float32 samples are exact in float64 in any order here) alone, fold-sorted
    Xz = np.subtract(Xs[1][rows].reshape(-1, F), x0[1], dtype=np.float64)
    for f, (lo, hi) in enumerate(zip(bounds[:-1] * cols, bounds[1:] * cols)):
        # exact by construction: numpy's sum of the same block, the order the previous version summed in (a lone
        # feature pairwise, its error growing as log m, not as m; F > 1 row by row)
        np.testing.assert_array_equal(together[2][1, f], Xz[lo:hi].sum(0))
    direct = _direct(Xs[1], chunks[0][1], fold, keep, x0[1])  # and they are the products (k eps64)
    np.testing.assert_allclose(together[2][1], direct[:, :F, -1], rtol=0,
                               atol=float_tol(np.float64, np.abs(direct).max() * Xs[1].shape[0] * cols))


@pytest.mark.parametrize("stack_bytes", [T.STACK_BYTES, 1])
def test_accumulators_updated_together_equal_each_alone(rng, monkeypatch, stack_bytes):
    """`update_together` (one products call for a chunk's accumulators of one shape, or one call each when
    STACK_BYTES holds only one set) leaves every accumulator with the statistics and origin (x0, y0) it has
    when updated alone, bit for bit (exact: the same products, the test above, added in the same order).
    Mutants: only the first accumulator's origin set, the first one's products added to every accumulator,
    a call given every set or the wrong sets when they are split."""
    monkeypatch.setattr(T, "STACK_BYTES", stack_bytes)
    chunks = [_chunk(rng) for _ in range(3)]
    F, t = chunks[0][0].shape[-1], chunks[0][1].shape[-1]
    alone = [T.ProbeAccumulator(F, t, k=K) for _ in range(3)]
    both = [T.ProbeAccumulator(F, t, k=K) for _ in range(3)]
    for X, Y, fold, keep in chunks:
        Xs = [X, (X * 3.0 - 1.0).astype(np.float32), X[..., ::-1] + 2.0]
        tb = T.TargetBlock([Y], T.fold_grouping(fold, keep, K), both[0].y0)
        T.update_together(both, Xs, tb)
        for acc, Xp in zip(alone, Xs):
            acc.update(Xp, [Y], T.fold_grouping(fold, keep, K))
    for a, b in zip(alone, both):
        for name in ("G", "x0", "y0"):
            np.testing.assert_array_equal(getattr(b, name), getattr(a, name))  # exact (docstring)
    assert not np.array_equal(both[0].G, both[1].G) and not np.array_equal(both[1].G, both[2].G)  # all differ
