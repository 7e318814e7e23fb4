"""The batch-TD step alpha that Wang et al.'s VD / SS / IWS compare a model with: one definition,
used by `icrl-interp train`'s held-out evaluation and by `icrl-interp analyze` alike.

A trained model's checkpoint has no step of its own (its config says alpha = 1), and Wang et al.
co-train one. Here the step is *fitted*: the alpha >= 0 that minimises the mean VD between the model
and L-step batch TD(0) over the **calibration half** of the tasks, and VD / SS / IWS are reported on
the other half (docs/analyzers.md, "Wang's metrics"). Which half a task is in is a pure function of
its task id (`calibration_tasks`), so the same tasks give the same split in both commands.

The fit is exact, not a grid search: from w_0 = 0, batch TD(0)
w_{l+1} = w_l + alpha (b + A w_l), b = (1/n) C sum_i r_i phi_i, A = (1/n) C sum_i phi_i (gamma phi+_i - phi_i)^T
makes w_L a polynomial of degree L in alpha (`td_weight_polynomial`), so each task's
VD(alpha) = sum_s mu(s) (v_tf(s) - phi(s) . w_L(alpha))^2 is a polynomial of degree 2L whose
coefficients add up over tasks (`AlphaFit`, a streaming accumulator); its minimum over alpha >= 0 is
at 0 or at a real root of its derivative.

The registered analyzer 'wang_metrics' (`WangStream`) computes VD / SS / IWS of a recorded
linear-attention model of a task whose output is linear in the query (`Hints.query_linear`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jaxtyping import Float, Int

from ..core.errors import UserError
from . import convergence
from .base import Analyzer, Chunk
from .keys import WANG_METRICS
from .registry import register
from .streams import TASK_KEY, PerTask, dtype_attr, layer_param
from .td_probe import _task_uniform

Array = np.ndarray

SPLIT_SEED = 0x57E9
"""Seed of the task-id hash that splits tasks into calibration and evaluation halves."""
CALIBRATION_SHARE = 0.5
"""Share of the tasks (by hashed task id) that the step is fitted on."""
EVAL_MAX_PROMPTS = 1 << 16
"""VD / SS / IWS are computed on at most this many evaluation prompts (the first in order), so memory stays
bounded on any recording; the calibration sums use every calibration prompt."""


def calibration_tasks(task_id: Int[Array, " batch"]) -> np.ndarray:
    """True for the prompts whose task is in the calibration half (a pure function of the task id)."""
    return _task_uniform(np.asarray(task_id, dtype=np.int64), SPLIT_SEED) < CALIBRATION_SHARE


def td_weight_polynomial(
    phi: Float[Array, "batch n d"],
    gamma_phi_next: Float[Array, "batch n d"],
    rewards: Float[Array, "batch n"],
    n_iters: int,
    C: Float[Array, "d d"] | None = None,
) -> Float[Array, "batch k d"]:
    """Coefficients c_k (k = 0..n_iters) of batch TD(0)'s weight after n_iters steps from w_0 = 0 as a
    polynomial in the step: w_L(alpha) = sum_k alpha^k c_k (`reference.batch_td` at any alpha)."""
    phi, gpn, r = (np.asarray(a, dtype=np.float64) for a in (phi, gamma_phi_next, rewards))
    B, n, d = phi.shape
    C = np.eye(d) if C is None else np.asarray(C, dtype=np.float64)
    b = np.einsum("bn,bnd->bd", r, phi) / n @ C.T
    A = C @ np.einsum("bnd,bne->bde", phi, gpn - phi) / n
    coef = np.zeros((B, n_iters + 1, d))
    for _ in range(n_iters):
        nxt = coef.copy()
        nxt[:, 1] += b
        nxt[:, 1:] += np.einsum("bde,bke->bkd", A, coef[:, :-1])
        coef = nxt
    return coef


def weights_at(coef: Float[Array, "batch k d"], alpha: float) -> Float[Array, "batch d"]:
    """w_L(alpha) from the polynomial's coefficients."""
    return np.einsum("k,bkd->bd", float(alpha) ** np.arange(coef.shape[1]), coef)


