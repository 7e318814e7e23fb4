"""Per-chunk accumulators of the activation analyzers: each is fed the same chunk of prompts
and keeps only fixed-size statistics, so a recording of any length is analyzed in one pass.

`analyze._activations` decides which of them a recording supports and drives them. What each
stream reads comes from the registry: the task family's `Hints` (where the algorithm's output and
TD error sit in the prompt layout) and the model architecture's parameter names.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import UserError
from ..tasks.layouts import PromptLayout
from ..families.registry import Hints
from . import convergence, inputs, kernel, td_probe, td_step, weights


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


class ProbeTargets:
    """What every probe is regressed on, per context column c: the reference TD error delta_k at
    EVERY reference step k (`reference/td_errors[:, k, c]`), and the reference value v_k
    (`reference/values[:, k, c]`) where the recording has one value per position (softmax-td; a
    value of the query alone, as linear-td's, is not a per-column target)."""

    def __init__(self, f, n: int):
        self.n = n
        steps = int(f["reference/td_errors"].shape[1])
        self.parts = [("reference/td_errors", steps)]
        self.names = [f"td_error_{k}" for k in range(steps)]
        self.note = None
        if "reference/values" in f:
            v = f["reference/values"]
            if v.ndim == 3 and v.shape[2] >= n:
                self.parts.append(("reference/values", int(v.shape[1])))
                self.names += [f"value_{k}" for k in range(v.shape[1])]
            else:
                self.note = (f"reference/values has shape {tuple(v.shape[1:])} per prompt, not one value per context "
                             "column: only TD errors are probed")

    @property
    def paths(self) -> list[str]:
        return [p for p, _ in self.parts]

    def gather(self, data: dict) -> np.ndarray:
        """[B, n, T] targets of a chunk (every context column, every target)."""
        return np.concatenate([np.moveaxis(np.asarray(data[p][:, :, : self.n], dtype=np.float64), 1, -1)
                               for p, _ in self.parts], axis=-1)


class ColumnGroup:
    """What the probes reading the same context columns share: the input baseline (ridge from the
    prompt's own column, `prompts/z[:, c]`, to the same targets) and, on the held-out tasks, the
    per-task target sums (n, sum y, sum y^2 of the real and of the shuffled targets)."""

    def __init__(self, cols: np.ndarray, d_in: int | None, n_targets: int, folds: int):
        self.cols, self.T = cols, n_targets
        self.acc = None if d_in is None else td_probe.ProbeAccumulator(d_in, n_targets, folds)
        self.fit = None
        self.sums = None
        self.block, self.y0 = None, None

    def update(self, data: dict, split: "ChunkSplit") -> None:
        """Build the chunk's targets (real, then the partner's) once for every probe on these columns."""
        self.block = td_probe.TargetBlock([split.Y[:, self.cols], split.Ys[:, self.cols]], split.grouping, self.y0)
        self.y0 = self.block.y0
        if self.acc is not None:
            self.acc.update(data["prompts/z"][:, self.cols], self.block)

    def start_scoring(self, n_tasks: int) -> None:
        self.fit = None if self.acc is None else self.acc.result()
        z = lambda w=self.T: np.zeros((n_tasks, w))  # noqa: E731
        self.sums = {"n": z(1), "n_prompts": z(1), "sy": z(), "syy": z(), "sys": z(), "syys": z(), "sse_input": z()}

    def score(self, data: dict, slot: np.ndarray, ok: np.ndarray, Y: np.ndarray, Ys: np.ndarray) -> None:
        y, ys = Y[ok][:, self.cols], Ys[ok][:, self.cols]
        s = self.sums
        np.add.at(s["n"], slot, float(self.cols.size))
        np.add.at(s["n_prompts"], slot, 1.0)
        for key, v in (("sy", y.sum(1)), ("syy", (y * y).sum(1)), ("sys", ys.sum(1)), ("syys", (ys * ys).sum(1))):
            np.add.at(s[key], slot, v)
        if self.fit is not None:
            X = data["prompts/z"][ok][:, self.cols]
            np.add.at(s["sse_input"], slot, td_probe.residual_sums(X, y, self.fit["coef"], self.fit["intercept"]))


class ProbeStream:
    """One (layer, hook) TD probe fed from chunks: the model's activations, the same hook of the
    same architecture at random initialization (`baseline/acts/{hook}`, when recorded), both to
    every target of `ProbeTargets`, and the shuffled-label control."""

    def __init__(self, hook: str, layer: int, ds, pos: int, n: int, folds: int, direction,
                 n_targets: int = 1, baseline_ds=None):
        self.hook, self.layer, self.path = hook, layer, f"acts/{hook}"
        self.iteration = probe_iteration(hook, layer)
        self.direction, self.n, self.T = direction, n, n_targets
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
        self.acc = td_probe.ProbeAccumulator(F, 2 * n_targets, folds)  # targets, then the partner's
        self.base_path = None
        self.base = None
        self.base_note = "no baseline/acts recorded (record with --baseline random-init)"
        if baseline_ds is not None:
            if tuple(baseline_ds.shape[1:]) == tuple(shape[1:]):
                self.base_path = f"baseline/acts/{hook}"
                self.base = td_probe.ProbeAccumulator(F, n_targets, folds)
                self.base_note = None
            else:
                self.base_note = f"baseline/acts/{hook} has shape {baseline_ds.shape[1:]}, not {shape[1:]}"
        self.group: ColumnGroup | None = None  # set by ProbeSet
        self.fits = None
        self.sums = None

    def features(self, data: dict, path: str, rows=slice(None)) -> np.ndarray:
        act = data[path][rows]
        if self.kind == "scores":
            return np.moveaxis(act[:, :, self.q_last, : self.n], 1, -1)  # [B, n, heads]
        X = act[:, self.src]
        return X.reshape(X.shape[0], X.shape[1], -1)

    def update(self, data: dict, split: "ChunkSplit") -> None:
        self.acc.update(self.features(data, self.path), self.group.block)  # built by the group this chunk
        if self.base is not None:
            self.base.update(self.features(data, self.base_path), self.group.block)

    def start_scoring(self, n_tasks: int) -> None:
        self.fits = {"model": self.acc.result(), "random_init": None if self.base is None else self.base.result()}
        self.sums = {k: np.zeros((n_tasks, self.T)) for k in ("sse", "sse_shuffled", "sse_random_init")}
        self.baselines = ["input"] * (self.group.fit is not None) + ["random_init"] * (self.base is not None) + ["shuffled"]
        self.ci = np.full((2, self.T), np.nan)

    def selectivity(self, gs: dict, ps: dict) -> np.ndarray:
        """R^2 - max(baselines) from summed residuals (`ps`: this probe's; `gs`: its column group's
        target sums and input-baseline residuals), per target; leading axes are kept (resamples)."""
        real = (gs["n"], gs["sy"], gs["syy"])
        r2 = {"input": td_probe.r2_of_sums(gs["sse_input"], *real),
              "random_init": td_probe.r2_of_sums(ps["sse_random_init"], *real),
              "shuffled": td_probe.r2_of_sums(ps["sse_shuffled"], gs["n"], gs["sys"], gs["syys"])}
        base = np.stack([r2[b] for b in self.baselines], -2)
        return td_probe.r2_of_sums(ps["sse"], *real) - td_probe.max_baseline(base)

    def score(self, data: dict, slot: np.ndarray, ok: np.ndarray, Y: np.ndarray, Ys: np.ndarray) -> None:
        y, ys = Y[ok][:, self.cols], Ys[ok][:, self.cols]
        fit = self.fits["model"]
        sse = td_probe.residual_sums(self.features(data, self.path, ok), np.concatenate([y, ys], -1),
                                     fit["coef"], fit["intercept"])
        np.add.at(self.sums["sse"], slot, sse[:, : self.T])
        np.add.at(self.sums["sse_shuffled"], slot, sse[:, self.T :])
        if self.base is not None:
            fit = self.fits["random_init"]
            np.add.at(self.sums["sse_random_init"], slot,
                      td_probe.residual_sums(self.features(data, self.base_path, ok), y, fit["coef"], fit["intercept"]))

    def result(self, names: list[str], task_ids: np.ndarray, max_tasks: int) -> dict:
        """The probe's JSON entry: the headline numbers for the target the hook's layer matches
        (delta at `target_iteration`), every target in `targets`, per-task sums when few tasks."""
        T, fit, g = self.T, self.fits["model"], self.group
        nan = np.full(T, np.nan)
        r2 = {"r2": fit["r2"][:T], "r2_input": g.fit["r2"] if g.fit is not None else nan,
              "r2_random_init": self.fits["random_init"]["r2"] if self.base is not None else nan,
              "r2_shuffled": fit["r2"][T:]}
        base = np.stack([r2[f"r2_{b}"] for b in self.baselines])
        worst = td_probe.max_baseline(base)
        top = np.where(np.isnan(base), -np.inf, base).argmax(0)
        targets = {}
        for t, name in enumerate(names):
            row = {k: _num(v[t]) for k, v in r2.items()}
            row["selectivity"] = _num(r2["r2"][t] - worst[t])
            row["selectivity_ci"] = [_num(self.ci[0, t]), _num(self.ci[1, t])]
            row["max_baseline"] = self.baselines[top[t]] if np.isfinite(worst[t]) else None
            targets[name] = row
        main = self.iteration  # index of td_error_<iteration>: the targets start with every delta_k
        coef = fit["coef"][:, main]
        cos = None
        if self.direction is not None and self.kind == "columns" and coef.size == self.direction.size:
            cos = weights.cosine(coef, self.direction)
        out = {**targets[names[main]], "baselines": self.baselines, "alpha": float(fit["alpha"][main]),
               "target": names[main], "target_iteration": self.iteration, "direction_cosine": cos,
               "n_train": fit["n_train"], "n_test": fit["n_test"], "n_test_tasks": int(task_ids.size),
               "per_task": None, "targets": targets}
        if task_ids.size <= max_tasks:
            gs, s = g.sums, self.sums
            n, sy, syy = gs["n"][:, 0], gs["sy"][:, main], gs["syy"][:, main]
            sst = syy - sy * sy / np.maximum(n, 1)  # about the task's own mean
            out["per_task"] = {"task_id": task_ids.tolist(), "n_prompts": gs["n_prompts"][:, 0].astype(int).tolist(),
                               "n_samples": n.astype(int).tolist(), "sst": sst.tolist(),
                               "sse": s["sse"][:, main].tolist(),
                               "r2": [_num(1 - e / t) if t > 0 else None for e, t in zip(s["sse"][:, main], sst)],
                               "sse_input": gs["sse_input"][:, main].tolist() if g.fit is not None else None,
                               "sse_random_init": s["sse_random_init"][:, main].tolist() if self.base is not None else None}
        return out


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


class ChunkSplit:
    """Task folds of one chunk of prompts (by task id), which prompts the probes use (`fraction` of
    the tasks, whole tasks, by hash), the targets and each prompt's partner (its row and targets)
    for the shuffled control (`td_probe.PartnerChain`, carried from chunk to chunk)."""

    def __init__(self, task: np.ndarray, rows: np.ndarray, Y: np.ndarray, chain: td_probe.PartnerChain, seed: int,
                 test_fraction: float, folds: int, fraction: float = 1.0):
        self.task, self.Y = task, Y
        self.fold = td_probe.task_folds(task, seed, test_fraction, folds)
        self.use = td_probe.task_subset(task, seed, fraction)
        self.mate, self.Ys = chain.link(self.use, task, rows, Y)
        self.keep = self.use & (self.mate >= 0)  # the recording's first task has no partner: left out
        self.grouping = td_probe.fold_grouping(self.fold, self.keep, folds)  # sorted once for all probes


class ProbeSet:
    """Every TD probe of a recording, its baselines and the held-out evaluation.

    Pass 1 (`update`, fed the analyzer's chunks) accumulates the fold statistics and remembers the
    held-out (test-fold) prompts and their partners' rows: at most test_fraction x the probe tasks'
    prompts, never the training ones. `finish` fits every probe, then reads the held-out prompts once
    more (pass 2: only the probes' datasets, only those rows, and the partners' targets) to get
    per-task residual sums with the fitted coefficients, which sufficient statistics cannot give
    before the coefficients are known: the bootstrap interval of the selectivity resamples held-out
    tasks from them.
    """

    def __init__(self, f, N: int, pos: int, n: int, opts):
        self.targets = ProbeTargets(f, n)
        self.N, self.opts = N, opts
        self.has_ids = "prompts/task_id" in f
        self.d_in = int(f["prompts/z"].shape[-1]) if "prompts/z" in f else None
        self.pos, self.n = pos, n
        self.probes: dict[tuple[int, str], ProbeStream] = {}
        self.groups: dict[bytes, ColumnGroup] = {}
        self.chain = td_probe.PartnerChain()
        self.fraction = opts.probe_max_tasks / N if opts.probe_max_tasks > 0 else 1.0
        self.test_rows: list[np.ndarray] = []
        self.test_mates: list[np.ndarray] = []
        self.test_tasks: list[np.ndarray] = []
        self.task_ids = np.zeros(0, dtype=np.int64)

    def add(self, layer: int, hook: str, ds, direction, baseline_ds=None) -> ProbeStream:
        p = ProbeStream(hook, layer, ds, self.pos, self.n, self.opts.folds, direction, len(self.targets.names),
                        baseline_ds)
        key = np.asarray(p.cols).tobytes()
        if key not in self.groups:
            self.groups[key] = ColumnGroup(np.asarray(p.cols), self.d_in, len(self.targets.names), self.opts.folds)
        p.group = self.groups[key]
        self.probes[(layer, hook)] = p
        return p

    @property
    def paths(self) -> list[str]:
        out = set(self.targets.paths)
        out.update(("prompts/task_id",) if self.has_ids else ())
        out.update(("prompts/z",) if self.d_in is not None else ())
        for p in self.probes.values():
            out.update(x for x in (p.path, p.base_path) if x)
        return sorted(out)

    def _task(self, data: dict, rows: np.ndarray) -> np.ndarray:
        """Task ids of the prompts at global indices `rows` (the index itself without task ids)."""
        return np.asarray(data["prompts/task_id"], dtype=np.int64) if self.has_ids else rows

    def update(self, start: int, stop: int, data: dict) -> None:
        o = self.opts
        rows = np.arange(start, stop)
        split = ChunkSplit(self._task(data, rows), rows, self.targets.gather(data), self.chain, o.seed,
                           o.test_fraction, o.folds, self.fraction)
        held = split.keep & (split.fold == o.folds)
        if held.any():  # remembered for pass 2: the scored held-out prompts and their partners
            self.test_rows.append(rows[held])
            self.test_mates.append(split.mate[held])
            self.test_tasks.append(np.unique(split.task[held]))
        for g in self.groups.values():
            g.update(data, split)
        for p in self.probes.values():
            p.update(data, split)

    def finish(self, rec, rows: int) -> None:
        """Fit every probe, then pass 2 over the scored held-out prompts (their features and targets,
        and their partners' targets): per-task residual sums of every score."""
        test = np.concatenate(self.test_rows) if self.test_rows else np.zeros(0, dtype=np.int64)
        mates = np.concatenate(self.test_mates) if self.test_mates else np.zeros(0, dtype=np.int64)
        ids = np.unique(np.concatenate(self.test_tasks)) if self.test_tasks else np.zeros(0, dtype=np.int64)
        self.task_ids = ids
        for g in self.groups.values():
            g.start_scoring(ids.size)
        for p in self.probes.values():
            p.start_scoring(ids.size)
        for idx, data in read_rows(rec, self.paths, test, rows):
            # the partners' targets: earlier prompts, mostly within the same stretch of the file
            u, back = np.unique(mates[np.searchsorted(test, idx)], return_inverse=True)
            Ys = self.targets.gather(read_at(rec, self.targets.paths, u))[back.ravel()]
            ok = np.ones(idx.size, dtype=bool)
            slot = np.searchsorted(ids, self._task(data, idx))
            Y = self.targets.gather(data)
            for g in self.groups.values():
                g.score(data, slot, ok, Y, Ys)
            for p in self.probes.values():
                p.score(data, slot, ok, Y, Ys)
        if ids.size >= td_probe.MIN_CI_TASKS:
            self._intervals()

    def _intervals(self) -> None:
        """Percentile bootstrap over held-out tasks of every probe's selectivity, per target: each
        resample recomputes every R^2 (probe and baselines, so also which baseline is the largest)
        from the resampled per-task sums. All sums sit side by side in one matrix, so one product
        per block of resamples serves every probe."""
        owners = list(self.groups.values()) + list(self.probes.values())
        blocks, where, at = [], {}, 0
        for obj in owners:
            for name, arr in obj.sums.items():
                where[(id(obj), name)] = slice(at, at + arr.shape[1])
                at += arr.shape[1]
                blocks.append(arr)
        M = np.concatenate(blocks, 1)
        view = lambda S, obj: {name: S[:, where[(id(obj), name)]] for name in obj.sums}  # noqa: E731
        samples = {id(p): [] for p in self.probes.values()}
        for S in td_probe.resampled_sums(M, self.opts.seed):
            for p in self.probes.values():
                samples[id(p)].append(p.selectivity(view(S, p.group), view(S, p)))
        for p in self.probes.values():
            p.ci = td_probe.percentile_interval(np.concatenate(samples[id(p)]), td_probe.LEVEL)

    def result(self, layer: int, hook: str) -> dict:
        return self.probes[(layer, hook)].result(self.targets.names, self.task_ids, self.opts.per_task_max)


def read_rows(rec, paths: list[str], rows: np.ndarray, chunk: int):
    """(rows, {path: those rows}) for sorted prompt indices, by the analyzer's chunks of `chunk`
    prompts (so memory stays within its budget; bfloat16 decoded). A chunk holding a fair share of
    the rows (>= 1/16: the usual 25% held out) is read as one slice and subset, which HDF5 does much
    faster than a point selection; a sparse one (a small probed subset of a large file) by index."""
    which = rows // chunk
    for c in np.unique(which):
        idx = rows[which == c]
        yield idx, read_at(rec, paths, idx)


def read_at(rec, paths: list[str], idx: np.ndarray) -> dict:
    """{path: rows idx} (sorted, unique): one slice when they are dense (>= 1/16 of their span), else
    by index; bfloat16 decoded."""
    from ..recording.format import BF16, bf16_to_float32

    lo, hi = int(idx[0]), int(idx[-1]) + 1
    data = {}
    for p in paths:
        ds = rec.f[p]
        dtype = ds.attrs.get("dtype", "")
        raw = ds[lo:hi][idx - lo] if 16 * idx.size >= hi - lo else ds[idx]
        data[p] = bf16_to_float32(raw) if (dtype.decode() if isinstance(dtype, bytes) else str(dtype)) == BF16 else raw
    return data


TASK_KEY = "_task_id"
"""Key of a chunk's task ids in the data dict the analyzer feeds the streams (`prompts/task_id`, else
the prompt index)."""


class PerTask:
    """Per-task means of per-prompt metrics, keyed by task id (prompts with equal id are one task),
    kept while at most `limit` distinct tasks have been seen; past that only the fact is kept, so
    memory stays bounded (`result` is then None)."""

    def __init__(self, names: tuple[str, ...] | list[str], limit: int):
        self.names, self.limit = tuple(names), int(limit)
        self.ids = np.zeros(0, dtype=np.int64)
        self.count = np.zeros(0)
        self.sum = {k: np.zeros(0) for k in self.names}
        self.n = {k: np.zeros(0) for k in self.names}
        self.over = self.limit <= 0

    def update(self, task: np.ndarray, **values: np.ndarray) -> None:
        if self.over:
            return
        task = np.asarray(task, dtype=np.int64)
        ids = np.union1d(self.ids, task)
        if ids.size > self.limit:
            self.over = True
            self.ids, self.count, self.sum, self.n = np.zeros(0, dtype=np.int64), np.zeros(0), {}, {}
            return
        if ids.size != self.ids.size:  # new tasks: widen the tables
            at = np.searchsorted(ids, self.ids)
            grow = lambda a: np.bincount(at, weights=a, minlength=ids.size) if a.size else np.zeros(ids.size)  # noqa: E731
            self.count = grow(self.count)
            self.sum = {k: grow(v) for k, v in self.sum.items()}
            self.n = {k: grow(v) for k, v in self.n.items()}
            self.ids = ids
        slot = np.searchsorted(self.ids, task)
        np.add.at(self.count, slot, 1.0)
        for k, v in values.items():
            v = np.asarray(v, dtype=np.float64)
            ok = np.isfinite(v)
            np.add.at(self.sum[k], slot[ok], v[ok])
            np.add.at(self.n[k], slot[ok], 1.0)

    def result(self) -> dict | None:
        """{"task_id": [...], "n_prompts": [...], name: [per-task mean or None], ...} sorted by task id;
        None past the limit."""
        if self.over:
            return None
        out = {"task_id": self.ids.tolist(), "n_prompts": self.count.astype(np.int64).tolist()}
        for k in self.names:
            with np.errstate(invalid="ignore", divide="ignore"):
                m = self.sum[k] / self.n[k]
            out[k] = [float(x) if math.isfinite(x) else None for x in m]
        return out


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
        self.per_task = PerTask(("value_error", "reference_value_error"), per_task_max)
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
        err = ref_err = None  # per prompt, for the per-task values
        if self.mode == "positions":
            v_pos = z[:, :, self.layout.slice(self.hints.value_block).start].astype(np.float64)
            if self.has_ref:
                ref = data["reference/values"][:, self.layer + 1][:, self.p]
                self.gap = max(self.gap, float(np.max(np.abs(v_pos - ref), initial=0.0)))
            if self.has_tasks:
                states = data["prompts/state"][:, self.p]
                v_true, mu = data["tasks/values"], data["tasks/stationary"]
                S = v_true.shape[-1]
                err, rms = convergence.value_errors(convergence.state_values(v_pos, states, S), v_true, mu)
                self._add("err", err, rms)
                if self.has_ref:
                    ref_err, rms = convergence.value_errors(convergence.state_values(ref, states, S), v_true, mu)
                    self._add("ref_err", ref_err, rms)
        elif self.mode == "query":
            v = self.layout.readout(z)[:, 0].astype(np.float64)
            if self.has_ref:
                ref = data["reference/values"][:, self.layer + 1, 0]
                self.gap = max(self.gap, float(np.max(np.abs(v - ref), initial=0.0)))
            if self.has_tasks:
                q = data["prompts/state"][:, -1]
                v_true = np.where(q >= 0, np.take_along_axis(data["tasks/values"], np.maximum(q, 0)[:, None], 1)[:, 0], np.nan)
                err = np.abs(v - v_true)
                self._add("err", err, err ** 2)  # value_rms = sqrt(mean err^2), a root mean square
                if self.has_ref:
                    ref_err = np.abs(ref - v_true)
                    self._add("ref_err", ref_err, ref_err ** 2)
        else:  # the updated parameters in the last column against the teacher's update
            teacher = data["reference/output"]
            out = self._output_columns(z[:, -1].astype(np.float64))
            if out.shape[-1] != teacher.shape[-1]:
                raise UserError(f"reference output has width {teacher.shape[-1]}, the output blocks "
                                f"{', '.join(self.hints.output_blocks)} {out.shape[-1]}")
            err, rel = convergence.teacher_distance(out, teacher)
            self._add("err", err)
            self._add("rel", rel)
            self.gap = max(self.gap, float(np.max(err, initial=0.0)))
        if err is not None and TASK_KEY in data:
            nan = np.full(err.shape, np.nan)
            self.per_task.update(data[TASK_KEY], value_error=err, reference_value_error=nan if ref_err is None else ref_err)

    def result(self) -> dict:
        n, nr = self.count["err"], self.count["ref_err"]
        out = {"value_error": mean_or_none(self.sum["err"], n)}
        per_task = self.per_task.result() if n else None
        if self.mode == "parameters":
            out["teacher_rel_err"] = mean_or_none(self.sum["rel"], self.count["rel"])
            out["reference_gap"] = self.gap
            if per_task is not None:
                del per_task["reference_value_error"]
            out["value_error_per_task"] = per_task
            return out
        rms = self.sum["rms"] / n if n else None
        out.update({"value_rms": math.sqrt(rms) if (self.mode == "query" and rms is not None) else rms,
                    "reference_value_error": mean_or_none(self.sum["ref_err"], nr),
                    "reference_gap": self.gap if self.has_ref else None,
                    "value_error_per_task": per_task})
        return out


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
        self.heads = shape[1]
        self.acc = [kernel.DiagonalityAccumulator(gamma, n_states) for _ in range(self.heads)] if use_labels else None
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
                if TASK_KEY in data and not self.per_task[h].over:
                    mean, mins = kernel.task_diagonals(res["M"][:, h])
                    self.per_task[h].update(data[TASK_KEY], mean=mean, min=mins)
        self.self_sum += float(kernel.self_mass(pat, self.q, self.k).sum())
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


class WangStream:
    """VD, SS and IWS of a linear-attention TD model from its recorded context columns
    (`value` / `score`: the architecture's parameter names of P and Q), against L-step batch TD on each
    prompt's own transitions at the step of `td_step` (fitted on the calibration half of the tasks, or
    `alpha` when given; C: TD's preconditioner, identity when None)."""

    def __init__(self, params, layout, n_layers, pos, value: str = "P", score: str = "Q", per_task_max: int = 0,
                 alpha: float | None = None, C=None):
        self.per_task_max = per_task_max
        self.P = [np.asarray(layer_param(params, l, value), dtype=np.float64) for l in range(n_layers)]
        self.Q = [np.asarray(layer_param(params, l, score), dtype=np.float64) for l in range(n_layers)]
        self.layout, self.L, self.n, self.C = layout, n_layers, pos - 1, C
        self.evaluation = td_step.WangEvaluation(n_layers, alpha)
        self.residual = 0.0

    def paths(self) -> list[str]:
        return ["prompts/z", "tasks/phi", "tasks/stationary"] + [
            f"acts/blocks.{l}.hook_resid_post" for l in range(self.L)]

    def update(self, data: dict) -> None:
        z = data["prompts/z"]
        ctx = [z[:, : self.n]] + [
            data[f"acts/blocks.{l}.hook_resid_post"][:, : self.n].astype(np.float64) for l in range(self.L - 1)]
        w_tf = convergence.linear_td_query_weights(ctx, self.P, self.Q, self.layout)
        # the implicit weight must reproduce the recorded output at the real query
        phi_q = z[:, -1, self.layout.slice("phi")]
        out = self.layout.readout(data[f"acts/blocks.{self.L - 1}.hook_resid_post"].astype(np.float64))[:, 0]
        self.residual = max(self.residual, float(np.max(np.abs((phi_q * w_tf).sum(-1) - out) / (1 + np.abs(out)))))
        lay = self.layout
        coef = td_step.td_weight_polynomial(z[:, : self.n, lay.slice("phi")], z[:, : self.n, lay.slice("gamma_phi_next")],
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
