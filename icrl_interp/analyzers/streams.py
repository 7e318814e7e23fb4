"""Per-chunk accumulators of the activation analyzers: each is fed the same chunk of prompts
and keeps only fixed-size statistics, so a recording of any length is analyzed in one pass.

`analyze._activations` decides which of them a recording supports and drives them. What each
stream reads comes from the registry: the task family's `Hints` (where the algorithm's output and
TD error sit in the prompt layout) and the model architecture's parameter names.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UserError
from ..layouts import PromptLayout
from ..registry import Hints
from . import convergence, inputs, kernel, td_probe, weights


def mean_or_none(total: float, count: int):
    return total / count if count else None


def layer_param(params: dict, layer: int, key: str):
    """Layer l's parameter, or blocks.0's when weights are tied (only blocks.0 stored)."""
    return params.get(f"blocks.{layer}.attn.{key}", params.get(f"blocks.0.attn.{key}") if layer > 0 else None)


class PopulationKernel:
    """M_pi per layer from the learned score block S_l[block, block] and tasks (features, mu_pi)."""

    def __init__(self, params: dict, layout: PromptLayout, n_layers: int, gamma: float, n_states: int,
                 score: str = "A", block: str = "x"):
        x = layout.slice(block)
        self.A11 = []
        for l in range(n_layers):
            A = layer_param(params, l, score)
            self.A11.append(None if A is None else np.asarray(A, dtype=np.float64)[x, x])
        self.acc = [kernel.DiagonalityAccumulator(gamma, n_states) for _ in range(n_layers)]

    def update(self, phi: np.ndarray, mu: np.ndarray) -> None:
        done: dict[bytes, np.ndarray] = {}  # tied layers share A11: compute its kernel once
        for A11, acc in zip(self.A11, self.acc):
            if A11 is not None:
                key = A11.tobytes()
                if key not in done:
                    done[key] = kernel.population_kernel(A11, phi, mu)
                acc.update(done[key])

    def result(self, source: str) -> list[dict]:
        out = []
        for l, acc in enumerate(self.acc):
            res = acc.result(with_matrix=False)
            if res is not None:
                out.append({"layer": l, "tasks": source, **res})
        return out


def probe_iteration(hook: str, layer: int) -> int:
    """Reference iteration a hook of layer l is compared with: the residual stream after the layer
    (hook_resid_post, hook_tsm_out) carries delta^(l+1); everything computed from the layer's
    input (resid_pre, scores, pattern, values) carries delta^(l)."""
    return layer + 1 if hook.endswith(("hook_resid_post", "hook_tsm_out")) else layer


def td_direction(hints: Hints | None, layout: PromptLayout | None) -> np.ndarray | None:
    """The construction's TD-error direction in the residual basis (`Hints.td_direction`: block ->
    coefficient; e.g. Wang: the reward row, Xie: reward + target - current); None where there is none."""
    if layout is None or hints is None or not hints.td_direction:
        return None
    v = np.zeros(layout.d_model)
    for block, coef in hints.td_direction.items():
        v[layout.slice(block)] = coef
    return v


class ProbeStream:
    """One (layer, hook) TD probe fed from chunks."""

    def __init__(self, hook: str, layer: int, ds, pos: int, n: int, folds: int, direction):
        self.hook, self.layer, self.path = hook, layer, f"acts/{hook}"
        self.iteration = probe_iteration(hook, layer)
        self.direction, self.n = direction, n
        shape = ds.shape
        self.kind = "scores" if hook.endswith(("hook_pattern", "hook_attn_scores")) else "columns"
        if self.kind == "scores":
            if len(shape) != 4:
                raise ValueError(f"shape {shape} is not [N, heads, q, k]")
            q = inputs.positions(ds.attrs, shape, 2, pos, hook)
            if pos - 1 not in q or shape[3] != pos:
                raise ValueError("the last query row is not recorded")
            self.q_last = int(np.nonzero(q == pos - 1)[0][0])
            self.cols = np.arange(n)
            self.src = np.arange(n)
            F = shape[1]
        else:
            p = inputs.positions(ds.attrs, shape, 1, pos, hook)
            keep = np.nonzero(p < n)[0]
            if keep.size == 0:
                raise ValueError("no context column is recorded")
            self.src, self.cols = keep, p[keep]
            if np.array_equal(keep, np.arange(keep[0], keep[0] + keep.size)):
                self.src = slice(int(keep[0]), int(keep[0]) + keep.size)  # a view, not a copy
            F = int(np.prod(shape[2:]))
        self.acc = td_probe.ProbeAccumulator(F, folds)

    def update(self, data: dict, split: "ChunkSplit") -> None:
        act = data[self.path]
        if self.kind == "scores":
            X = np.moveaxis(act[:, :, self.q_last, : self.n], 1, -1)  # [B, n, heads]
        else:
            X = act[:, self.src]
            X = X.reshape(X.shape[0], X.shape[1], -1)
        y = data["reference/td_errors"][:, self.iteration][:, self.cols]
        ys = np.full_like(y, np.nan)
        ys[split.has_mate] = y[split.mate]
        self.acc.update(X, y, ys, split.fold, split.grouping)

    def result(self) -> dict:
        res = self.acc.result()
        cos = None
        if self.direction is not None and self.kind == "columns" and res["coef"].size == self.direction.size:
            cos = weights.cosine(res["coef"], self.direction)
        return {"r2": res["r2"], "r2_shuffled": res["r2_shuffled"], "alpha": res["alpha"],
                "target_iteration": self.iteration, "direction_cosine": cos,
                "n_train": res["n_train"], "n_test": res["n_test"]}


class ChunkSplit:
    """Task folds of one chunk of prompts, each prompt's partner for the shuffled control, and
    which prompts the probes use (`fraction` of the tasks, whole pairs, by hash)."""

    def __init__(self, start: int, stop: int, N: int, seed: int, test_fraction: float, folds: int,
                 fraction: float = 1.0):
        idx = np.arange(start, stop)
        mate = td_probe.partner(idx)
        self.has_mate = mate < min(stop, N)
        self.mate = mate[self.has_mate] - start
        self.fold = td_probe.task_folds(idx, seed, test_fraction, folds)
        keep = self.has_mate & td_probe.task_subset(idx, seed, fraction)
        self.grouping = td_probe.fold_grouping(self.fold, keep, folds)  # sorted once for all probes


class ValueStream:
    """Value error of layer l read from hook_resid_post where the task family's output sits
    (`Hints.output`): 'query' (the readout of the last position, against v_pi of the query state),
    'positions' (block `value_block` of every position, per-state against v_pi) or 'parameters'
    (blocks `output_blocks` of the last position, against the reference update)."""

    def __init__(self, hints: Hints, layer, layout, ds, pos, has_tasks, has_ref_values):
        self.hints, self.mode, self.layer, self.layout = hints, hints.output, layer, layout
        if self.mode not in ("query", "positions", "parameters"):
            raise ValueError(f"unknown output kind {self.mode!r} in the family's hints")
        self.path = f"acts/blocks.{layer}.hook_resid_post"
        self.p = inputs.positions(ds.attrs, ds.shape, 1, pos, self.path[5:])
        self.pos, self.has_tasks, self.has_ref = pos, has_tasks, has_ref_values
        self.sum = {"err": 0.0, "rms": 0.0, "ref_err": 0.0, "ref_rms": 0.0, "rel": 0.0}
        self.count = {"err": 0, "ref_err": 0, "rel": 0}
        self.gap = 0.0
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

    def update(self, data: dict) -> None:
        z = data[self.path]
        if self.mode == "positions":
            v_pos = z[:, :, self.layout.slice(self.hints.value_block).start].astype(np.float64)
            if self.has_ref:
                ref = data["reference/values"][:, self.layer + 1][:, self.p]
                self.gap = max(self.gap, float(np.max(np.abs(v_pos - ref), initial=0.0)))
            if self.has_tasks:
                states = data["prompts/state"][:, self.p]
                v_true, mu = data["tasks/values"], data["tasks/stationary"]
                S = v_true.shape[-1]
                self._add("err", *convergence.value_errors(convergence.state_values(v_pos, states, S), v_true, mu))
                if self.has_ref:
                    self._add("ref_err", *convergence.value_errors(convergence.state_values(ref, states, S), v_true, mu))
        elif self.mode == "query":
            v = self.layout.readout(z)[:, 0].astype(np.float64)
            if self.has_ref:
                ref = data["reference/values"][:, self.layer + 1, 0]
                self.gap = max(self.gap, float(np.max(np.abs(v - ref), initial=0.0)))
            if self.has_tasks:
                q = data["prompts/state"][:, -1]
                v_true = np.where(q >= 0, np.take_along_axis(data["tasks/values"], np.maximum(q, 0)[:, None], 1)[:, 0], np.nan)
                err = np.abs(v - v_true)
                # NOTE (kept from 0.1 so results stay comparable): the "rms" sum takes |err|, so the
                # query value_rms below is sqrt(mean |err|), not an RMS
                self._add("err", err, err)
                if self.has_ref:
                    rerr = np.abs(ref - v_true)
                    self._add("ref_err", rerr, rerr)
        else:  # the updated parameters in the last column against the teacher's update
            teacher = data["reference/output"]
            out = self._output_columns(z[:, -1].astype(np.float64))
            if out.shape[-1] != teacher.shape[-1]:
                raise UserError(f"reference output has width {teacher.shape[-1]}, the output blocks "
                                f"{', '.join(self.hints.output_blocks)} {out.shape[-1]}")
            dist, rel = convergence.teacher_distance(out, teacher)
            self._add("err", dist)
            self._add("rel", rel)
            self.gap = max(self.gap, float(np.max(dist, initial=0.0)))

    def result(self) -> dict:
        n, nr = self.count["err"], self.count["ref_err"]
        out = {"value_error": mean_or_none(self.sum["err"], n)}
        if self.mode == "parameters":
            out["teacher_rel_err"] = mean_or_none(self.sum["rel"], self.count["rel"])
            out["reference_gap"] = self.gap
            return out
        rms = self.sum["rms"] / n if n else None
        out.update({"value_rms": math.sqrt(rms) if (self.mode == "query" and rms is not None) else rms,
                    "reference_value_error": mean_or_none(self.sum["ref_err"], nr),
                    "reference_gap": self.gap if self.has_ref else None})
        return out


class KernelStream:
    """Empirical state-aggregated kernel of layer l, and the label-free diagonal masses."""

    def __init__(self, layer, ds, pos, gamma, n_states, layout, max_matrix_states, use_labels, bf16):
        self.path = f"acts/blocks.{layer}.attn.hook_pattern"
        shape = ds.shape
        if len(shape) != 4 or shape[3] != pos:
            raise UserError(f"hook {self.path[5:]} has shape {shape}, expected [N, heads, q, {pos}]")
        self.q = inputs.positions(ds.attrs, shape, 2, pos, self.path[5:])
        self.k = np.arange(pos)
        self.heads = shape[1]
        self.acc = [kernel.DiagonalityAccumulator(gamma, n_states) for _ in range(self.heads)] if use_labels else None
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

    def columns(self, data: dict, shared: dict) -> kernel.ChunkColumns:
        """Source indicator columns of this chunk, built once and shared by all layers."""
        if "kernel_columns" not in shared:
            states = data["prompts/state"] if self.acc is not None else np.full(data["prompts/z"].shape[:2], -1)
            codes = None
            if self.feature_block is not None:
                codes = kernel.feature_codes(kernel.feature_ids(data["prompts/z"][..., self.feature_block]))
            shared["kernel_columns"] = kernel.ChunkColumns.build(states, self.n_states if self.acc is not None else 0, codes)
        return shared["kernel_columns"]

    def update(self, data: dict, shared: dict) -> None:
        if not self.stochastic:
            return
        pat = data[self.path]  # kept in its recorded dtype; results are accumulated in float64
        res = kernel.chunk_kernel(pat, self.q, self.columns(data, shared))
        if np.max(np.abs(res["row_sums"] - 1.0), initial=0.0) > self.tol:
            self.stochastic = False
            return
        if self.acc is not None:
            for h, acc in enumerate(self.acc):
                acc.update(res["M"][:, h])
        self.self_sum += float(kernel.self_mass(pat, self.q, self.k).sum())
        if "same_mass" in res:
            self.same_sum += float(res["same_mass"].sum())
        self.count += pat.shape[0]

    def result(self) -> tuple[dict | None, dict | None, str | None]:
        if not self.stochastic:
            return None, None, "hook_pattern rows do not sum to 1 (an unnormalised kernel); diagonality needs softmax patterns"
        free = {"self": mean_or_none(self.self_sum, self.count),
                "same_features": mean_or_none(self.same_sum, self.count) if self.feature_block is not None else None}
        if self.acc is None:
            return None, free, "no state labels (prompts/state is -1): only the label-free diagonal mass"
        with_matrix = self.n_states <= self.max_matrix_states
        per_head = [acc.result(with_matrix) for acc in self.acc]
        if any(r is None for r in per_head):
            return None, free, "no labelled target states"
        best = max(range(self.heads), key=lambda h: per_head[h]["min"])
        res = dict(per_head[best])
        if self.heads > 1:
            res["head"] = best
            res["per_head"] = [{k: v for k, v in r.items() if k != "M_hat"} for r in per_head]
        return res, free, None


class WangStream:
    """VD, SS and IWS of a linear-attention TD model from its recorded context columns
    (`value` / `score`: the architecture's parameter names of P and Q)."""

    def __init__(self, params, layout, n_layers, pos, value: str = "P", score: str = "Q"):
        self.P = [np.asarray(layer_param(params, l, value), dtype=np.float64) for l in range(n_layers)]
        self.Q = [np.asarray(layer_param(params, l, score), dtype=np.float64) for l in range(n_layers)]
        self.layout, self.L, self.n = layout, n_layers, pos - 1
        self.sums = {"VD": 0.0, "SS": 0.0, "IWS": 0.0}
        self.count = 0
        self.residual = 0.0

    def paths(self) -> list[str]:
        return ["prompts/z", "reference/w", "tasks/phi", "tasks/stationary"] + [
            f"acts/blocks.{l}.hook_resid_post" for l in range(self.L)]

    def update(self, data: dict) -> None:
        ctx = [data["prompts/z"][:, : self.n]] + [
            data[f"acts/blocks.{l}.hook_resid_post"][:, : self.n].astype(np.float64) for l in range(self.L - 1)]
        w_tf = convergence.linear_td_query_weights(ctx, self.P, self.Q, self.layout)
        # the implicit weight must reproduce the recorded output at the real query
        phi_q = data["prompts/z"][:, -1, self.layout.slice("phi")]
        out = self.layout.readout(data[f"acts/blocks.{self.L - 1}.hook_resid_post"].astype(np.float64))[:, 0]
        self.residual = max(self.residual, float(np.max(np.abs((phi_q * w_tf).sum(-1) - out) / (1 + np.abs(out)))))
        w_td = data["reference/w"][:, self.L]
        phi, mu = data["tasks/phi"], data["tasks/stationary"]
        grad_tf = np.broadcast_to(w_tf[:, None, :], phi.shape)
        grad_td = np.broadcast_to(w_td[:, None, :], phi.shape)
        v_tf, v_td = np.einsum("bsd,bd->bs", phi, w_tf), np.einsum("bsd,bd->bs", phi, w_td)
        m = convergence.vd_ss_iws(v_tf, v_td, grad_tf, grad_td, phi, mu, w_td)
        for k in self.sums:
            ok = np.isfinite(m[k])
            self.sums[k] += float(m[k][ok].sum())
        self.count += phi.shape[0]

    def result(self, tol: float) -> tuple[dict | None, str | None]:
        if self.residual > tol:
            return None, (f"the model is not linear in the query (implicit weight misses the recorded output by "
                          f"{self.residual:.2g}); VD/SS/IWS need a linear-attention model")
        res = {k: v / self.count for k, v in self.sums.items()}
        res["query_map_residual"] = self.residual
        res["n_tasks"] = self.count
        return res, None
