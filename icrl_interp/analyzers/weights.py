"""Weight analyzers: block sparsity, scaling-manifold alignment, sign pattern, TL-head conversion.

Everything acts on parameter matrices in the prompt basis (docs/concepts.md): a
score matrix S with score(source i, target j) = z_i^T S z_j and a value map V
acting on column vectors. A matrix is cut into (row block, column block) pieces by
a `PromptLayout`. The *support* of a parameter is the set of blocks where the
family's theta* is non-zero; it is derived from theta*, never hard-coded. Which matrices
are fitted to theta* and how comes from the family's registry hints (`Hints.weight_fit`,
`lazy_from`, `wang_summary`), never from its name.

The registered analyzer 'weights' (`base.Analyzer`) compares the weights of every input (a checkpoint,
a recording's parameters, TransformerLens weights read as a family's) with theta* (`analyze_weights`).
"""
from __future__ import annotations

import math
import re

import numpy as np
from jaxtyping import Bool, Float

from ..core.errors import UserError
from ..families import registry
from ..families.registry import BlockFit, Hints, ValueRowFit
from ..tasks.layouts import PromptLayout
from .base import ANALYSIS, Analyzer, Column, Once
from .keys import GENERIC, WEIGHTS, get, num
from .registry import register

Array = np.ndarray

SIGN_REL_TOL = 1e-3
"""An entry counts as 0 in a sign pattern when |x| <= SIGN_REL_TOL * max |row|."""

_PARAM = re.compile(r"^blocks\.(\d+)\.attn\.(\w+)$")


# ------------------------------------------------------------------ helpers
def cosine(a, b) -> float:
    """Cosine of two arrays flattened; NaN when either is zero."""
    a, b = np.ravel(np.asarray(a, dtype=np.float64)), np.ravel(np.asarray(b, dtype=np.float64))
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return math.nan
    return float(a @ b) / (na * nb)


def rel_err(learned, target) -> float:
    """||learned - target||_F / ||target||_F (NaN for a zero target)."""
    target = np.asarray(target, dtype=np.float64)
    nt = float(np.linalg.norm(target))
    return math.nan if nt == 0.0 else float(np.linalg.norm(np.asarray(learned, dtype=np.float64) - target)) / nt


def check_fits(name: str, matrix: np.ndarray, layout: PromptLayout) -> np.ndarray:
    """A parameter must be a finite d_model x d_model matrix of the layout."""
    matrix = np.asarray(matrix, dtype=np.float64)
    D = layout.d_model
    if matrix.shape != (D, D):
        raise UserError(f"parameter {name} has shape {tuple(matrix.shape)}, but the {layout.family} layout "
                        f"has d_model = {D} (expected ({D}, {D})); the layout does not fit the matrices")
    if not np.all(np.isfinite(matrix)):
        raise UserError(f"parameter {name} contains NaN or Inf")
    return matrix


def shape_mismatch(params: dict, layout: PromptLayout) -> str | None:
    """Why the parameters are not matrices of the layout's prompt basis (the first, by name, that is not
    d_model x d_model; e.g. a model that embeds its input has its own width), or None when all are."""
    D = layout.d_model
    bad = sorted((k, tuple(np.shape(v))) for k, v in params.items() if tuple(np.shape(v)) != (D, D))
    if not bad:
        return None
    return f"parameter {bad[0][0]} has shape {bad[0][1]} but the {layout.family} layout has d_model = {D}"


def split_param_name(name: str) -> tuple[int, str]:
    """'blocks.3.attn.P' -> (3, 'P'); UserError for other names."""
    m = _PARAM.match(name)
    if not m:
        raise UserError(f"parameter name {name!r} is not of the form blocks.<layer>.attn.<name>")
    return int(m.group(1)), m.group(2)


# ------------------------------------------------------------ block sparsity
def block_norm_matrix(matrix: Float[Array, "D D2"], layout: PromptLayout) -> Float[Array, "nb nb2"]:
    """Frobenius norm of every (row block, column block) piece, in layout order."""
    names = layout.names
    out = np.zeros((len(names), len(names)))
    for a, r in enumerate(names):
        for b, c in enumerate(names):
            out[a, b] = np.linalg.norm(matrix[layout.slice(r), layout.slice(c)])
    return out


def block_norms(matrix: Float[Array, "D D2"], layout: PromptLayout) -> dict:
    """{row block: {column block: Frobenius norm}}."""
    norms = block_norm_matrix(matrix, layout)
    return {r: {c: float(norms[a, b]) for b, c in enumerate(layout.names)} for a, r in enumerate(layout.names)}


