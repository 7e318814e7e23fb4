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

Two registered analyzers (`base.Analyzer`): 'kernels' (M_hat of every recorded softmax pattern,
`KernelStream` per layer) and 'population_kernel' (M_pi from a softmax score matrix and the tasks'
features, `PopulationKernel`: a checkpoint's from tasks its sampler draws, a recording's from its tasks).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from jaxtyping import Float, Int

from ..core.errors import UserError
from ..tasks.layouts import PromptLayout
from . import inputs
from .base import Analyzer, Chunk, Column, Layers, Once, prepare_into, prepared
from .keys import KERNEL_DIAGONALITY, LABEL_FREE_DIAGONAL, LAYER, POPULATION_KERNEL, WEIGHTS, any_layer, get, layers, num
from .registry import register
from .streams import TASK_KEY, PerTask, dtype_attr, layer_param, mean_or_none

Array = np.ndarray
POPULATION_TASKS = 256
"""Tasks drawn from a checkpoint's task distribution (seed 0) for its population kernel."""


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

    def update(self, M: Float[Array, "batch s s"]) -> tuple[Float[Array, " batch"], Float[Array, " batch"]]:
        """Add the tasks of M; returns their (mean, min) diagonals (`task_diagonals`), for per-task values."""
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
        return mean, mins

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


def self_pairs(q_pos: Int[Array, " q"], k_pos: Int[Array, " k"]) -> tuple[Int[Array, " j"], Int[Array, " j"]] | None:
    """(target index, source index) of every position that is both a target and a source; None if none."""
    kidx = {int(p): i for i, p in enumerate(k_pos)}
    pairs = [(i, kidx[int(p)]) for i, p in enumerate(q_pos) if int(p) in kidx]
    return tuple(np.array(pairs).T) if pairs else None


def self_mass(
    pattern: Float[Array, "batch heads q k"], q_pos: Int[Array, " q"], k_pos: Int[Array, " k"]
) -> Float[Array, " batch"]:
    """Label-free: mean over targets j that are also sources of the weight K[j <- j] on itself."""
    return pair_mass(pattern, self_pairs(q_pos, k_pos))


def pair_mass(pattern: Float[Array, "batch heads q k"], pairs) -> Float[Array, " batch"]:
    """Per prompt, the mean over heads and `self_pairs` (target, source) of the pattern's weight (NaN: no pairs),
    accumulated in float64 whatever the pattern's dtype: float32 means, summed over a chunk in float32, moved the
    analysis' label-free self mass by 5e-8 of its value between two chunk sizes."""
    if pairs is None:
        return np.full(pattern.shape[0], np.nan)
    qi, ki = pairs
    return pattern[:, :, qi, ki].mean(axis=(1, 2), dtype=np.float64)


@functools.lru_cache(maxsize=8)
def _projection(width: int) -> np.ndarray:
    """The fixed random direction of `feature_ids` (drawn once per width, not once per chunk), read-only."""
    r = np.random.default_rng(0x5EED).standard_normal(width)
    r.flags.writeable = False
    return r


def feature_ids(features: Float[Array, "batch pos f"], rel_tol: float = 1e-9) -> Float[Array, "batch pos"]:
    """A scalar fingerprint per column: equal feature vectors give equal ids (random projection).

    Two distinct vectors collide only on a measure-zero set, so comparing ids is
    comparing feature vectors, in O(pos) per prompt instead of O(pos^2 f).
    """
    r = _projection(features.shape[-1])
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


