"""Convergence analyzers: value error against depth, distance to the teacher, and Wang's VD/SS/IWS.

Array-level functions on float64 numpy arrays, batched over tasks (leading axis).
Definitions: docs/concepts.md, sections Linear-attention TD(0) (VD, SS, IWS) and Softmax TD
(value error).

The registered analyzer 'value_error' (`base.Analyzer`): the value each layer's residual stream holds
where the task family's output sits (`ValueStream` per layer), against v_π and the reference
algorithm at the same depth, and its convergence with depth (`depth_summary`).
"""
from __future__ import annotations

import math

import numpy as np
from jaxtyping import Float, Int

from ..core.errors import UserError
from ..families.registry import Hints
from ..tasks.layouts import PromptLayout
from . import inputs
from .base import Analyzer, Chunk, Column, Layers, guard, prepare_into, prepared
from .keys import CONVERGENCE, LAYERS, REFERENCE_VALUE_ERROR, VALUE_ERROR, any_layer, last_layer
from .registry import register
from .streams import TASK_KEY, PerTask, mean_or_none

Array = np.ndarray


class StateBins:
    """The (prompt, state) bin of every labelled position of a chunk and the bins' counts: built once per chunk and
    set of positions (`for_chunk`), shared by every layer's per-state means and the reference's."""

    def __init__(self, states: Int[Array, "batch pos"], n_states: int):
        B = states.shape[0]
        self.ok = states >= 0
        self.flat = (np.arange(B)[:, None] * n_states + states)[self.ok]
        self.shape = (B, n_states)
        self.counts = np.bincount(self.flat, minlength=B * n_states).reshape(self.shape)

    @classmethod
    def for_chunk(cls, shared: dict, states: Int[Array, "batch pos"], n_states: int, key) -> "StateBins":
        """The chunk's bins for the positions `key` names (built by the first layer that asks)."""
        name = ("state_bins", n_states, key)
        if name not in shared:
            shared[name] = cls(states, n_states)
        return shared[name]

    def means(self, v_pos: Float[Array, "batch pos"]) -> Float[Array, "batch s"]:
        """Per-state means of `v_pos` (NaN where a state holds no position)."""
        sums = np.bincount(self.flat, weights=v_pos[self.ok], minlength=self.counts.size).reshape(self.shape)
        with np.errstate(invalid="ignore", divide="ignore"):
            return sums / self.counts


def state_values(
    v_pos: Float[Array, "batch pos"], states: Int[Array, "batch pos"], n_states: int
) -> Float[Array, "batch s"]:
    """Per-state value estimates: the mean over the positions holding each state (NaN if none)."""
    return StateBins(states, n_states).means(v_pos)