def support(theta: Float[Array, "D D2"], layout: PromptLayout) -> Bool[Array, "nb nb2"]:
    """Blocks where theta* has a non-zero entry: the support the construction allows."""
    return block_norm_matrix(theta, layout) > 0


def support_energy(pairs: list[tuple[np.ndarray, np.ndarray]], layout: PromptLayout) -> float:
    """Fraction of the total squared norm of the learned matrices inside theta*'s support.

    `pairs` = [(learned, theta*), ...]; 1.0 for theta* itself, NaN when all are zero.
    """
    inside = total = 0.0
    for learned, theta in pairs:
        sq = block_norm_matrix(learned, layout) ** 2
        inside += float(sq[support(theta, layout)].sum())
        total += float(sq.sum())
    return math.nan if total == 0.0 else inside / total


def block_range(spec: str, layout: PromptLayout) -> slice:
    """A row / column range of a `BlockFit`: ':' (all), ':block' (before the block), 'block:' (from
    the block on) or 'block' (the block itself)."""
    if spec == ":":
        return slice(0, layout.d_model)
    if spec.startswith(":"):
        return slice(0, layout.slice(spec[1:]).start)
    if spec.endswith(":"):
        return slice(layout.slice(spec[:-1]).start, layout.d_model)
    return layout.slice(spec)


def lsa_blocks(layout: PromptLayout, split: str = "param_one") -> tuple[slice, slice]:
    """(rows before `split`, rows from `split` on): an LSA layout's transition and parameter blocks."""
    return block_range(":" + split, layout), block_range(split + ":", layout)


def lazy_norms(mats: dict[str, np.ndarray], layout: PromptLayout, lazy_from: str) -> dict:
    """{'<name>22': norm of matrix[lazy, lazy]} with lazy = the rows / columns from `lazy_from` on (0 under theta*)."""
    _, lazy = lsa_blocks(layout, lazy_from)
    return {f"{name}22": float(np.linalg.norm(m[lazy, lazy])) for name, m in mats.items()}


def lazy_blocks(P: Float[Array, "D D2"], V: Float[Array, "D D2"], layout: PromptLayout) -> dict:
    """Norms of the lazy blocks P22 = P[param, param] and V22 = V[param, param] (0 under theta*)."""
    return lazy_norms({"P": P, "V": V}, layout, "param_one")


# ---------------------------------------------------------- scaling manifold
def _manifold_loss(c: float, X, Xs, Y, Ys) -> float:
    return float(np.sum((X - c * Xs) ** 2) + np.sum((Y - Ys / c) ** 2))


def best_scale(X, X_star, Y, Y_star) -> float:
    """argmin over c != 0 of ||X - c X*||^2 + ||Y - Y*/c||^2 (c may be negative).

    Stationarity: a c^4 - p c^3 + q c - b = 0 with a = ||X*||^2, p = <X, X*>,
    q = <Y, Y*>, b = ||Y*||^2. The loss tends to +inf at c -> 0 and |c| -> inf, so
    the minimum is the best real root; a Newton step polishes it.
    """
    X, Xs, Y, Ys = (np.asarray(m, dtype=np.float64) for m in (X, X_star, Y, Y_star))
    a, b = float(np.sum(Xs * Xs)), float(np.sum(Ys * Ys))
    if a == 0.0 or b == 0.0:
        raise UserError("theta* has an all-zero block, so the scaling-manifold constant c is undefined")
    p, q = float(np.sum(X * Xs)), float(np.sum(Y * Ys))
    coeffs = [a, -p, 0.0, q, -b]
    roots = np.roots(coeffs)
    scale = max(abs(r) for r in roots)
    real = [float(r.real) for r in roots if abs(r.imag) <= 1e-7 * max(scale, 1.0) and r.real != 0.0]
    if not real:  # pragma: no cover - a quartic with a > 0 and -b < 0 always has a positive and a negative root
        raise UserError("no real stationary point of the scaling-manifold loss")
    polished = []
    for c in real:
        for _ in range(3):
            f = ((a * c - p) * c * c + q) * c - b
            df = (4 * a * c - 3 * p) * c * c + q
            if df == 0.0:
                break
            c = c - f / df
        polished.append(c)
    return min(polished, key=lambda c: _manifold_loss(c, X, Xs, Y, Ys))