class AlphaFit:
    """Sum over tasks of the polynomial VD_t(alpha); `alpha()` is its minimiser over alpha >= 0."""

    def __init__(self, n_iters: int):
        self.poly = np.zeros(2 * n_iters + 1)
        self.count = 0

    def update(self, v_tf: Float[Array, "batch s"], coef: Float[Array, "batch k d"],
               phi: Float[Array, "batch s d"], mu: Float[Array, "batch s"]) -> None:
        # residual v_tf - phi . w_L(alpha) = sum_k alpha^k E_k with E_0 = v_tf - phi . c_0, E_k = -phi . c_k
        E = -np.einsum("bsd,bkd->bsk", phi, coef)
        E[..., 0] += v_tf
        G = np.einsum("bs,bsk,bsl->kl", mu, E, E)
        K = G.shape[0]
        for m in range(2 * K - 1):  # coefficient of alpha^m: the m-th anti-diagonal
            self.poly[m] += np.trace(np.fliplr(G), offset=K - 1 - m)
        self.count += v_tf.shape[0]

    def mean_vd(self, alpha: float) -> float:
        """Mean VD over the calibration tasks at alpha, from the summed polynomial (near a VD of 0 the sum
        cancels to ~1e-16 of its terms: exact enough to compare candidates, not a VD to report as 0)."""
        return float(np.polyval(self.poly[::-1], alpha)) / self.count

    def alpha(self) -> float:
        if self.count == 0:
            raise UserError("no calibration task to fit the TD step alpha on (too few tasks)")
        p = np.trim_zeros(self.poly[::-1], "f")  # highest power first
        if p.size <= 1:
            return 0.0  # VD does not depend on alpha (e.g. zero rewards and a zero model)
        roots = np.roots(np.polyder(p))
        scale = max(1.0, float(np.max(np.abs(roots)))) if roots.size else 1.0
        cand = [0.0] + [float(z.real) for z in roots if abs(z.imag) <= 1e-8 * scale and z.real > 0]
        return min(cand, key=self.mean_vd)


def _triangle(m: Float[Array, "batch r k"], k: int) -> Float[Array, "batch p"]:
    """R of a thin QR of each m (|R a| = |m a| for every a), zero-padded to k x k rows, packed: its upper
    triangle row by row (`_unpack`), as R is upper triangular (k(k+1)/2 numbers kept instead of k^2)."""
    r = np.linalg.qr(m, mode="r")
    out = np.zeros((m.shape[0], k, k))
    out[:, : r.shape[1]] = r[:, :k]
    upper = np.triu_indices(k)
    return out[:, upper[0], upper[1]]


def _unpack(packed: Float[Array, "batch p"], k: int) -> Float[Array, "batch k k"]:
    """The k x k upper-triangular matrices that `_triangle` packed (zeros below the diagonal, as before)."""
    out = np.zeros((packed.shape[0], k, k))
    upper = np.triu_indices(k)
    out[:, upper[0], upper[1]] = packed
    return out