def same_partition(a: Int[Array, "batch pos"], b: Int[Array, "batch pos"]) -> bool:
    """Whether in every row a[i] == a[j] <-> b[i] == b[j] (non-negative integer labels): each label of a row's
    `a` goes with one label of `b` and back, which two scatters and two gathers tell in O(pos) per row
    (the pairwise comparison is O(pos^2))."""
    rows = np.arange(a.shape[0])[:, None]
    a_to_b = np.zeros((a.shape[0], int(a.max(initial=0)) + 1), dtype=b.dtype)
    b_to_a = np.zeros((a.shape[0], int(b.max(initial=0)) + 1), dtype=a.dtype)
    a_to_b[rows, a] = b  # the last b written for each label of a: equal to every b of that label iff a -> b is a map
    b_to_a[rows, b] = a
    return bool(np.array_equal(a_to_b[rows, a], b) and np.array_equal(b_to_a[rows, b], a))


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
    _cache: dict = field(default_factory=dict)
    """The targets' columns and state counts by positions (`targets`, `target_counts`)."""

    @classmethod
    def build(cls, states, n_states: int, codes=None, dtype=np.float32) -> "ChunkColumns":
        B, pos = states.shape
        same = bool(codes is not None and n_states and np.all(states >= 0) and same_partition(states, codes))
        if same:  # the state columns serve for the codes too
            codes = None
        C = 0 if codes is None else int(codes.max()) + 1  # distinct feature vectors in the chunk's prompts
        cols = np.zeros((B, pos, n_states + 1 + C), dtype=dtype)
        if n_states:  # state one-hot, written in place (a negative state, no label, gives a zero row)
            b, p = np.nonzero(states >= 0)
            cols[b, p, states[b, p]] = 1.0
        cols[..., n_states] = 1.0
        if codes is not None:
            b, p = np.indices(codes.shape)
            cols[b, p, n_states + 1 + codes] = 1.0
        return cls(cols, n_states, states, codes, same)

    def targets(self, q_pos: np.ndarray) -> np.ndarray:
        """[batch, q, S + 1 + C] indicator columns of the targets at positions q_pos (cached)."""
        key = q_pos.tobytes()
        if key not in self._cache:
            self._cache[key] = self.cols[:, q_pos]
        return self._cache[key]

    def target_counts(self, q_pos: np.ndarray) -> np.ndarray:
        """[batch, S] float64: how many of the targets at positions q_pos hold each state (cached: every layer of
        the chunk asks)."""
        key = ("counts", q_pos.tobytes())
        if key not in self._cache:
            self._cache[key] = self.targets(q_pos)[..., : self.n_states].sum(axis=1, dtype=np.float64)
        return self._cache[key]


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
        counts = cc.target_counts(q_pos)
        as_source = G[:, :, S, :S] > 0  # some target puts weight on a source of state s
        rows = np.where((counts[:, None, :] > 0) & as_source, counts[:, None, :], np.nan)
        out["M"] = G[:, :, :S, :S] / rows[..., None]
    if cc.codes is not None or cc.codes_are_states:  # weight of each target on sources with its own features
        block = slice(0, S) if cc.codes_are_states else slice(S + 1, None)
        same = np.trace(G[:, :, block, block], axis1=-2, axis2=-1).sum(axis=1)
        out["same_mass"] = same / (pattern.shape[1] * pattern.shape[2])
    return out


# ------------------------------------------------------------------ the streams
class PopulationKernel:
    """M_pi per layer from the learned score block S_l[block, block] and tasks (features, mu_pi); `source`
    says which tasks (the JSON's `tasks`)."""

    paths = ("tasks/phi", "tasks/stationary")

    def __init__(self, params: dict, layout: PromptLayout, n_layers: int, gamma: float, n_states: int,
                 score: str = "A", block: str = "x", source: str = "recorded tasks"):
        self.source = source
        x = layout.slice(block)
        self.kernels: dict[bytes, tuple[np.ndarray, DiagonalityAccumulator]] = {}
        """A11 (its bytes) -> (A11, its accumulator): layers with equal score blocks (tied, or theta*'s) have the
        same M_pi, so it is computed and accumulated once for all of them."""
        self.layer_keys: list[bytes | None] = []
        """Layer l's key in `kernels` (None: no score parameter)."""
        for l in range(n_layers):
            A = layer_param(params, l, score)
            A11 = None if A is None else np.asarray(A, dtype=np.float64)[x, x]
            key = None if A11 is None else A11.tobytes()
            if key is not None and key not in self.kernels:
                self.kernels[key] = (A11, DiagonalityAccumulator(gamma, n_states))
            self.layer_keys.append(key)

    def update(self, chunk: Chunk) -> None:
        self.add(chunk.data["tasks/phi"], chunk.data["tasks/stationary"])

    def add(self, phi: np.ndarray, mu: np.ndarray) -> None:
        """Tasks' features [B, S, f] and stationary distributions [B, S]."""
        for A11, acc in self.kernels.values():
            acc.update(population_kernel(A11, phi, mu))

    def result(self, source: str) -> list[dict]:
        out = []
        for l, key in enumerate(self.layer_keys):
            res = None if key is None else self.kernels[key][1].result(with_matrix=False)
            if res is not None:
                out.append({"layer": l, "tasks": source, **res})
        return out

    def finalize(self) -> dict:
        return {POPULATION_KERNEL: self.result(self.source)}