def manifold_fit(X, X_star, Y, Y_star, names: tuple[str, str]) -> dict:
    """Best c for (X, Y) against (c X*, Y*/c), relative errors at that c, and the gauge-invariant cosine.

    The cosine compares the bilinear maps Y (x) X and Y* (x) X*:
    <Y (x) X, Y* (x) X*> = <Y, Y*><X, X*>, so it is cos(X, X*) cos(Y, Y*), the same for every c.
    """
    c = best_scale(X, X_star, Y, Y_star)
    X_star, Y_star = np.asarray(X_star, dtype=np.float64), np.asarray(Y_star, dtype=np.float64)
    return {
        "scale": c,
        "rel_err": {names[0]: rel_err(X, c * X_star), names[1]: rel_err(Y, Y_star / c)},
        "gauge_cosine": cosine(X, X_star) * cosine(Y, Y_star),
    }


def ls_scale(learned, target) -> float:
    """Least-squares s minimising ||learned - s target||."""
    target = np.asarray(target, dtype=np.float64)
    tt = float(np.sum(target * target))
    if tt == 0.0:
        raise UserError("theta* matrix is all zero; no scale can be fitted")
    return float(np.sum(np.asarray(learned, dtype=np.float64) * target)) / tt


def sign_pattern(values, rel_tol: float = SIGN_REL_TOL) -> str:
    """'+,+,-' style pattern; an entry within rel_tol * max|values| of 0 is '0'."""
    v = np.ravel(np.asarray(values, dtype=np.float64))
    if not np.all(np.isfinite(v)):
        raise UserError("sign pattern of a vector with NaN or Inf")
    thresh = rel_tol * float(np.max(np.abs(v))) if v.size else 0.0
    return ",".join("0" if abs(x) <= thresh else ("+" if x > 0 else "-") for x in v)


def pq_summary(P: Float[Array, "D D2"], Q: Float[Array, "D D2"], layout: PromptLayout) -> dict:
    """Wang et al.'s summaries after aligning signs by s = sign(P[-1,-1]).

    P_last = s P[-1,-1]; P_others = mean |P| over the other entries; Q_tl_trace and
    Q_tr_trace = s tr(Q[phi, phi]) and s tr(Q[phi, gamma_phi_next]) (theta*: -d and +d times C).
    """
    s = 1.0 if P[-1, -1] >= 0 else -1.0
    others = np.abs(P).sum() - abs(P[-1, -1])
    phi, nxt = layout.slice("phi"), layout.slice("gamma_phi_next")
    return {
        "sign": s,
        "P_last": s * float(P[-1, -1]),
        "P_others_mean_abs": float(others) / (P.size - 1),
        "Q_tl_trace": s * float(np.trace(Q[phi, phi])),
        "Q_tr_trace": s * float(np.trace(Q[phi, nxt])),
    }


# ------------------------------------------------------ TransformerLens heads
def tl_head_matrices(
    W_Q: Float[Array, "d_model d_head"],
    W_K: Float[Array, "d_model d_head"],
    W_V: Float[Array, "d_model d_head_v"],
    W_O: Float[Array, "d_head_v d_model"],
) -> tuple[Float[Array, "d_model d_model"], Float[Array, "d_model d_model"]]:
    """Effective score matrix and value map of one TransformerLens head, in the papers' orientation.

    TL scores a target x_q against a source x_k as x_q W_Q W_K^T x_k^T, i.e. A_TL = W_Q W_K^T
    is target-first. The papers (and our checkpoints) are source-first, score = z_src^T A z_tgt,
    so A = (W_Q W_K^T)^T = W_K W_Q^T. The value map of a source on column vectors is
    V = (W_V W_O)^T. Biases are ignored (they are not part of the bilinear form).
    """
    W_Q, W_K, W_V, W_O = (np.asarray(w, dtype=np.float64) for w in (W_Q, W_K, W_V, W_O))
    return (W_Q @ W_K.T).T, (W_V @ W_O).T