@dataclass
class PromptSummary:
    """What VD / SS / IWS of one evaluation prompt need at a step alpha not yet known: O(L^2) numbers
    instead of the prompt's states and features. With a = (1, alpha, ..., alpha^L) and w_L(alpha) = C^T a:

    VD  = sum_s mu_s (v_s - phi_s . C^T a)^2 = |R_vd a|^2   (R_vd: QR of the mu-weighted residual polynomial)
    SS  = sum_s mu_s cos(g_s, w) = (C gbar) . a / |w|       (gbar = sum_s mu_s g_s / |g_s|)
    IWS = cos(w_wls, w)        = (C w_wls / |w_wls|) . a / |w|
    |w| = |R_w a|                                            (R_w: QR of C^T)

    The QR factors keep VD exact near 0 (no squared cancellation as in a sum of polynomial coefficients);
    the cosines equal `convergence.vd_ss_iws`'s to rounding, NaN where it gives NaN (a zero gradient)."""

    task_id: Int[Array, " batch"]
    r_vd: Float[Array, "batch p"]  # upper triangles, packed (`_triangle`)
    r_w: Float[Array, "batch p"]
    ss_num: Float[Array, "batch k"]
    iws_num: Float[Array, "batch k"]

    @classmethod
    def of(cls, task_id, v_tf, grad_tf, coef, phi, mu) -> "PromptSummary":
        k = coef.shape[1]
        resid = -np.einsum("bsd,bkd->bsk", phi, coef)
        resid[..., 0] += v_tf
        with np.errstate(invalid="ignore", divide="ignore"):
            unit_g = grad_tf / np.linalg.norm(grad_tf, axis=-1, keepdims=True)
            w_wls = convergence.wls_weights(phi, mu, v_tf)
            unit_wls = w_wls / np.linalg.norm(w_wls, axis=-1, keepdims=True)
        return cls(np.asarray(task_id), _triangle(np.sqrt(mu)[..., None] * resid, k),
                   _triangle(np.swapaxes(coef, 1, 2), k),
                   np.einsum("bkd,bd->bk", coef, np.einsum("bs,bsd->bd", mu, unit_g)),
                   np.einsum("bkd,bd->bk", coef, unit_wls))

    FIELDS = ("task_id", "r_vd", "r_w", "ss_num", "iws_num")
    METRICS_BLOCK = 4096
    """Prompts whose triangles `metrics` unpacks at a time (the unpacked copy stays small)."""

    @classmethod
    def concat(cls, parts: list["PromptSummary"]) -> "PromptSummary":
        """One summary of all `parts`, which it empties field by field as it goes: the peak is the summaries
        once plus one field, not twice (the parts are not used again)."""
        out = {}
        for f in cls.FIELDS:
            out[f] = np.concatenate([getattr(p, f) for p in parts])
            for p in parts:
                setattr(p, f, None)
        return cls(**out)

    def metrics(self, alpha: float) -> dict[str, np.ndarray]:
        k = self.ss_num.shape[-1]
        a = float(alpha) ** np.arange(k)
        # each prompt's products from its own k x k triangle, a block of prompts at a time: the same
        # numbers as one product over all of them
        step = self.METRICS_BLOCK
        r_vd_a, r_w_a = (np.concatenate([_unpack(r[i : i + step], k) @ a for i in range(0, len(r), step)]
                                        or [np.zeros((0, k))])
                         for r in (self.r_vd, self.r_w))
        w_norm = np.linalg.norm(r_w_a, axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"VD": np.sum(r_vd_a**2, axis=-1),
                    "SS": (self.ss_num @ a) / w_norm, "IWS": (self.iws_num @ a) / w_norm}


