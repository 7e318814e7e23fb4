"""Kernel diagonality (Xie et al., Assumption 5.1) from recorded softmax patterns.

Orientation: patterns are TransformerLens-style [batch, head, target q, source k]
(each target's weights over sources sum to 1). The state of position p is
`states[:, p]` (the softmax prompt's column k = p + 1 holds S_{k-1} = S_p).

Definitions (docs/concepts.md, section Softmax TD), per task:
  M_hat(s, s') = mean over targets j with state s of  sum_k K[j <- k] 1{state_k = s'}
so M_hat is row-stochastic over s' when every source has a state label. Diagonality
of a task = its diagonal over the states that occur both as a target and as a source
(a state never visited as a source, e.g. one seen only at the query, has
M_hat(s, s) = 0 whatever the kernel: that is missing context coverage, not a
kernel property, so such rows are left out). A layer contracts in the infinity
norm iff min_s M_hat(s, s) > (1 + gamma) / 2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from jaxtyping import Float, Int

Array = np.ndarray


def onehot(states: Int[Array, "batch pos"], n_states: int) -> Float[Array, "batch pos s"]:
    """One-hot rows; a negative state (no label) gives a zero row."""
    out = np.zeros(states.shape + (n_states,))
    b, p = np.nonzero(states >= 0)
    out[b, p, states[b, p]] = 1.0
    return out


def state_kernel(
    pattern: Float[Array, "batch heads q k"],
    target_states: Int[Array, "batch q"],
    source_states: Int[Array, "batch k"],
    n_states: int,
) -> tuple[Float[Array, "batch heads s s"], Float[Array, "batch s"]]:
    """Per task: M_hat(s, s') and target counts per state.

    Rows of states that are not both a target and a source (a position with non-zero
    weight from some target) are NaN.
    """
    # batched matmuls in the pattern's own dtype (einsum does not use BLAS here)
    src = onehot(source_states, n_states).astype(pattern.dtype)
    tgt = onehot(target_states, n_states).astype(pattern.dtype)
    agg = pattern @ src[:, None]  # [b, h, q, s]: weight of each target on each source state
    sums = (np.swapaxes(tgt, 1, 2)[:, None] @ agg).astype(np.float64)
    counts = tgt.sum(axis=1, dtype=np.float64)
    # a source is a position some target attends to (the masked query column is none)
    as_source = ((pattern.sum(axis=2) > 0).astype(pattern.dtype) @ src) > 0
    rows = np.where((counts[:, None, :] > 0) & as_source, counts[:, None, :], np.nan)
    return sums / rows[..., None], counts


def population_kernel(
    A11: Float[Array, "d d"], x: Float[Array, "batch s d"], mu: Float[Array, "batch s"]
) -> Float[Array, "batch s s"]:
    """M_pi(s, s') = mu(s') exp(x(s')^T A11 x(s)) / sum_u mu(u) exp(x(u)^T A11 x(s)).

    Row s is the target state, column s' the source state (docs/concepts.md, section Softmax TD).
    """
    scores = (x @ A11.T) @ np.swapaxes(x, 1, 2)  # [b, target s, source u] = x_u^T A11 x_s
    scores = scores - scores.max(axis=-1, keepdims=True)
    w = mu[:, None, :] * np.exp(scores)
    return w / w.sum(axis=-1, keepdims=True)


def task_diagonals(M: Float[Array, "batch s s"]) -> tuple[Float[Array, " batch"], Float[Array, " batch"]]:
    """Per task: mean and minimum of the diagonal over the states present (non-NaN)."""
    diag = np.diagonal(M, axis1=-2, axis2=-1)
    present = np.isfinite(diag)
    n = present.sum(-1)
    safe = np.where(present, diag, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = safe.sum(-1) / n
    mins = np.where(present, diag, np.inf).min(-1)
    mins = np.where(n > 0, mins, np.nan)
    return mean, mins


@dataclass
class DiagonalityAccumulator:
    """Streams per-task diagonals into the contract's {mean, min, margin} and the task-averaged M_hat."""

    gamma: float
    """Discount; the contraction threshold is (1 + gamma) / 2."""
    n_states: int
    """Number of states."""
    tasks: int = 0
    sum_mean: float = 0.0
    sum_min: float = 0.0
    worst: float = math.inf
    contracting: int = 0
    M_sum: np.ndarray = field(default=None)
    M_count: np.ndarray = field(default=None)

    def __post_init__(self):
        self.M_sum = np.zeros((self.n_states, self.n_states))
        self.M_count = np.zeros(self.n_states)

    def update(self, M: Float[Array, "batch s s"]) -> None:
        mean, mins = task_diagonals(M)
        ok = np.isfinite(mins)
        self.tasks += int(ok.sum())
        self.sum_mean += float(mean[ok].sum())
        self.sum_min += float(mins[ok].sum())
        if ok.any():
            self.worst = min(self.worst, float(mins[ok].min()))
        self.contracting += int((mins[ok] > (1 + self.gamma) / 2).sum())
        rows = np.isfinite(M).all(-1)
        self.M_sum += np.where(rows[..., None], M, 0.0).sum(0)
        self.M_count += rows.sum(0)

    def result(self, with_matrix: bool = True) -> dict | None:
        """mean = average over tasks of the mean diagonal; min = average over tasks of the minimum
        diagonal; margin = min - (1 + gamma) / 2; plus the worst task, the fraction of tasks whose
        layer contracts, and the task-averaged matrix."""
        if self.tasks == 0:
            return None
        mn = self.sum_min / self.tasks
        out = {
            "mean": self.sum_mean / self.tasks,
            "min": mn,
            "margin": mn - (1 + self.gamma) / 2,
            "threshold": (1 + self.gamma) / 2,
            "worst_task_min": self.worst,
            "frac_tasks_contracting": self.contracting / self.tasks,
            "n_tasks": self.tasks,
        }
        if with_matrix:
            with np.errstate(invalid="ignore", divide="ignore"):
                avg = self.M_sum / self.M_count[:, None]
            out["M_hat"] = [[None if not np.isfinite(v) else float(v) for v in row] for row in avg]
        return out


def self_mass(
    pattern: Float[Array, "batch heads q k"], q_pos: Int[Array, " q"], k_pos: Int[Array, " k"]
) -> Float[Array, " batch"]:
    """Label-free: mean over targets j that are also sources of the weight K[j <- j] on itself."""
    kidx = {int(p): i for i, p in enumerate(k_pos)}
    pairs = [(i, kidx[int(p)]) for i, p in enumerate(q_pos) if int(p) in kidx]
    if not pairs:
        return np.full(pattern.shape[0], np.nan)
    qi, ki = np.array(pairs).T
    return pattern[:, :, qi, ki].mean(axis=(1, 2))


def feature_ids(features: Float[Array, "batch pos f"], rel_tol: float = 1e-9) -> Float[Array, "batch pos"]:
    """A scalar fingerprint per column: equal feature vectors give equal ids (random projection).

    Two distinct vectors collide only on a measure-zero set, so comparing ids is
    comparing feature vectors, in O(pos) per prompt instead of O(pos^2 f).
    """
    r = np.random.default_rng(0x5EED).standard_normal(features.shape[-1])
    scale = np.abs(features).max() if features.size else 1.0
    return np.round(features @ r / (max(scale, 1e-300) * rel_tol))


def same_feature_mass(
    pattern: Float[Array, "batch heads q k"], ids_q: Float[Array, "batch q"], ids_k: Float[Array, "batch k"]
) -> Float[Array, " batch"]:
    """Label-free: mean over targets of the weight on sources whose feature vector equals the target's.

    With one-hot (or otherwise distinct) state features this equals the mean over targets of
    M_hat(S_j, S_j), i.e. the diagonal mass, without needing state labels.
    """
    same = ids_q[:, None, :, None] == ids_k[:, None, None, :]
    return np.where(same, pattern, 0).sum(axis=(1, 2, 3), dtype=np.float64) / (pattern.shape[1] * pattern.shape[2])


# ------------------------------------------------------------- one pass over a chunk
def feature_codes(ids: Float[Array, "batch pos"]) -> Int[Array, "batch pos"]:
    """Per prompt, small integer codes of the feature fingerprints: equal ids <-> equal codes."""
    order = np.argsort(ids, axis=1, kind="stable")
    srt = np.take_along_axis(ids, order, 1)
    new = np.ones(srt.shape, dtype=bool)
    new[:, 1:] = srt[:, 1:] != srt[:, :-1]
    codes = np.empty(ids.shape, dtype=np.int64)
    np.put_along_axis(codes, order, np.cumsum(new, axis=1) - 1, 1)
    return codes


@dataclass
class ChunkColumns:
    """Per-source indicator columns shared by every layer of a chunk: [state one-hot | 1 | code one-hot]."""

    cols: np.ndarray
    """[batch, k, S + 1 + C] indicator columns of the sources."""
    n_states: int
    """S."""
    states: np.ndarray
    """[batch, pos] state labels (-1: none)."""
    codes: np.ndarray | None
    """[batch, pos] feature codes, or None without features (or when they equal the states)."""
    codes_are_states: bool = False
    """Equal features <-> equal states in every prompt: the state columns serve for both."""
    _targets: dict = field(default_factory=dict)

    @classmethod
    def build(cls, states, n_states: int, codes=None, dtype=np.float32) -> "ChunkColumns":
        B, pos = states.shape
        if codes is not None and n_states and np.all(states >= 0) and np.array_equal(
                states[:, :, None] == states[:, None, :], codes[:, :, None] == codes[:, None, :]):
            return cls(cls.build(states, n_states, None, dtype).cols, n_states, states, None, True)
        C = 0 if codes is None else int(codes.max()) + 1  # distinct feature vectors in the chunk's prompts
        cols = np.zeros((B, pos, n_states + 1 + C), dtype=dtype)
        cols[..., :n_states] = onehot(states, n_states) if n_states else 0.0
        cols[..., n_states] = 1.0
        if codes is not None:
            b, p = np.indices(codes.shape)
            cols[b, p, n_states + 1 + codes] = 1.0
        return cls(cols, n_states, states, codes)

    def targets(self, q_pos: np.ndarray) -> np.ndarray:
        """[batch, q, S + 1 + C] indicator columns of the targets at positions q_pos (cached)."""
        key = q_pos.tobytes()
        if key not in self._targets:
            self._targets[key] = self.cols[:, q_pos]
        return self._targets[key]


def chunk_kernel(pattern: Float[Array, "batch heads q k"], q_pos: Int[Array, " q"], cc: ChunkColumns) -> dict:
    """Everything the kernel analyzers need, from two matmuls.

    Equal to `state_kernel`, `same_feature_mass` and the row sums (tested), but reads the
    pattern once: agg = pattern @ columns is each target's weight per source state, its
    total weight and its weight per feature code; G = targets^T @ agg sums that over the
    targets of each state / code, so M_hat, which states are sources (the row of the
    constant target column) and the same-feature mass (trace of the code block) are all
    small slices of G.
    """
    S = cc.n_states
    agg = pattern @ cc.cols[:, None].astype(pattern.dtype, copy=False)  # [b, h, q, S + 1 + C]
    tgt = cc.targets(q_pos).astype(pattern.dtype, copy=False)  # [b, q, S + 1 + C]
    G = (np.swapaxes(tgt, 1, 2)[:, None] @ agg).astype(np.float64)  # [b, h, S + 1 + C, S + 1 + C]
    out = {"row_sums": agg[..., S]}
    if S:
        counts = tgt[..., :S].sum(axis=1, dtype=np.float64)
        as_source = G[:, :, S, :S] > 0  # some target puts weight on a source of state s
        rows = np.where((counts[:, None, :] > 0) & as_source, counts[:, None, :], np.nan)
        out["M"] = G[:, :, :S, :S] / rows[..., None]
    if cc.codes is not None or cc.codes_are_states:  # weight of each target on sources with its own features
        block = slice(0, S) if cc.codes_are_states else slice(S + 1, None)
        same = np.trace(G[:, :, block, block], axis1=-2, axis2=-1).sum(axis=1)
        out["same_mass"] = same / (pattern.shape[1] * pattern.shape[2])
    return out