def tl_to_family(tensors: dict[str, np.ndarray], family: str, head: int = 0) -> dict[str, np.ndarray]:
    """Map TL weights blocks.{l}.attn.W_Q/W_K/W_V/W_O ([n_heads, ...] or per head) to a family's names:
    the score matrix and the value map of the family's architecture (`registry.Architecture.score`,
    `.value`; e.g. linear attention: Q = score, P = value; softmax: A, V; LSA: P, V)."""
    if registry.find(family) is None:
        raise UserError(f"cannot map TransformerLens weights to family {family!r} (known: {', '.join(registry.names())})")
    arch = registry.architecture(registry.get(family).architecture)
    score_name, value_name = arch.score, arch.value
    layers = sorted({split_param_name(n)[0] for n in tensors if n.startswith("blocks.") and ".attn.W_" in n})
    if not layers:
        raise UserError("no TransformerLens attention weights (blocks.<l>.attn.W_Q, W_K, W_V, W_O) found")
    out = {}
    for l in layers:
        ws = []
        for w in ("W_Q", "W_K", "W_V", "W_O"):
            key = f"blocks.{l}.attn.{w}"
            if key not in tensors:
                raise UserError(f"TransformerLens weights lack {key}")
            t = np.asarray(tensors[key], dtype=np.float64)
            if t.ndim == 3:
                if not 0 <= head < t.shape[0]:
                    raise UserError(f"{key} has {t.shape[0]} heads; head {head} does not exist")
                t = t[head]
            ws.append(t)
        try:
            A, V = tl_head_matrices(*ws)
        except Exception as e:  # beartype/jaxtyping shape mismatch
            raise UserError(f"TransformerLens weights of layer {l} have inconsistent shapes: "
                            f"{[tuple(w.shape) for w in ws]}") from e
        out[f"blocks.{l}.attn.{score_name}"] = A
        out[f"blocks.{l}.attn.{value_name}"] = V
    return out


# ----------------------------------------------------------- family analysis
def layers_of(params: dict) -> list[int]:
    """Sorted layer indices that have parameters."""
    return sorted({split_param_name(n)[0] for n in params})


def _check_theta(params: dict, theta: dict, layout: PromptLayout) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Learned and theta* matrices by name, with shapes checked; names without theta* are dropped."""
    pairs = {}
    for name, value in params.items():
        learned = check_fits(name, value, layout)
        if name not in theta:
            continue
        star = np.asarray(theta[name], dtype=np.float64)
        if star.shape != learned.shape:
            raise UserError(f"theta* {name} has shape {tuple(star.shape)} but the parameter has "
                            f"{tuple(learned.shape)}: mismatched theta*")
        pairs[name] = (learned, star)
    missing = sorted(set(theta) - set(params))
    if missing:
        raise UserError(f"theta* has {', '.join(missing)} which the parameters lack: mismatched theta*")
    if not pairs:
        raise UserError("no parameter has a theta* counterpart: mismatched theta*")
    return pairs


def hints_of(family) -> Hints:
    """The analysis hints of a family given by name, `registry.Family` or `registry.Hints`."""
    if isinstance(family, Hints):
        return family
    if isinstance(family, registry.Family):
        return family.hints
    return registry.get(family).hints


def fit_parameters(hints: Hints) -> tuple[str, ...]:
    """The parameters `Hints.weight_fit` compares with theta* (BlockFit: X, Y; ValueRowFit: score, value)."""
    spec = hints.weight_fit
    if isinstance(spec, BlockFit):
        return spec.x[0], spec.y[0]
    if isinstance(spec, ValueRowFit):
        return spec.score, spec.value
    return ()


def _block_fit(spec: BlockFit, hints: Hints, get, layout: PromptLayout) -> dict | None:
    X, Y = get(spec.x[0]), get(spec.y[0])
    if X is None or Y is None:
        return None
    rx, cx = block_range(spec.x[1], layout), block_range(spec.x[2], layout)
    ry, cy = block_range(spec.y[1], layout), block_range(spec.y[2], layout)
    unread = {i for b in spec.y_unread for i in range(*layout.slice(b).indices(layout.d_model))}
    rows = np.array([i for i in range(ry.start, ry.stop) if i not in unread], dtype=np.int64)
    fit = manifold_fit(X[0][rx, cx], X[1][rx, cx], Y[0][rows, cy], Y[1][rows, cy], spec.names)
    if unread:
        fit["unidentifiable"] = {spec.names[1]: unidentifiable_rows(spec, Y, ry, cy, fit["scale"], layout)}
    if hints.wang_summary:
        fit["pq_summary"] = pq_summary(X[0], Y[0], layout)
    return fit


UNREAD_REASON = ("these rows write a part of the output that no readout reads, so no loss sees them and they keep "
                 "whatever value they start with: not identifiable, left out of rel_err")
"""Why `BlockFit.y_unread` rows are reported apart (docs/analyzers.md, "Scaling manifold")."""


def unidentifiable_rows(spec: BlockFit, Y, ry: slice, cy: slice, c: float, layout: PromptLayout) -> dict:
    """The `unidentifiable` entry of Y: its unread row blocks, their norm, and the relative error of all of
    Y's rows at the c fitted on the identifiable ones (what rel_err would be if they counted)."""
    unread = np.concatenate([np.arange(*layout.slice(b).indices(layout.d_model)) for b in spec.y_unread])
    return {"row_blocks": list(spec.y_unread), "reason": UNREAD_REASON,
            "norm": float(np.linalg.norm(Y[0][unread, cy])),
            "rel_err_all_rows": rel_err(Y[0][ry, cy], Y[1][ry, cy] / c)}