class WangEvaluation:
    """Wang et al.'s VD / SS / IWS against batch TD at the fitted step (or a given one), fed per batch of
    prompts: calibration prompts feed `AlphaFit`; evaluation prompts are kept as `PromptSummary`s
    (O(L^2) numbers each, at most EVAL_MAX_PROMPTS of them) until the step is known."""

    def __init__(self, n_iters: int, alpha: float | None = None):
        self.fit = AlphaFit(n_iters)
        self.given = alpha
        self.kept: list[PromptSummary] = []
        self.n_kept = 0
        self.n_eval = 0

    def update(self, task_id, v_tf, grad_tf, coef, phi, mu) -> None:
        """One batch: v_tf [B, S] and its query gradient grad_tf [B, S, d] at every state, TD's polynomial
        coef [B, k, d], state features phi [B, S, d], stationary distribution mu [B, S]."""
        cal = calibration_tasks(task_id) if self.given is None else np.zeros(len(v_tf), dtype=bool)
        if cal.any():
            self.fit.update(v_tf[cal], coef[cal], phi[cal], mu[cal])
        ev = np.nonzero(~cal)[0]
        self.n_eval += ev.size
        ev = ev[: max(0, EVAL_MAX_PROMPTS - self.n_kept)]
        if ev.size:
            self.kept.append(PromptSummary.of(*(np.asarray(x)[ev] for x in (task_id, v_tf, grad_tf, coef, phi, mu))))
            self.n_kept += ev.size

    def result(self) -> tuple[dict, dict]:
        """({alpha, alpha_source, VD, SS, IWS, n_tasks, n_calibration_tasks, ...}, per-prompt metrics with
        `task_id`) on the kept evaluation prompts."""
        if not self.kept:
            raise UserError("no evaluation task for VD/SS/IWS (too few tasks: they are split in halves by task id)")
        alpha = self.given if self.given is not None else self.fit.alpha()
        kept = PromptSummary.concat(self.kept)
        self.kept = [kept]
        m = kept.metrics(alpha)
        out = {"alpha": float(alpha),
               "alpha_source": "given" if self.given is not None else "fitted",
               "alpha_calibration_vd": None if self.given is not None else max(0.0, self.fit.mean_vd(alpha)),
               "n_calibration_prompts": self.fit.count,
               **{k: float(np.nanmean(v)) for k, v in m.items()},
               "n_tasks": int(np.unique(kept.task_id).size), "n_prompts": int(kept.task_id.size),
               "n_eval_prompts_total": self.n_eval}
        return out, {"task_id": kept.task_id, **m}


# ------------------------------------------------------------------ the analyzer
class WangStream:
    """VD, SS and IWS of a linear-attention TD model from its recorded context columns
    (`value` / `score`: the architecture's parameter names of P and Q), against L-step batch TD on each
    prompt's own transitions at the step of `td_step` (fitted on the calibration half of the tasks, or
    `alpha` when given; C: TD's preconditioner, identity when None)."""

    def __init__(self, params, layout, n_layers, pos, value: str = "P", score: str = "Q", per_task_max: int = 0,
                 alpha: float | None = None, C=None, tol: float = 1e-3, reasons: dict | None = None):
        self.per_task_max, self.tol, self.reasons = per_task_max, tol, reasons if reasons is not None else {}
        self.P = [np.asarray(layer_param(params, l, value), dtype=np.float64) for l in range(n_layers)]
        self.Q = [np.asarray(layer_param(params, l, score), dtype=np.float64) for l in range(n_layers)]
        self.layout, self.L, self.n, self.C = layout, n_layers, pos - 1, C
        self.evaluation = WangEvaluation(n_layers, alpha)
        self.residual = 0.0

    @property
    def paths(self) -> list[str]:
        return ["prompts/z", "tasks/phi", "tasks/stationary"] + [
            f"acts/blocks.{l}.hook_resid_post" for l in range(self.L)]

    def update(self, chunk: Chunk) -> None:
        data = chunk.data
        z = data["prompts/z"]
        ctx = [z[:, : self.n]] + [
            data[f"acts/blocks.{l}.hook_resid_post"][:, : self.n].astype(np.float64) for l in range(self.L - 1)]
        w_tf = convergence.linear_td_query_weights(ctx, self.P, self.Q, self.layout)
        # the implicit weight must reproduce the recorded output at the real query
        phi_q = z[:, -1, self.layout.slice("phi")]
        out = self.layout.readout(data[f"acts/blocks.{self.L - 1}.hook_resid_post"].astype(np.float64))[:, 0]
        self.residual = max(self.residual, float(np.max(np.abs((phi_q * w_tf).sum(-1) - out) / (1 + np.abs(out)))))
        lay = self.layout
        coef = td_weight_polynomial(z[:, : self.n, lay.slice("phi")], z[:, : self.n, lay.slice("gamma_phi_next")],
                                            z[:, : self.n, lay.slice("reward")][..., 0], self.L, self.C)
        phi, mu = data["tasks/phi"], data["tasks/stationary"]
        task = data[TASK_KEY] if TASK_KEY in data else np.arange(phi.shape[0])
        self.evaluation.update(task, np.einsum("bsd,bd->bs", phi, w_tf), np.broadcast_to(w_tf[:, None, :], phi.shape),
                               coef, phi, mu)

    def result(self, tol: float) -> tuple[dict | None, str | None]:
        if self.residual > tol:
            return None, (f"not applicable: the model is not linear in the query (implicit weight misses the recorded output by "
                          f"{self.residual:.2g}); VD/SS/IWS need a linear-attention model")
        res, per_prompt = self.evaluation.result()
        res["query_map_residual"] = self.residual
        per_task = PerTask(("VD", "SS", "IWS"), self.per_task_max)
        per_task.update(per_prompt.pop("task_id"), **per_prompt)
        res["per_task"] = per_task.result()
        return res, None

    def finalize(self) -> dict:
        res, why = self.result(self.tol)
        if why:
            self.reasons[WANG_METRICS] = why
        return {WANG_METRICS: res}