class KernelStream:
    """Empirical state-aggregated kernel of layer l, and the label-free diagonal masses."""

    def __init__(self, layer, ds, pos, gamma, n_states, layout, max_matrix_states, use_labels, bf16,
                 per_task_max: int = 0, no_labels: str | None = None):
        self.path = f"acts/blocks.{layer}.attn.hook_pattern"
        shape = ds.shape
        if len(shape) != 4 or shape[3] != pos:
            raise UserError(f"hook {self.path[5:]} has shape {shape}, expected [N, heads, q, {pos}]")
        self.q = inputs.positions(ds.attrs, shape, 2, pos, self.path[5:])
        self.k = np.arange(pos)
        self.pairs = self_pairs(self.q, self.k)  # the positions that are both targets and sources, once
        self.heads = shape[1]
        self.acc = [DiagonalityAccumulator(gamma, n_states) for _ in range(self.heads)] if use_labels else None
        self.per_task = [PerTask(("mean", "min"), per_task_max) for _ in range(self.heads)] if use_labels else None
        self.no_labels = no_labels or "no state labels (prompts/state is -1)"
        self.n_states, self.max_matrix_states = n_states, max_matrix_states
        self.feature_block = None
        if layout is not None:
            for name in ("x", "phi"):
                if name in layout.names:
                    self.feature_block = layout.slice(name)
                    break
        self.tol = 2e-2 if bf16 else 1e-4
        self.stochastic = True
        self.self_sum = self.same_sum = 0.0
        self.count = 0

    @property
    def paths(self) -> tuple[str, ...]:
        return self.path, "prompts/state", "prompts/z"

    def columns(self, data: dict, shared: dict) -> ChunkColumns:
        """Source indicator columns of this chunk, built once and shared by all layers."""
        if "kernel_columns" not in shared:
            states = data["prompts/state"] if self.acc is not None else np.full(data["prompts/z"].shape[:2], -1)
            codes = None
            if self.feature_block is not None:
                codes = feature_codes(feature_ids(data["prompts/z"][..., self.feature_block]))
            shared["kernel_columns"] = ChunkColumns.build(states, self.n_states if self.acc is not None else 0, codes)
        return shared["kernel_columns"]

    def _kernel(self, data: dict, shared: dict) -> dict:
        return chunk_kernel(data[self.path], self.q, self.columns(data, shared))  # the pattern in its recorded dtype

    def prepare(self, data: dict, shared: dict, hurry=None) -> None:
        """The chunk's kernel statistics (`chunk_kernel`, most of this stream's time), computed where the chunk is
        read: in the reader thread, beside the analysis of the chunk before (`Stream.prepare`)."""
        prepare_into(shared, self.path, self._kernel, data, shared)

    def update(self, chunk: Chunk) -> None:
        if not self.stochastic:
            return
        data = chunk.data
        pat = data[self.path]  # results are accumulated in float64
        res = prepared(chunk.shared, self.path, self._kernel, data, chunk.shared)
        if np.max(np.abs(res["row_sums"] - 1.0), initial=0.0) > self.tol:
            self.stochastic = False
            return
        if self.acc is not None:
            for h, acc in enumerate(self.acc):
                mean, mins = acc.update(res["M"][:, h])
                if TASK_KEY in data and not self.per_task[h].over:
                    self.per_task[h].update(data[TASK_KEY], mean=mean, min=mins)
        self.self_sum += float(pair_mass(pat, self.pairs).sum())
        if "same_mass" in res:
            self.same_sum += float(res["same_mass"].sum())
        self.count += pat.shape[0]

    def result(self) -> tuple[dict | None, dict | None, str | None]:
        if not self.stochastic:
            return None, None, ("not applicable: hook_pattern rows do not sum to 1 (an unnormalised kernel); "
                                "diagonality needs softmax patterns")
        free = {"self": mean_or_none(self.self_sum, self.count),
                "same_features": mean_or_none(self.same_sum, self.count) if self.feature_block is not None else None}
        if self.acc is None:
            return None, free, f"{self.no_labels}: only the label-free diagonal mass"
        with_matrix = self.n_states <= self.max_matrix_states
        per_head = [acc.result(with_matrix) for acc in self.acc]
        if any(r is None for r in per_head):
            return None, free, "no labelled target states"
        best = max(range(self.heads), key=lambda h: per_head[h]["min"])
        res = dict(per_head[best])
        res["head"], res["n_heads"] = best, self.heads  # the most diagonal head is the one reported
        res["per_task"] = self.per_task[best].result()
        if self.heads > 1:
            res["per_head"] = [{k: v for k, v in r.items() if k != "M_hat"} for r in per_head]
        return res, free, None