def _value_row_fit(spec: ValueRowFit, get, layout: PromptLayout) -> dict | None:
    A, V = get(spec.score), get(spec.value)
    if A is None or V is None:
        return None
    # theta*'s score is a multiple of a fixed pattern: normalise so the scale is in units of that pattern
    A_unit = A[1] / np.max(np.abs(A[1]))
    s = ls_scale(A[0], A_unit)
    row = layout.slice(spec.row).start
    cols = [layout.slice(b).start for b in spec.columns]
    values = V[0][row, cols]
    fit = {
        "scale": s,
        "rel_err": {spec.score: rel_err(A[0], s * A_unit), spec.value: rel_err(V[0], ls_scale(V[0], V[1]) * V[1])},
        "gauge_cosine": cosine(V[0], V[1]),
        "value_row": [float(x) for x in values],
        "value_row_cosine": cosine(values, V[1][row, cols]),
        "sign_pattern": sign_pattern(values),
    }
    for name in spec.extra:
        E = get(name)
        if E is not None:
            fit["rel_err"][name] = rel_err(E[0], ls_scale(E[0], E[1]) * E[1])
    return fit


def _layer_fit(hints: Hints, layer: int, pairs: dict, layout: PromptLayout) -> dict | None:
    """Manifold / scale fit of one layer's parameters (None if the layer lacks them)."""
    def get(key):
        return pairs.get(f"blocks.{layer}.attn.{key}")

    spec = hints.weight_fit
    if isinstance(spec, BlockFit):
        fit = _block_fit(spec, hints, get, layout)
    elif isinstance(spec, ValueRowFit):
        fit = _value_row_fit(spec, get, layout)
    else:
        return None
    if fit is not None and hints.lazy_from is not None:
        fit["lazy_blocks"] = lazy_norms({k: get(k)[0] for k in fit_parameters(hints)}, layout, hints.lazy_from)
    return fit


def analyze_weights(family: str | registry.Family | Hints, params: dict[str, np.ndarray],
                    theta: dict[str, np.ndarray], layout: PromptLayout) -> dict:
    """The `weights` section of the analysis contract (docs/analyzers.md).

    `family` (a registered name, `registry.Family` or its `Hints`) says how the matrices are fitted
    to theta* (`Hints.weight_fit`) and which blocks are lazy (`Hints.lazy_from`). Top-level manifold
    fields and sign_pattern describe the last parameter layer (the only one when weights are tied or
    for LSA); `manifold.per_layer` lists every layer. Without a theta* (empty `theta`) only block
    norms and the lazy drift are reported.
    """
    hints = hints_of(family)
    if not theta:  # no construction for this family: what needs no theta* still counts
        learned = {name: check_fits(name, m, layout) for name, m in sorted(params.items())}
        sparsity = {"in_support_energy": None, "lazy_drift": None,
                    "block_norms": {name: block_norms(m, layout) for name, m in learned.items()}}
        last = max(layers_of(learned), default=0)
        mats = {k: learned.get(f"blocks.{last}.attn.{k}") for k in fit_parameters(hints)}
        if hints.lazy_from is not None and mats and all(m is not None for m in mats.values()):
            sparsity["lazy_blocks"] = lazy = lazy_norms(mats, layout, hints.lazy_from)
            sparsity["lazy_drift"] = math.hypot(*lazy.values())
        return {"block_sparsity": sparsity, "manifold": None, "sign_pattern": None}
    pairs = _check_theta(params, theta, layout)
    norms = {name: block_norms(m, layout) for name, (m, _) in sorted(pairs.items())}
    sparsity = {
        "in_support_energy": support_energy(list(pairs.values()), layout),
        "lazy_drift": None,
        "block_norms": norms,
        "support": {name: [[r, c] for a, r in enumerate(layout.names) for b, c in enumerate(layout.names)
                           if support(star, layout)[a, b]] for name, (_, star) in sorted(pairs.items())},
    }
    per_layer = []
    for l in layers_of(dict(pairs)):
        fit = _layer_fit(hints, l, pairs, layout)
        if fit is not None:
            per_layer.append({"layer": l, **fit})
    manifold, pattern = None, None
    if per_layer:
        last = per_layer[-1]
        manifold = {"scale": last["scale"], "rel_err": last["rel_err"], "gauge_cosine": last["gauge_cosine"],
                    "layer": last["layer"], "per_layer": per_layer}
        if "unidentifiable" in last:
            manifold["unidentifiable"] = last["unidentifiable"]
        if "value_row_cosine" in last:
            manifold["value_row_cosine"] = last["value_row_cosine"]
        pattern = last.get("sign_pattern")
        if "pq_summary" in last:
            manifold["pq_summary"] = last["pq_summary"]
        if "lazy_blocks" in last:
            lazy = last["lazy_blocks"]
            sparsity["lazy_blocks"] = lazy
            sparsity["lazy_drift"] = math.hypot(*lazy.values())
    return {"block_sparsity": sparsity, "manifold": manifold, "sign_pattern": pattern}