def _td_preconditioner(config):
    """The checkpoint's TD preconditioner C (the `C` constant of its family), None (identity) without one."""
    try:
        return None if config is None else (config.constants or {}).get("C")
    except UserError:  # a family this process does not know: no constants to read
        return None


def _why_not(ctx) -> str | None:
    """Why VD/SS/IWS cannot be computed on this recording (None: they can)."""
    f, arch, facts, layout = ctx.f, ctx.subject.arch, ctx.facts, ctx.layout
    activation = None if ctx.config is None else ctx.config.model.activation
    if activation:
        return f"not applicable: the model uses activation {activation!r}; VD/SS/IWS need linear attention"
    if arch is None:
        return "not applicable: needs a model of a known architecture (its value and score parameters)"
    if not facts.has_tasks or not all(p in f for p in ("tasks/phi", "tasks/stationary")):
        return "needs task data (features, stationary distribution)"
    if any(layer_param(ctx.params, l, k) is None for l in range(ctx.n_layers) for k in (arch.value, arch.score)):
        return f"needs the recorded parameters {arch.value} and {arch.score} of every layer"
    if not {"phi", "gamma_phi_next", "reward"} <= set(layout.names):
        return (f"not applicable: VD/SS/IWS read each prompt's transitions from the layout's blocks phi, "
                f"gamma_phi_next and reward; this layout has {', '.join(layout.names)}")
    if any(l not in facts.readable for l in range(ctx.n_layers)):
        return "needs hook_resid_post of every layer"
    if any(f[f"acts/blocks.{l}.hook_resid_post"].shape[1] != facts.pos for l in range(ctx.n_layers)):
        return "needs hook_resid_post at every position"
    return None


def open_wang(ctx):
    """VD/SS/IWS where the task's output is linear in the query (`Hints.query_linear`) and the recording
    allows it (else the reason is noted)."""
    if ctx.hints is None or not ctx.hints.query_linear:
        return None
    why = _why_not(ctx)
    if why:
        ctx.reasons[WANG_METRICS] = why
        return None
    arch, C = ctx.subject.arch, _td_preconditioner(ctx.config)
    tol = 1e-8 if dtype_attr(ctx.f["acts/blocks.0.hook_resid_post"]) == "float64" else 1e-3
    return WangStream(ctx.params, ctx.layout, ctx.n_layers, ctx.facts.pos, value=arch.value, score=arch.score,
                      per_task_max=ctx.opts.per_task_max, alpha=ctx.opts.wang_alpha,
                      C=None if C is None else np.asarray(C, float), tol=tol, reasons=ctx.reasons)


register(Analyzer(
    name=WANG_METRICS, open=open_wang, roles=("resid_post", "parameters"),
    arrays=("prompts/z", "tasks/phi", "tasks/stationary"),
    summary="Wang et al.'s VD, SS and IWS against L-step batch TD at the fitted step",
    missing="not applicable: the task's output is not linear in the query (Hints.query_linear)"))