# ------------------------------------------------------------------ the analyzers
def _sampled_population(ctx, block: str) -> dict:
    """M_pi of a checkpoint on POPULATION_TASKS tasks drawn (seed 0) by the task family's sampler."""
    config = ctx.config
    try:
        pb = ctx.subject.task.sample(config, config.task, POPULATION_TASKS, np.random.default_rng(0))
    except (UserError, KeyError, TypeError, ValueError) as e:
        ctx.reasons[POPULATION_KERNEL] = f"cannot draw tasks from the checkpoint's task config: {e}"
        return {POPULATION_KERNEL: None}
    if "phi" not in pb.tasks or "stationary" not in pb.tasks:
        ctx.reasons[POPULATION_KERNEL] = "not applicable: the task family's tasks have no state features (tasks/phi)"
        return {POPULATION_KERNEL: None}
    phi, mu = pb.tasks["phi"], pb.tasks["stationary"]
    pk = PopulationKernel(ctx.params, ctx.layout, config.model.n_layers, config.model.gamma, phi.shape[1],
                          score=ctx.subject.arch.score, block=block,
                          source=f"sampled: {POPULATION_TASKS} tasks of the checkpoint's task distribution, seed 0")
    pk.add(phi, mu)
    return pk.finalize()


def open_population(ctx):
    """The population kernel where the model's family names a softmax feature block
    (`Hints.population_kernel`): a checkpoint's from sampled tasks, a recording's from its own."""
    model = ctx.subject.model
    block = model.hints.population_kernel if model is not None and ctx.layout is not None else None
    if block is None:
        return None
    if ctx.rec is None:
        return None if ctx.config is None else Once(_sampled_population, ctx, block)
    facts, arch = ctx.facts, ctx.subject.arch
    if facts is None or arch is None or not facts.has_tasks or "tasks/phi" not in ctx.f or not ctx.params:
        return None
    return PopulationKernel(ctx.params, ctx.layout, ctx.n_layers, ctx.gamma, facts.n_states, score=arch.score,
                            block=block)