def value_errors(
    v_hat: Float[Array, "batch s"], v_true: Float[Array, "batch s"], mu: Float[Array, "batch s"] | None = None
) -> tuple[Float[Array, " batch"], Float[Array, " batch"]]:
    """Per task: ||v_hat - v_pi||_inf and the mu-weighted RMS error, over the states v_hat covers (non-NaN).

    The RMS renormalises mu over the covered states: sqrt(sum mu e^2 / sum mu); uniform if mu is None.
    """
    err = v_hat - v_true
    ok = np.isfinite(err)
    inf = np.where(ok, np.abs(err), -np.inf).max(-1)
    w = np.ones_like(v_true) if mu is None else np.asarray(mu, dtype=np.float64)
    w = np.where(ok, w, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rms = np.sqrt((w * np.where(ok, err, 0.0) ** 2).sum(-1) / w.sum(-1))
    return np.where(ok.any(-1), inf, np.nan), rms


def teacher_distance(
    out: Float[Array, "batch k"], teacher: Float[Array, "batch k"]
) -> tuple[Float[Array, " batch"], Float[Array, " batch"]]:
    """Per task: ||out - teacher||_2 and the same relative to ||teacher||_2 (LSA: output vs w_SARSA)."""
    dist = np.linalg.norm(out - teacher, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return dist, dist / np.linalg.norm(teacher, axis=-1)


def _batched_cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def wls_weights(
    phi: Float[Array, "batch s d"], d_pi: Float[Array, "batch s"], v: Float[Array, "batch s"]
) -> Float[Array, "batch d"]:
    """w = (X^T D X)^{-1} X^T D v: the d_pi-weighted least-squares linear fit of v on the features."""
    XtD = np.swapaxes(phi, -1, -2) * d_pi[:, None, :]
    lhs = XtD @ phi
    rhs = (XtD @ v[..., None])[..., 0]
    try:
        return np.linalg.solve(lhs, rhs[..., None])[..., 0]
    except np.linalg.LinAlgError:
        return (np.linalg.pinv(lhs) @ rhs[..., None])[..., 0]


def vd_ss_iws(
    v_tf: Float[Array, "batch s"],
    v_td: Float[Array, "batch s"],
    grad_tf: Float[Array, "batch s d"],
    grad_td: Float[Array, "batch s d"],
    phi: Float[Array, "batch s d"],
    d_pi: Float[Array, "batch s"],
    w_td: Float[Array, "batch d"],
) -> dict[str, np.ndarray]:
    """Wang et al.'s metrics per task, each state's phi(s) put in the query of one context.

    VD  = sum_s d_pi(s) (v_tf(s) - v_td(s))^2
    SS  = sum_s d_pi(s) cos(grad_{phi_q} v_tf(s), grad_{phi_q} v_td(s))
    IWS = cos(w_tf, w_td), w_tf = (X^T D X)^{-1} X^T D v_tf (weighted least squares)
    """
    return {
        "VD": (d_pi * (v_tf - v_td) ** 2).sum(-1),
        "SS": (d_pi * _batched_cos(grad_tf, grad_td)).sum(-1),
        "IWS": _batched_cos(wls_weights(phi, d_pi, v_tf), w_td),
    }


def linear_td_query_weights(
    contexts: list[Float[Array, "batch n D"]],
    P: list[Float[Array, "D D"]],
    Q: list[Float[Array, "D D"]],
    layout: PromptLayout,
) -> Float[Array, "batch d"]:
    """The implicit weight w_tf of a linear-attention TD model: v_tf(phi_q) = w_tf . phi_q.

    The query column is never a source (mask M), so given the context columns Z_l of
    each layer the query column evolves linearly: z_q <- (I + (1/n) P_l C_l Q_l) z_q with
    C_l = sum_{i<n} z_i z_i^T. The query starts as [phi_q; 0; 0], so
    v_tf = readout_sign * e_readout^T T_{L-1} ... T_0 [phi_q; 0; 0] is linear in phi_q.
    `contexts[l]` holds the n context columns entering layer l.
    """
    if not (len(contexts) == len(P) == len(Q)) or not contexts:
        raise UserError("need one context, P and Q per layer")
    B, n, D = contexts[0].shape
    phi = layout.slice("phi")
    row = np.zeros(D)
    row[layout.slice(layout.readout_block)] = layout.readout_sign
    # propagate the readout row backwards: r^T T_{L-1} ... T_0, as a [B, D] row per task
    r = np.broadcast_to(row, (B, D)).copy()
    for Z, P_l, Q_l in reversed(list(zip(contexts, P, Q))):
        C = np.einsum("bnd,bne->bde", Z, Z)
        r = r + np.einsum("bd,de,bef,fg->bg", r, P_l, C, Q_l) / n
    return r[:, phi]


def _log_rate(layers, errors) -> float | None:
    """exp of the least-squares slope of log(error) on layer: the error's factor per layer."""
    if len(layers) < 2:
        return None
    x, y = np.asarray(layers, dtype=np.float64), np.log(np.asarray(errors, dtype=np.float64))
    x = x - x.mean()
    return float(np.exp((x * (y - y.mean())).sum() / (x * x).sum()))


def depth_summary(layers, errors, reference=None) -> dict | None:
    """How a value-error curve falls with depth (the layers' value errors, None where absent).
    first / last: the error at the first and last layer that has one; ratio = last / first;
    rate: the geometric factor per layer, exp of the least-squares slope of log(error) on the layer
    (< 1: the error falls; needs two positive errors); decreasing: the share of consecutive layers
    where it falls. With `reference` (the reference algorithm's error at the same depths, None where
    it has no step), the same rate of the reference over the layers both have (`reference_rate`) and
    last_over_reference = the model's last error / the reference's at that layer (1: as converged as
    the algorithm at that depth). None when no layer has an error.
    """
    pts = [(int(l), float(e)) for l, e in zip(layers, errors) if e is not None and math.isfinite(e)]
    if not pts:
        return None
    ls, es = [l for l, _ in pts], [e for _, e in pts]
    pos = [(l, e) for l, e in pts if e > 0]
    steps = list(zip(es, es[1:]))
    out = {"layers": ls, "first": es[0], "last": es[-1],
           "ratio": es[-1] / es[0] if es[0] > 0 else None,
           "rate": _log_rate([l for l, _ in pos], [e for _, e in pos]),
           "decreasing": sum(b < a for a, b in steps) / len(steps) if steps else None,
           "reference_rate": None, "last_over_reference": None}
    if reference is not None:
        ref = {int(l): float(r) for l, r in zip(layers, reference) if r is not None and math.isfinite(r)}
        both = [(l, ref[l]) for l, _ in pos if ref.get(l, 0.0) > 0]
        out["reference_rate"] = _log_rate([l for l, _ in both], [r for _, r in both])
        last = ref.get(ls[-1])
        out["last_over_reference"] = es[-1] / last if last else None
    return out


# ------------------------------------------------------------------ the analyzer
class ValueStream:
    """Value error of layer l read from hook_resid_post where the task family's output sits
    (`Hints.output`): 'query' (the readout of the last position, against v_pi of the query state),
    'positions' (block `value_block` of every position, per-state against v_pi) or 'parameters'
    (blocks `output_blocks` of the last position, against the reference update)."""

    def __init__(self, hints: Hints, layer, layout, ds, pos, has_tasks, has_ref_values, per_task_max: int = 0):
        self.hints, self.mode, self.layer, self.layout = hints, hints.output, layer, layout
        if self.mode not in ("query", "positions", "parameters"):
            raise ValueError(f"unknown output kind {self.mode!r} in the family's hints")
        self.path = f"acts/blocks.{layer}.hook_resid_post"
        self.p = inputs.positions(ds.attrs, ds.shape, 1, pos, self.path[5:])
        self.pos, self.has_tasks, self.has_ref = pos, has_tasks, has_ref_values
        self.sum = {"err": 0.0, "rms": 0.0, "ref_err": 0.0, "ref_rms": 0.0, "rel": 0.0}
        self.count = {"err": 0, "ref_err": 0, "rel": 0}
        self.gap = 0.0
        self.per_task = PerTask((VALUE_ERROR, REFERENCE_VALUE_ERROR), per_task_max)
        self.key = (VALUE_ERROR, layer)  # of its `prepare` in a chunk's shared results
        if self.mode in ("query", "parameters") and self.p[-1] != pos - 1:
            raise ValueError("the last (query / parameter) position is not recorded")

    def _add(self, key, errs, rms=None):
        ok = np.isfinite(errs)
        self.sum[key] += float(errs[ok].sum())
        if rms is not None:
            self.sum[key.replace("err", "rms")] += float(rms[ok].sum())
        self.count[key] += int(ok.sum())

    def _output_columns(self, z_last: np.ndarray) -> np.ndarray:
        """The output blocks of the last position, concatenated in hint order."""
        return np.concatenate([z_last[..., self.layout.slice(b)] for b in self.hints.output_blocks], axis=-1)

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path, "prompts/state", "tasks/values", "tasks/stationary", "reference/values",
                "reference/output")

    def measure(self, data: dict, shared: dict) -> dict:
        """One chunk's errors, before they are summed: {"add": [(key, errors, squares or None)], "gap": the largest
        |value - reference| or None, "err" / "ref_err": per prompt for the per-task values or None}. Needs only the
        chunk (`prepare`)."""
        z = data[self.path]
        add, gap, err, ref_err = [], None, None, None
        if self.mode == "positions":
            v_pos = z[:, :, self.layout.slice(self.hints.value_block).start].astype(np.float64)
            if self.has_ref:
                ref = data["reference/values"][:, self.layer + 1][:, self.p]
                gap = float(np.max(np.abs(v_pos - ref), initial=0.0))
            if self.has_tasks:
                v_true, mu = data["tasks/values"], data["tasks/stationary"]
                bins = StateBins.for_chunk(shared, data["prompts/state"][:, self.p], v_true.shape[-1], self.p.tobytes())
                err, rms = value_errors(bins.means(v_pos), v_true, mu)
                add.append(("err", err, rms))
                if self.has_ref:
                    ref_err, rms = value_errors(bins.means(ref), v_true, mu)
                    add.append(("ref_err", ref_err, rms))
        elif self.mode == "query":
            v = self.layout.readout(z)[:, 0].astype(np.float64)
            if self.has_ref:
                ref = data["reference/values"][:, self.layer + 1, 0]
                gap = float(np.max(np.abs(v - ref), initial=0.0))
            if self.has_tasks:
                q = data["prompts/state"][:, -1]
                v_true = np.where(q >= 0, np.take_along_axis(data["tasks/values"], np.maximum(q, 0)[:, None], 1)[:, 0], np.nan)
                err = np.abs(v - v_true)
                add.append(("err", err, err ** 2))  # value_rms = sqrt(mean err^2), a root mean square
                if self.has_ref:
                    ref_err = np.abs(ref - v_true)
                    add.append(("ref_err", ref_err, ref_err ** 2))
        else:  # the updated parameters in the last column against the teacher's update
            teacher = data["reference/output"]
            out = self._output_columns(z[:, -1].astype(np.float64))
            if out.shape[-1] != teacher.shape[-1]:
                raise UserError(f"reference output has width {teacher.shape[-1]}, the output blocks "
                                f"{', '.join(self.hints.output_blocks)} {out.shape[-1]}")
            err, rel = teacher_distance(out, teacher)
            add += [("err", err, None), ("rel", rel, None)]
            gap = float(np.max(err, initial=0.0))
        return {"add": add, "gap": gap, "err": err, "ref_err": ref_err}

    def prepare(self, data: dict, shared: dict, hurry=None) -> None:
        """The chunk's errors (`measure`), computed where the chunk is read (`Stream.prepare`)."""
        prepare_into(shared, self.key, self.measure, data, shared)

    def update(self, chunk: Chunk) -> None:
        m = prepared(chunk.shared, self.key, self.measure, chunk.data, chunk.shared)
        for key, errs, squares in m["add"]:
            self._add(key, errs, squares)
        if m["gap"] is not None:
            self.gap = max(self.gap, m["gap"])
        err, ref_err = m["err"], m["ref_err"]
        if err is not None and TASK_KEY in chunk.data:
            nan = np.full(err.shape, np.nan)
            self.per_task.update(chunk.data[TASK_KEY], value_error=err,
                                 reference_value_error=nan if ref_err is None else ref_err)

    def result(self) -> dict:
        n, nr = self.count["err"], self.count["ref_err"]
        out = {VALUE_ERROR: mean_or_none(self.sum["err"], n)}
        per_task = self.per_task.result() if n else None
        if self.mode == "parameters":
            out["teacher_rel_err"] = mean_or_none(self.sum["rel"], self.count["rel"])
            out["reference_gap"] = self.gap
            if per_task is not None:
                del per_task[REFERENCE_VALUE_ERROR]
            out["value_error_per_task"] = per_task
            return out
        rms = self.sum["rms"] / n if n else None
        out.update({"value_rms": math.sqrt(rms) if (self.mode == "query" and rms is not None) else rms,
                    REFERENCE_VALUE_ERROR: mean_or_none(self.sum["ref_err"], nr),
                    "reference_gap": self.gap if self.has_ref else None,
                    "value_error_per_task": per_task})
        return out


class ValueLayers(Layers):
    """The value error of every readable layer, and its convergence with depth (`depth_summary` over all
    layers: None where a layer has no value error)."""

    def __init__(self, streams: dict[int, ValueStream], reasons: dict, n_layers: int):
        super().__init__(streams, reasons, VALUE_ERROR, lambda layer, res: res)
        self.n_layers = n_layers

    def finalize(self) -> dict:
        out = super().finalize()
        by_layer, depth = out[LAYERS], list(range(self.n_layers))
        errors = [by_layer.get(l, {}).get(VALUE_ERROR) for l in depth]
        reference = [by_layer.get(l, {}).get(REFERENCE_VALUE_ERROR) for l in depth]
        out[CONVERGENCE] = guard(self.reasons, CONVERGENCE, depth_summary, depth, errors, reference)
        return out


def _unreadable(ctx, layer: int) -> str:
    """Why layer l's value error cannot be read: its hook_resid_post is not recorded, or not at the
    layout's width (a model of a known family: the recording or the layout is wrong; a foreign model:
    its residual stream has a basis of its own, and the readouts serve instead)."""
    hook, foreign = f"blocks.{layer}.hook_resid_post", ctx.subject.model is None
    if hook not in ctx.facts.hooks:
        return (f"no {hook} recorded" if foreign else f"the recording lacks hook {hook}, which the value error needs; "
                f"add blocks.*.hook_resid_post to the probe spec")
    width, d_model = ctx.f[f"acts/{hook}"].shape[-1], ctx.layout.d_model
    return (f"not applicable: {hook} has width {width}, not the layout's d_model {d_model}: the model's residual "
            f"stream is not in the prompt layout (see readouts)" if foreign else
            f"failed: hook {hook} has width {width} but the layout has d_model {d_model}: the layout does not fit")


def open_value_error(ctx):
    """A `ValueStream` per layer whose hook_resid_post is in the layout (`Facts.readable`)."""
    facts, f = ctx.facts, ctx.f
    if ctx.layout is None:
        ctx.reasons[VALUE_ERROR] = "no prompt layout (pass --layout): the values cannot be read from the residual stream"
    else:
        for l in range(ctx.n_layers):
            if l not in facts.readable:
                ctx.reasons[f"{VALUE_ERROR}.layer{l}"] = _unreadable(ctx, l)
    if not facts.has_tasks:
        ctx.reasons[VALUE_ERROR] = f"no task data ({ctx.rec.attr('task_data', 'present')})"
    streams = {}
    for l in sorted(facts.readable) if ctx.hints is not None else ():
        try:
            streams[l] = ValueStream(ctx.hints, l, ctx.layout, f[f"acts/blocks.{l}.hook_resid_post"], facts.pos,
                                     facts.has_tasks, "reference/values" in f, ctx.opts.per_task_max)
        except (ValueError, UserError) as e:
            ctx.reasons[f"{VALUE_ERROR}.layer{l}"] = str(e)
    return ValueLayers(streams, ctx.reasons, ctx.n_layers)


register(Analyzer(
    name=VALUE_ERROR, open=open_value_error, roles=("resid_post",), layer_keys=(VALUE_ERROR,),
    arrays=("prompts/state", "tasks/values", "tasks/stationary", "reference/values", "reference/output"),
    summary="the value each layer's residual stream holds against v_π and the reference algorithm at that depth",
    computed=lambda a: any_layer(a, VALUE_ERROR),
    missing="not applicable: no residual stream in the prompt layout",
    columns=(Column(VALUE_ERROR, "value error (last layer)", lambda a: last_layer(a, VALUE_ERROR), "{:.3g}", "v.err",
                    "v.err: value error (last layer)"),)))
