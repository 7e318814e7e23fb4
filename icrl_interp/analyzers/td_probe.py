"""Linear TD-error probes: ridge regression from activations at a context column to delta_k, with
the baselines that say whether the activations carry more than their input.

The probes stream: each (layer, hook) keeps sufficient statistics (counts, sums, X^T X, X^T Y,
Y^T Y) per fold, for many targets at once, so a recording larger than memory is read once, in
chunks. Ridge with an intercept solved from these statistics is exactly scikit-learn's
`Ridge(alpha, fit_intercept=True)` (tested to 1e-9).

Splits are by *task id* (`prompts/task_id`; the prompt index where a recording has none), never by
prompt or column: every prompt of a task goes to the fold given by a counter-based hash of its task
id, so the split depends neither on the chunk size nor on the order of the prompts, and no task
is on both sides (a prompt file with 10 prompts per task must not leak). On large recordings a
hashed subset of the task ids can be used: a ridge on <= 16 features is saturated long before
hundreds of thousands of samples. Folds 0..K-1 are training folds (used to pick alpha by K-fold
CV), fold K is the held-out test set on which R^2 is reported.

Shuffled-label control: the targets of a prompt are replaced by those of its *partner*, the latest
earlier prompt (among those the probes use) whose task id differs (`PartnerChain`). So features and
targets always come from different tasks (pairing i with i XOR 1, as before, paired prompts of the
same task in a prompt file with several prompts per task, and the "control" then reproduced the
real R^2), and the pairing depends only on the recording, not on the chunking. The prompts of the
recording's first task have no earlier partner and are left out of every probe (probe, baselines
and control all use the same samples).

Selectivity: `probes.ProbeSet` fits every probe and its baselines with this module, then scores
the held-out prompts once more with the fitted coefficients (`residual_sums`) for per-task sums,
from which `resampled_sums` / `percentile_interval` give a bootstrap interval over held-out tasks.

All statistics of a fold live in one Gram matrix G = Z^T Z with Z = [X - x0, Y - y0, 1]. What is
shared is computed once: the shuffled control is just more target columns (the partner's Y), so it
shares X^T X with the probe and every target; the targets' own sums and squares are built once per
chunk for every probe on the same columns (`TargetBlock`), and so is the input baseline (one
accumulator per column set, `probes.ColumnGroup`). Per chunk a probe adds its features' products
per fold (`numpy_products`, or `TorchProducts` on the model's device in a live analysis on a GPU:
one batched GEMM for every fold); the probes on the same columns with the same shape do so in one call
(`update_together`), each getting the numbers it would get alone, bit for bit.

Floats: the statistics are always accumulated in float64 across chunks (`ProbeAccumulator.G`), and on
the CPU (`numpy_products`) every product is float64 too: the features, float32 activations included, are
shifted by their first kept samples' mean and cast to float64 once per chunk. A float32 X^T X would be as
fast but made the statistics depend on the chunking: between two chunk sizes the CV errors of the
penalties moved by up to 3e-5 of their scale (float32 rounding of sums over a chunk's ~30,000 rows,
measured on a softmax-td recording), against <= 2e-15 in float64, so a live analysis (small chunks) and
the analysis of its file would pick different penalties where the CV curve is flat (`tied_choice`).
`TorchProducts` (a live analysis on a GPU) runs its GEMMs in float64 too by default, and agrees with the
numpy path within k eps of its dtype at the products' scale (tests/analyzers/test_td_probe_gemm.py); its
float32 option is faster on GPUs without float64 units but moves the CV errors by float32 rounding, more
than the tie tolerance absorbs, so its penalties may differ from the file's where the curve is flat.

The penalty: K-fold CV over the training folds picks, per target, the smallest penalty whose CV error is
within rounding of the least (`tied_choice`), so that the choice does not depend on how the prompts were
cut into chunks.
"""
from __future__ import annotations

import contextvars
import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from jaxtyping import Bool, Float, Int

from ..core import threads
from ..core.errors import UserError

Array = np.ndarray

ALPHA_GRID = np.logspace(-10, 2, 13)
"""Ridge penalties tried, relative to the mean feature variance times the sample count."""
EPS64 = float(np.finfo(np.float64).eps)
TIE_EPS = 2.0**26
"""Penalties whose CV error exceeds the least by at most TIE_EPS float64 epsilons (1.5e-8) times the CV
error of the constant prediction are tied (`tied_choice`, where the number is justified)."""
MIN_UNIT = 1e-280
"""Floor of that unit (features that never vary have variance 0): every penalty stays a normal float, so the
solve gives coefficients 0 (the mean probe); a denormal penalty's reciprocal overflows and makes them NaN."""


def solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a x = b; the least-squares (minimum-norm) x where a is singular, e.g. features that never vary
    (a constant activation): the probe then predicts the mean instead of failing."""
    try:
        return np.linalg.solve(a, b)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(a, b, rcond=None)[0]


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 of each element: a counter-based hash, so a split is a pure function of (task id, seed)."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _task_uniform(task_id: np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per task id, a pure function of (task id, seed)."""
    h = splitmix64(np.asarray(task_id).astype(np.uint64) ^ splitmix64(np.array([seed]))[0])
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def task_subset(task_id: Int[Array, " batch"], seed: int, fraction: float) -> Bool[Array, " batch"]:
    """Prompts (whole tasks) kept for the probes when only `fraction` of the tasks is needed."""
    if fraction >= 1.0:
        return np.ones(np.shape(task_id), dtype=bool)
    return _task_uniform(task_id, seed + 0x5EED) < fraction


def task_folds(task_id: Int[Array, " batch"], seed: int, test_fraction: float, k: int) -> Int[Array, " batch"]:
    """Fold of each prompt by its task id: k (test) with probability test_fraction, else uniform in 0..k-1."""
    if not 0.0 < test_fraction < 1.0:
        raise UserError(f"probe test fraction must lie in (0, 1), got {test_fraction}")
    if k < 2:
        raise UserError(f"probe cross-validation needs at least 2 folds, got {k}")
    u = _task_uniform(task_id, seed)
    test = u < test_fraction
    train_fold = np.minimum((u - test_fraction) / (1 - test_fraction) * k, k - 1).astype(np.int64)
    return np.where(test, k, train_fold)


class PartnerChain:
    """The shuffled control's partner of each prompt: the latest earlier prompt (among the prompts
    the probes use, in recording order) whose task id differs, found while streaming.

    That is the prompt just before the start of the prompt's run of equal task ids. Between chunks
    at most two prompts are carried (the last one, and the one before its run) with their payload,
    so the pairing does not depend on the chunk size and memory does not grow. Only the first task
    of the recording has no partner. The partner may sit in another fold: its targets are then
    paired with features of an unrelated task on both sides of the split, which leaks nothing about
    the features-to-target relation the control measures. `link` is called with the chunks in order.
    """

    def __init__(self):
        self.carry: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def link(self, use: Bool[Array, " batch"], task: Int[Array, " batch"], rows: Int[Array, " batch"],
             payload: np.ndarray) -> tuple[Int[Array, " batch"], np.ndarray]:
        """(the partner's row, -1 where there is none; the partner's payload, NaN where none) for one
        chunk: `rows` are the prompts' indices in the recording, `payload` what to hand over (targets)."""
        sel = np.nonzero(use)[0]
        if self.carry is None:
            self.carry = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros((0, *payload.shape[1:])))
        c_task, c_rows, c_pay = self.carry
        t = np.concatenate([c_task, task[sel]])
        g = np.concatenate([c_rows, rows[sel]])
        p = np.concatenate([c_pay, payload[sel]])
        mate_row = np.full(len(use), -1, dtype=np.int64)
        out = np.full(payload.shape, np.nan)
        if t.size:
            run_start = np.maximum.accumulate(np.where(np.r_[True, t[1:] != t[:-1]], np.arange(t.size), 0))
            mate = run_start - 1  # the prompt before the run: a different task by construction
            m = mate[c_task.size :]
            ok = m >= 0
            mate_row[sel[ok]] = g[m[ok]]
            out[sel[ok]] = p[m[ok]]
            last = t.size - 1
            keep = [mate[last], last] if mate[last] >= 0 else [last]
            self.carry = (t[keep], g[keep], p[keep].copy())
        return mate_row, out