# ------------------------------------------------------------------ the analyzer
def weights_section(ctx) -> dict:
    """{"weights": the section}, None with the reason in ctx.reasons["weights"] where it cannot be
    computed: 'not applicable: ...' where the weights cannot be a construction's (a model of no family;
    a foreign model's weights read as --family whose matrices are not d_model x d_model of the layout,
    e.g. a model that embeds its input), 'failed: ...' where they should have been."""
    reasons, known, layout, params = ctx.reasons, ctx.weights_family, ctx.layout, ctx.params
    why = None
    if known is None:
        why = f"not applicable: family {ctx.subject.family or GENERIC!r} has no construction to compare with"
    elif layout is None:
        why = "no prompt layout (pass --layout)"
    elif not params:
        why = "no parameters recorded"
    elif mismatch := shape_mismatch(params, layout):
        why = (f"not applicable: {mismatch}: the model's weights are not in the prompt basis (e.g. it embeds its "
               f"input), so there is no construction to compare them with" if ctx.foreign else
               f"failed: {mismatch}; the layout does not fit the matrices")
    if why:
        reasons[WEIGHTS] = why
        return {WEIGHTS: None}
    if not ctx.theta:
        reasons["manifold"] = f"not applicable: no theta* for family {known.name!r}: only block norms and lazy drift"
    return {WEIGHTS: ctx.guard(WEIGHTS, analyze_weights, known, params, ctx.theta, layout)}


def open_weights(ctx):
    """The weights section, unless the weights could not be read (a foreign model's TL heads that do not
    convert: the driver said why under 'weights')."""
    return None if WEIGHTS in ctx.reasons else Once(weights_section, ctx)


def max_rel_err(analysis) -> float | None:
    """Largest per-block relative error to theta* at the best scale."""
    rel = get(analysis, WEIGHTS, "manifold", "rel_err")
    vals = [num(v) for v in (rel.values() if isinstance(rel, dict) else []) if num(v) is not None]
    return max(vals) if vals else None


def _weight(*keys: str):
    return lambda analysis: num(get(analysis, WEIGHTS, *keys))


def _sign_pattern(analysis) -> str | None:
    pattern = get(analysis, WEIGHTS, "sign_pattern")
    return pattern if isinstance(pattern, str) else None


register(Analyzer(
    name=WEIGHTS, place=ANALYSIS, open=open_weights, roles=("parameters",), arrays=("params", "theta_star"),
    summary="the learned weights against theta*: block sparsity, the scaling manifold, the sign pattern",
    missing="not applicable: no weights",
    columns=(Column("in_support_energy", "in-support energy", _weight("block_sparsity", "in_support_energy"),
                    "{:.3f}", "energy", "energy: in-support energy"),
             Column("manifold_rel_err", "manifold rel. err (max)", max_rel_err, "{:.3g}", "rel.err",
                    "rel.err: manifold relative error (max block)"),
             Column("gauge_cosine", "gauge cosine", _weight("manifold", "gauge_cosine"), "{:.3f}", "gauge",
                    "gauge: gauge cosine"),
             Column("sign_pattern", "sign pattern", _sign_pattern, "{}", "signs", "signs: value-row sign pattern"),
             Column("lazy_drift", "lazy drift", _weight("block_sparsity", "lazy_drift"), "{:.3g}", "lazy",
                    "lazy: lazy-block drift"))))