def open_kernels(ctx):
    """M_hat of every layer whose softmax pattern is recorded (a foreign model's too: `KernelStream`
    checks that the rows sum to 1)."""
    facts, arch, gamma = ctx.facts, ctx.subject.arch, ctx.gamma
    use_labels = facts.labelled and facts.n_states > 0 and math.isfinite(gamma)
    no_labels = ("no state labels (prompts/state is -1)" if not (facts.labelled and facts.n_states > 0) else
                 "no discount γ recorded (the contraction threshold (1+γ)/2 needs it)")
    streams = {}
    for l in range(ctx.n_layers):
        hook = f"blocks.{l}.attn.hook_pattern"
        if hook not in facts.hooks:
            continue
        if arch is not None and not arch.softmax:
            ctx.reasons.setdefault(KERNEL_DIAGONALITY, f"not applicable: the {ctx.subject.family} attention pattern "
                                                       f"is not a softmax kernel")
            continue
        ds = ctx.f[f"acts/{hook}"]
        k = ctx.guard(KERNEL_DIAGONALITY, KernelStream, l, ds, facts.pos, gamma if math.isfinite(gamma) else 0.0,
                      facts.n_states, ctx.layout, ctx.opts.kernel_matrix_max_states, use_labels,
                      dtype_attr(ds) == "bfloat16", ctx.opts.per_task_max, no_labels)
        if k is not None:
            streams[l] = k

    def fields(layer: int, res) -> dict:
        kd, free, why = res
        if why:
            ctx.reasons.setdefault(KERNEL_DIAGONALITY, why)
        return {KERNEL_DIAGONALITY: kd, LABEL_FREE_DIAGONAL: free}

    return Layers(streams, ctx.reasons, KERNEL_DIAGONALITY, fields) if streams else None


# ------------------------------------------------------------------ reading them back
def threshold_of(kd) -> float | None:
    """The contraction threshold (1+γ)/2 of a kernel entry (from min - margin where it is not stored)."""
    if not isinstance(kd, dict):
        return None
    threshold = num(kd.get("threshold"))
    if threshold is None and num(kd.get("min")) is not None and num(kd.get("margin")) is not None:
        threshold = num(kd["min"]) - num(kd["margin"])
    return threshold


def kernel_mins(analysis) -> dict[int, tuple[float, float | None]]:
    """layer -> (min_s diagonal, threshold): the empirical M_hat of a recording, else the population
    kernel M_pi of a checkpoint's score matrix."""
    out = {}
    rows = [(x[LAYER], x.get(KERNEL_DIAGONALITY)) for x in layers(analysis)]
    pop = get(analysis, WEIGHTS, POPULATION_KERNEL)
    if not any(isinstance(kd, dict) for _, kd in rows) and isinstance(pop, list):
        rows = [(p.get(LAYER), p) for p in pop if isinstance(p, dict)]
    for layer, kd in rows:
        mn = num(get(kd, "min"))
        if isinstance(layer, int) and mn is not None:
            out[layer] = (mn, threshold_of(kd))
    return out


def worst_kernel(analysis) -> tuple[float | None, float | None]:
    """(min kernel diagonal, its margin over (1+γ)/2) of the worst layer; None where absent."""
    mins = kernel_mins(analysis)
    if not mins:
        return None, None
    mn, threshold = min(mins.values(), key=lambda v: v[0])
    return mn, None if threshold is None else mn - threshold


register(Analyzer(
    name=POPULATION_KERNEL, place=WEIGHTS, open=open_population, roles=("parameters",),
    arrays=("tasks/phi", "tasks/stationary"),
    summary="M_π per layer from the learned softmax score block and the tasks' features",
    missing="not applicable: no population kernel for this model (Hints.population_kernel, its weights and the "
            "tasks' features)"))
register(Analyzer(
    name="kernels", reason_key=KERNEL_DIAGONALITY, open=open_kernels, roles=("pattern",),
    arrays=("prompts/state", "prompts/z"), layer_keys=(KERNEL_DIAGONALITY,),
    summary="the state-aggregated attention kernel M̂ of every softmax pattern, and its diagonal",
    computed=lambda a: any_layer(a, KERNEL_DIAGONALITY, LABEL_FREE_DIAGONAL),
    missing="not applicable: no attention pattern recorded",
    columns=(Column("kernel_min", "min kernel diag", lambda a: worst_kernel(a)[0], "{:.3f}", "diag",
                    "diag / margin: min kernel diagonal and its margin over (1+γ)/2 (worst layer)"),
             Column("kernel_margin", "margin vs (1+γ)/2", lambda a: worst_kernel(a)[1], "{:+.3f}", "margin"))))