@dataclass
class RidgeStats:
    """Sufficient statistics of (X, y) as the Gram matrix of Z = [X - x0, y - y0, 1]."""

    n_features: int
    """Number of features F."""
    G: np.ndarray = field(default=None)
    """(F + 2) x (F + 2) Gram matrix."""
    x0: np.ndarray = field(default=None)
    """Origin of the features (a fixed shift for numerical stability)."""
    y0: float = 0.0
    """Origin of the targets."""

    def __post_init__(self):
        if self.G is None:
            self.G = np.zeros((self.n_features + 2, self.n_features + 2))
        if self.x0 is None:
            self.x0 = np.zeros(self.n_features)

    def set_origin(self, x0: np.ndarray, y0: float) -> None:
        self.x0, self.y0 = np.asarray(x0, dtype=np.float64), float(y0)

    def update(self, X: Float[Array, "m f"], y: Float[Array, " m"]) -> None:
        F = self.n_features
        Z = np.empty((X.shape[0], F + 2))
        Z[:, :F] = X
        Z[:, :F] -= self.x0
        Z[:, F] = y
        Z[:, F] -= self.y0
        Z[:, F + 1] = 1.0
        self.G += Z.T @ Z

    def __add__(self, other: "RidgeStats") -> "RidgeStats":
        return RidgeStats(self.n_features, self.G + other.G, self.x0, self.y0)

    def __sub__(self, other: "RidgeStats") -> "RidgeStats":
        return RidgeStats(self.n_features, self.G - other.G, self.x0, self.y0)

    @property
    def n(self) -> float:
        return float(self.G[-1, -1])

    def centred(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(X_c^T X_c, X_c^T y_c, y_c^T y_c) about the sample means."""
        F, G, n = self.n_features, self.G, self.n
        mx, my = G[:F, -1] / n, G[F, -1] / n
        return G[:F, :F] - n * np.outer(mx, mx), G[:F, F] - n * mx * my, float(G[F, F] - n * my * my)

    def fit(self, alpha: float) -> tuple[Float[Array, " f"], float]:
        """Ridge with intercept: (coef, intercept) in the original (unshifted) coordinates."""
        if self.n < 2:
            raise UserError("too few training samples for a ridge probe")
        cxx, cxy, _ = self.centred()
        coef = solve(cxx + alpha * np.eye(self.n_features), cxy)
        return coef, self._intercept(coef)

    def _intercept(self, coef: np.ndarray) -> float:
        F, G, n = self.n_features, self.G, self.n
        mx, my = G[:F, -1] / n + self.x0, G[F, -1] / n + self.y0
        return float(my - mx @ coef)

    def sse(self, coef: np.ndarray, intercept: float) -> float:
        """Sum of squared residuals of y - X coef - intercept over these samples: w^T G w with
        w = (-coef, 1, -b0) and b0 the intercept in shifted coordinates."""
        b0 = intercept - self.y0 + self.x0 @ coef
        w = np.concatenate([-coef, [1.0, -b0]])
        return max(float(w @ self.G @ w), 0.0)

    def sst(self) -> float:
        return max(self.centred()[2], 0.0)

    def r2(self, coef: np.ndarray, intercept: float) -> float:
        sst = self.sst()
        return math.nan if sst == 0.0 or self.n == 0 else 1.0 - self.sse(coef, intercept) / sst


def tied_choice(cv: Float[Array, "a t"], scale: Float[Array, " t"]) -> Int[Array, " t"]:
    """Per target (column), the index of the smallest penalty (rows: penalties in increasing order) whose
    CV error exceeds the least by at most TIE_EPS * eps64 * scale; `scale` is the CV error of the constant
    prediction (the training folds' mean, i.e. an infinite penalty), what a cross-validated R^2 is
    relative to.

    Why a tolerance: the CV error of a penalty is a sum over folds of quadratic forms w^T G_f w of
    statistics summed over chunks. Cutting the same prompts into other chunks (a live analysis's small
    chunks against its file's large ones: another order of the float sums and another shift x0) moves
    the computed errors by a few eps64 times the size of the forms' terms. Where the curve is flat to
    that level (features that hold the target exactly, or nothing of it: the shuffled control), the
    strict argmin then picks another penalty for another chunking, and the R^2 moved by up to 0.08
    (measured). Why this size: penalties closer than the tolerance are called equal, so the choice can
    still change only where the *difference* between a penalty's error and the least lies within its own
    rounding movement m of the tolerance's edge; as the grid's errors grow about 10x per step where a
    curve leaves its flat part, that happens for about 2 m / (tolerance ln 10) of the targets. Measured
    between 0.5-2 MiB and 128 MiB chunks on recordings of the shipped linear-td and softmax-td checkpoints
    (846 targets, float64 products), the differences from the least moved by a median 7 and at most
    6.2e3 eps64 * scale (the forms' terms exceed the scale where x0 is far from a fold's mean, or the
    fit is poor). TIE_EPS = 2^26 (1.5e-8 of the scale) puts the edge 1e4 times above the largest, so
    at most ~1 target in 10^4 can change sides (the closest of the 846 sat 0.14 % from the edge, 15 times
    the largest movement), and it is still far below any difference of fit a reported R^2 shows (a tied
    penalty's CV R^2 is within 1.5e-8 of the best's). Why the smallest: the least regularized of the fits
    equally good up to rounding, which is the old rule's choice wherever the least was clear, and for a
    probe that holds its target exactly the smallest penalty, whose coefficients keep the construction's
    direction (the largest tied penalty shrank the low-variance directions: the softmax-td theta* probe's
    direction cosine fell from 1 to 0.9997 while its CV R^2 stayed within 1e-8). Float32 GEMMs
    (`TorchProducts(dtype="float32")`) move the errors by float32 rounding, ~1e-5 of the scale: more than
    this tolerance absorbs."""
    cols = np.arange(cv.shape[1])
    low = cv[np.argmin(cv, axis=0), cols]
    tied = cv <= low + TIE_EPS * EPS64 * scale
    return np.argmax(tied, axis=0)  # the first tied row (the least itself is tied)


def select_alpha(folds: list[RidgeStats]) -> tuple[float, RidgeStats]:
    """The penalty with the least K-fold CV error (leaving out one training fold at a time), up to
    rounding (`tied_choice`: the smallest of those within it), and the pooled training statistics.
    Penalties are ALPHA_GRID times the mean feature variance times the sample count; one
    eigendecomposition per fold serves every penalty."""
    train = folds[0]
    for st in folds[1:]:
        train = train + st
    if train.n < 2:
        raise UserError("too few training tasks for a ridge probe")
    unit = max(float(np.trace(train.centred()[0])) / train.n_features, MIN_UNIT)
    alphas = unit * ALPHA_GRID
    cv, scale = np.zeros((len(alphas), 1)), np.zeros(1)
    for held in folds:
        rest = train - held
        if held.n == 0 or rest.n < 2:
            continue
        cxx, cxy, _ = rest.centred()
        lam, U = np.linalg.eigh(cxx)
        proj = U.T @ cxy
        for i, a in enumerate(alphas):
            coef = U @ (proj / (np.maximum(lam, 0.0) + a))
            cv[i] += held.sse(coef, rest._intercept(coef))
        zero = np.zeros(train.n_features)
        scale += held.sse(zero, rest._intercept(zero))  # the constant prediction (tied_choice)
    return float(alphas[tied_choice(cv, scale)[0]]), train


def fold_grouping(fold: Int[Array, " batch"], keep: Bool[Array, " batch"], k: int):
    """(order, bounds): prompts sorted by fold, fold f = order[bounds[f]:bounds[f+1]]; prompts
    not kept (no partner for the shuffled control) sort last and are left out."""
    key = np.where(keep, fold, k + 1)
    order = np.argsort(key, kind="stable")
    return order, np.searchsorted(key[order], np.arange(k + 2))


class TargetBlock:
    """The targets of one chunk's kept samples, sorted by fold and shifted by an origin shared by
    every probe on the same columns, with their per-fold sums and squares: built once per chunk
    and column set instead of once per probe (copying the targets dominated the probes' cost)."""

    def __init__(self, Y: list[np.ndarray], grouping, y0: np.ndarray | None = None):
        order, bounds = grouping
        self.rows = order[: bounds[-1]]
        cols = Y[0].shape[1]
        self.bounds = bounds * cols
        width = sum(y.shape[-1] for y in Y)
        self.Yz = np.empty((self.rows.size * cols, width))
        at = 0
        for y in Y:
            self.Yz[:, at : at + y.shape[-1]] = y[self.rows].reshape(-1, y.shape[-1])
            at += y.shape[-1]
        self.y0 = (self.Yz.mean(0) if self.rows.size else None) if y0 is None else y0
        if self.rows.size:
            self.Yz -= self.y0
        parts = [self.Yz[self.bounds[f] : self.bounds[f + 1]] for f in range(len(bounds) - 1)]
        self.sums = np.stack([p.sum(0) for p in parts])  # [folds + 1, width]: stacked once for every probe
        self.squares = np.stack([np.einsum("ij,ij->j", p, p) for p in parts])


def numpy_products(Xs: list[np.ndarray], rows: np.ndarray, x0: np.ndarray, Y: np.ndarray, bounds: np.ndarray):
    """(X_f^T X_f [P, f, F, F], X_f^T Y_f [P, f, F, T], column sums of X_f [P, f, F]) of every fold f of each of
    the P feature sets `Xs` ([batch, cols, F] each, one F), float64, where X_f are the samples
    bounds[f]:bounds[f+1] of X[rows] (prompts sorted by fold, each with its columns) shifted by that set's
    x0 [P, F], and Y_f the same rows of Y. Folds with no samples give zeros. Every product is float64
    whatever X's dtype (the module's note on floats).

    The sets lie in one float64 buffer [P, samples, F], each set's samples contiguous as if it were alone, so
    a fold costs one batched call per product for all P sets (a batched matmul is one BLAS call per set, on
    the same matrix): every number is bit for bit what the set alone gives (tested), with P times fewer
    calls."""
    P, (_, cols, F), folds = len(Xs), Xs[0].shape, len(bounds) - 1
    Xz = np.empty((P, rows.size, cols * F))
    x0 = np.tile(np.asarray(x0, dtype=np.float64), cols)  # [P, cols * F]: the shift of each column's features
    for p, X in enumerate(Xs):
        # the rows gathered, cast to float64 (exact) and shifted with one rounding, (x - x0) in float64, in one pass
        np.subtract(X.take(rows, axis=0).reshape(rows.size, -1), x0[p], out=Xz[p], dtype=np.float64)
    Xz = Xz.reshape(P, -1, F)
    XX, XY, sx = np.zeros((P, folds, F, F)), np.zeros((P, folds, F, Y.shape[1])), np.zeros((P, folds, F))
    for f in range(folds):
        lo, hi = bounds[f], bounds[f + 1]
        if hi > lo:
            Xf = Xz[:, lo:hi]
            Xt = Xf.transpose(0, 2, 1)
            XX[:, f], XY[:, f] = Xt @ Xf, Xt @ Y[lo:hi]
            # column sums in the order numpy sums one set's [m, F] block: row by row (einsum does that, 2-4x
            # faster than a sum over the middle axis), a single column (F = 1) pairwise, which einsum does not
            sx[:, f] = np.einsum("pmf->pf", Xf) if F > 1 else Xf.sum(1)
    return XX, XY, sx


class TorchProducts:
    """`numpy_products` with torch on `device`, as one batched GEMM per chunk and feature set: the fold-sorted
    samples padded to [folds, m, F + 1 + T] (zero rows add nothing), Z_f^T [X_f | 1 | Y_f] gives X^T X, the
    column sums and X^T Y of every fold at once. The shift by x0 is done in float64, the GEMM in
    `dtype` (float64 unless told "float32"; the module's note on floats), and the
    results come back as float64 numpy for the accumulator. Live analysis on a GPU uses it (`on_device`); on the CPU the
    numpy path stays, so that a live analysis equals the recording's analyzed in the same chunks bit for bit."""

    def __init__(self, device="cpu", dtype: str = "float64"):
        import torch

        self.torch, self.device = torch, torch.device(device)
        self.dtype = getattr(torch, dtype)

    def __call__(self, Xs: list[np.ndarray], rows: np.ndarray, x0: np.ndarray, Y: np.ndarray, bounds: np.ndarray):
        parts = [self.one(X, rows, x0p, Y, bounds) for X, x0p in zip(Xs, x0)]
        return tuple(np.stack(part) for part in zip(*parts))

    def one(self, X: np.ndarray, rows: np.ndarray, x0: np.ndarray, Y: np.ndarray, bounds: np.ndarray):
        """The products of one feature set ([folds, ...] each)."""
        torch, dev = self.torch, self.device
        F, T, folds = X.shape[-1], Y.shape[1], len(bounds) - 1
        x = torch.as_tensor(np.ascontiguousarray(X[rows].reshape(-1, F)[: bounds[-1]])).to(dev, non_blocking=True)
        counts = torch.as_tensor(np.diff(bounds), device=dev)
        fold = torch.repeat_interleave(torch.arange(folds, device=dev), counts)
        at = torch.arange(x.shape[0], device=dev) - torch.as_tensor(bounds[:-1], device=dev)[fold]
        dtype = self.dtype
        Z = torch.zeros((folds, max(int(counts.max()), 1), F + 1 + T), dtype=dtype, device=dev)
        Z[fold, at, :F] = (x.to(torch.float64) - torch.as_tensor(x0, dtype=torch.float64, device=dev)).to(dtype)
        Z[fold, at, F] = 1.0
        Z[fold, at, F + 1 :] = torch.as_tensor(Y[: bounds[-1]], device=dev).to(dtype)
        P = (Z[:, :, :F].transpose(1, 2) @ Z).to(torch.float64).cpu().numpy()
        return P[:, :, :F], P[:, :, F + 1 :], P[:, :, F]


STACK_BYTES = 4 * 2**20
"""Float64 features of one products call at most (`update_together`): several probes' samples in one buffer
save calls, but past the cache's size the products slowed down (a file's 128 MiB chunks), and an analysis's
memory would grow with its number of probes."""


PRODUCTS = contextvars.ContextVar("td_probe_products", default=numpy_products)
"""How new accumulators compute their per-chunk products (`numpy_products` unless `on_device` says otherwise)."""


@contextmanager
def on_device(device):
    """Accumulators created inside use `TorchProducts(device)` when `device` (the model's: a torch.device
    or its name) is not the CPU, and numpy otherwise."""
    name = str(device) if device is not None else "cpu"
    token = PRODUCTS.set(TorchProducts(name) if not name.startswith("cpu") else numpy_products)
    try:
        yield
    finally:
        PRODUCTS.reset(token)


@dataclass
class ProbeAccumulator:
    """Fold-wise statistics of ridge probes from one feature set to T targets at once (the
    shuffled control's targets are just more targets), held in float64 whatever the GEMMs' dtype."""

    n_features: int
    """Features per sample."""
    n_targets: int = 1
    """Targets per sample."""
    k: int = 5
    """Training folds for choosing alpha; fold k is the held-out test set."""
    G: np.ndarray = field(default=None)
    x0: np.ndarray = field(default=None)
    y0: np.ndarray = field(default=None)
    products: object = field(default=None, repr=False)
    """The per-chunk products (`numpy_products`, `TorchProducts`); None: the current `PRODUCTS`."""

    def __post_init__(self):
        size = self.n_features + self.n_targets + 1
        self.G = np.zeros((self.k + 1, size, size))  # float64: the sums across chunks
        self.products = self.products or PRODUCTS.get()

    def update(self, X: Float[Array, "batch cols f"], targets, grouping=None) -> None:
        """Add samples (one per prompt and column) of the prompts a chunk's fold grouping keeps.
        `targets` is a `TargetBlock` shared by every probe on the same columns (its first
        n_targets targets are used), or a list of [batch, cols, t] arrays with `grouping`
        (`update_together` adds several accumulators' samples at once)."""
        if not isinstance(targets, TargetBlock):
            targets = TargetBlock(targets, grouping, self.y0)  # shifted by this accumulator's origin
        update_together([self], [X], targets)

    def _add(self, XX: np.ndarray, XY: np.ndarray, sx: np.ndarray, tb: "TargetBlock", bounds: np.ndarray) -> None:
        """Add one chunk's products ([k + 1 folds, ...] each) and its targets' sums and squares to G.

        Only the parts of G a ridge fit and its residuals need are accumulated: X^T [X, Y, 1], the
        sums row and the diagonal of Y^T Y (w_t^T G w_t never touches Y_s^T Y_t, s != t), and the
        target parts come precomputed with the block: with many targets that is several times
        cheaper than Z^T Z per probe. `_gram` fills in the symmetric part."""
        F, T, folds = self.n_features, self.n_targets, self.k + 1
        G, diag = self.G, np.arange(F, F + T)
        G[:, :F, :F] += XX
        G[:, :F, F : F + T] += XY
        G[:, :F, -1] += sx
        G[:, -1, :F] += sx
        G[:, -1, F : F + T] += tb.sums[:folds, :T]
        G[:, diag, diag] += tb.squares[:folds, :T]
        G[:, -1, -1] += np.diff(bounds)

    def _gram(self) -> np.ndarray:
        """The per-fold G with its symmetric blocks filled in (Y^T Y off the diagonal stays 0)."""
        F, T = self.n_features, self.n_targets
        G = self.G.copy()
        G[:, F : F + T, :F] = np.swapaxes(G[:, :F, F : F + T], 1, 2)
        G[:, F : F + T, -1] = G[:, -1, F : F + T]
        return G

    def _centred(self, G: np.ndarray):
        """(n, mean x, mean y, X_c^T X_c, X_c^T Y_c) in shifted coordinates."""
        F, T = self.n_features, self.n_targets
        n = G[-1, -1]
        mx, my = G[:F, -1] / n, G[F : F + T, -1] / n
        return n, mx, my, G[:F, :F] - n * np.outer(mx, mx), G[:F, F : F + T] - n * np.outer(mx, my)

    def _sse(self, G: np.ndarray, coef: np.ndarray, b0: np.ndarray) -> np.ndarray:
        """Sum of squared residuals per target, w_t^T G w_t with w_t = (-coef_t, e_t, -b0_t)."""
        W = np.vstack([-coef, np.eye(self.n_targets), -b0[None]])
        return np.maximum(((G @ W) * W).sum(0), 0.0)

    def cv_errors(self, G: np.ndarray, alphas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(CV error [A, T] of every penalty and target, CV error [T] of the constant prediction): the
        residuals of each training fold of `G` ([k + 1 folds, ...], the _gram) under the fit to the other
        training folds, summed over folds (the constant one: an infinite penalty, coefficients 0, for
        `tied_choice`). One eigendecomposition per fold, one product per fold for every penalty and target."""
        F, T, k = self.n_features, self.n_targets, self.k
        train = G[:k].sum(0)
        alphas = np.append(alphas, np.inf)  # the last row: the constant prediction (coef / inf = 0)
        cv = np.zeros((len(alphas), T))
        for held in G[:k]:
            rest = train - held
            if held[-1, -1] == 0 or rest[-1, -1] < 2:
                continue
            _, rmx, rmy, rxx, rxy = self._centred(rest)
            lam, U = np.linalg.eigh(rxx)
            coef = U @ ((U.T @ rxy) / (np.maximum(lam, 0.0)[:, None] + alphas[:, None, None]))  # [A, F, T]
            W = np.empty((F + T + 1, len(alphas), T))  # w_(a, t) = (-coef_a,t, e_t, -b0_a,t), as in _sse
            W[:F] = -np.moveaxis(coef, 1, 0)
            W[F : F + T] = np.eye(T)[:, None, :]
            W[-1] = -(rmy - rmx @ coef)
            W = W.reshape(F + T + 1, -1)
            cv += np.maximum(((held @ W) * W).sum(0), 0.0).reshape(cv.shape)
        return cv[:-1], cv[-1]

    def result(self) -> dict:
        """Per target: the penalty chosen by K-fold CV over the training folds (ALPHA_GRID times the
        mean feature variance times the sample count; the smallest within rounding of the least CV error,
        `tied_choice`), the training fit, and its held-out sse / sst / R^2 on fold k."""
        F, T, k = self.n_features, self.n_targets, self.k
        G = self._gram()
        test, train = G[k], G[:k].sum(0)
        if test[-1, -1] == 0:
            raise UserError("no held-out tasks for the probe: record more prompts (or tasks)")
        if train[-1, -1] < 2:
            raise UserError("too few training tasks for a ridge probe")
        n, mx, my, cxx, cxy = self._centred(train)
        alphas = max(float(np.trace(cxx)) / F, MIN_UNIT) * ALPHA_GRID
        best = tied_choice(*self.cv_errors(G, alphas))
        coef = np.empty((F, T))
        for i in np.unique(best):
            coef[:, best == i] = solve(cxx + alphas[i] * np.eye(F), cxy[:, best == i])
        b0 = my - mx @ coef
        nt, _, tmy, _, _ = self._centred(test)
        sse = self._sse(test, coef, b0)
        sst = np.maximum(np.diag(test)[F : F + T] - nt * tmy**2, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            r2 = np.where(sst > 0, 1.0 - sse / sst, np.nan)
        return {"r2": r2, "sse": sse, "sst": sst, "alpha": alphas[best], "coef": coef,
                "intercept": (my + self.y0) - (mx + self.x0) @ coef, "n_train": int(n), "n_test": int(nt)}


def update_together(accs: list[ProbeAccumulator], Xs: list[np.ndarray], tb: TargetBlock) -> None:
    """`ProbeAccumulator.update` of accumulators of one shape (features, targets, folds; the same products)
    with their features `Xs` ([batch, cols, F] each) on one chunk's targets `tb`: one call of the products
    for as many of them as STACK_BYTES of float64 features hold (`numpy_products`), each accumulator's sums
    the same, bit for bit, as alone."""
    acc0 = accs[0]
    F, T = acc0.n_features, acc0.n_targets
    if tb.rows.size == 0:
        return
    for acc, X in zip(accs, Xs):
        if acc.x0 is None:  # a fixed shift for numerical stability: the first kept samples' mean
            acc.x0, acc.y0 = X[tb.rows].reshape(-1, F).mean(0), tb.y0[:T]
    bounds = tb.bounds[: acc0.k + 2]  # a grouping's samples past fold k (none kept) are left out
    step = max(1, STACK_BYTES // (int(bounds[-1]) * F * 8 or 1))
    for lo in range(0, len(accs), step):
        part = accs[lo : lo + step]
        XX, XY, sx = acc0.products(Xs[lo : lo + step], tb.rows, np.stack([acc.x0 for acc in part]), tb.Yz[:, :T],
                                   bounds)
        for i, acc in enumerate(part):
            acc._add(XX[i], XY[i], sx[i], tb, bounds)


def residual_sums(X: Float[Array, "batch cols f"], Y: Float[Array, "batch cols t"] | list, coef: np.ndarray,
                  intercept: np.ndarray) -> Float[Array, "batch t"]:
    """Per prompt and target, the sum over columns of the squared held-out residuals of a fitted probe. `Y` may
    be a list of arrays whose last axes, side by side, are the targets (a probe's own and its partners': no
    joined copy). The residuals (Y - X coef) - intercept are formed in the predictions' buffer, with the same
    float64 operations in the same order as the expression, so the sums are the same bit for bit."""
    parts = Y if isinstance(Y, (list, tuple)) else [Y]
    r = (X.reshape(-1, X.shape[-1]) @ coef).reshape(*X.shape[:2], coef.shape[1])
    r = r.astype(np.result_type(r, intercept, *parts), copy=False)  # the expression's dtype (float64: a no-op)
    at = 0
    for part in parts:
        view = r[..., at : at + part.shape[-1]]
        np.subtract(part, view, out=view)
        at += part.shape[-1]
    r -= intercept
    np.multiply(r, r, out=r)
    return r.sum(1)


BOOTSTRAP = 1000
"""Resamples of the held-out tasks for the selectivity interval."""
MIN_CI_TASKS = 5
"""Fewer held-out tasks than this: no interval (null)."""
LEVEL = 0.95
"""Coverage of the selectivity interval."""


def r2_of_sums(sse, n, sy, syy):
    """R^2 from summed residuals and target sums (n samples, sum y, sum y^2); NaN where sst = 0."""
    sst = syy - sy * sy / np.maximum(n, 1e-300)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sst > 1e-300, 1.0 - sse / sst, np.nan)


def resampled_sums(M: Float[Array, "tasks c"], seed: int, resamples: int = BOOTSTRAP):
    """Column sums of M over bootstrap resamples of its rows (tasks drawn with replacement), a block
    of resamples at a time ([b, c] each). The block's weight matrix holds at most ~2^15 entries, so
    memory does not grow with the number of resamples; one matrix product serves every column, so
    all probes, baselines and targets share the same resamples. SPREAD_BLOCKS blocks are drawn at a time, in
    order (the same draws as one by one), and their products computed side by side (`threads.spread`): each
    block's sums are the same, bit for bit, as in one thread."""
    tasks = M.shape[0]
    rng = np.random.default_rng([seed, 0xB007])
    block = max(1, (1 << 15) // max(tasks, 1))
    sizes = [min(block, resamples - lo) for lo in range(0, resamples, block)]

    def weights(b: int) -> np.ndarray:  # [b, tasks]: how often each resample draws each task
        draw = rng.integers(0, tasks, size=(b, tasks)) + (np.arange(b) * tasks)[:, None]  # flat (resample, task)
        return np.bincount(draw.ravel(), minlength=b * tasks).reshape(b, tasks).astype(np.float64)

    with threads.spread() as run:
        for at in range(0, len(sizes), SPREAD_BLOCKS):
            yield from run(lambda w: w @ M, [weights(b) for b in sizes[at : at + SPREAD_BLOCKS]])


SPREAD_BLOCKS = 8
"""Blocks of resamples drawn at once in `resampled_sums` and multiplied side by side (their weights: ~2 MiB)."""


def percentile_interval(samples: Float[Array, "r t"], level: float = 0.95) -> Float[Array, "2 t"]:
    """The central `level` percentile interval of each column, over its finite samples (NaN if none):
    the columns with every sample finite in one call, the others one by one."""
    tail = (1 - level) / 2 * 100
    out = np.full((2, samples.shape[1]), np.nan)
    ok = np.isfinite(samples)
    whole = ok.all(0)
    if whole.any():
        out[:, whole] = np.percentile(samples[:, whole], [tail, 100 - tail], axis=0)
    for t in np.nonzero(~whole & ok.any(0))[0]:
        out[:, t] = np.percentile(samples[ok[:, t], t], [tail, 100 - tail])
    return out


def max_baseline(base: Float[Array, "... b t"]) -> Float[Array, "... t"]:
    """The largest baseline R^2 along axis -2, ignoring NaN ones (NaN only when all are). The baselines are
    few: fmax of one after the other is the same (a maximum is exact) and several times faster than a
    reduction along the short axis (the bootstrap calls this on [resamples, probes, baselines, targets])."""
    worst = np.full(base.shape[:-2] + base.shape[-1:], -np.inf)
    for b in np.moveaxis(base, -2, 0):
        np.fmax(worst, b, out=worst)  # fmax ignores NaN
    return np.where(np.isneginf(worst), np.nan, worst)
