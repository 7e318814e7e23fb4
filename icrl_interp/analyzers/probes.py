"""The TD-probe analyzer: a ridge probe of every recorded hook to the reference TD error at every
step (and to the reference value, where there is one per context column), with the baselines that
say whether the activations carry more than their input (`td_probe` holds the statistics).

`ProbeSet` is fed the analyzer's chunks (pass 1: fold statistics of every probe and of the input
baseline, which share their targets by context columns, `ColumnGroup`), then `finish` fits them and
scores the held-out prompts (kept from pass 1, or read once more where they outgrow
HELD_OUT_CACHE_BYTES live, FILE_HELD_OUT_CACHE_BYTES from a file) for the per-task sums the bootstrap
interval of the selectivity resamples. The registered analyzer 'probes' puts, per layer, every probe
(`td_probe`: {hook: probe}) and the headline probe's numbers (`td_probe_r2`, `td_probe_selectivity`,
...) of the task family's primary hook (`Hints.primary_probe`).
"""
from __future__ import annotations

import math

import numpy as np

from ..core import threads
from ..families.registry import Hints
from ..tasks.layouts import PromptLayout
from . import inputs, td_probe, weights
from .base import Analyzer, Chunk, Column, guard
from .keys import (LAYERS, TD_PROBE, TD_PROBE_HOOK, TD_PROBE_R2, TD_PROBE_SELECTIVITY, TD_PROBE_SELECTIVITY_CI,
                   any_layer, layers, num)
from .registry import register
from .streams import read_at, read_rows

DEFAULT_PRIMARY_PROBE = ("hook_resid_post",)
"""The headline TD probe of prompts of no known task (`Hints.primary_probe`'s default)."""


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


def as_slice(idx: np.ndarray):
    """Consecutive indices as a slice (indexing gives a view, not a copy); other indices as they are."""
    if idx.size and np.array_equal(idx, np.arange(idx[0], idx[0] + idx.size)):
        return slice(int(idx[0]), int(idx[0]) + idx.size)
    return idx


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
        self.take = as_slice(cols)
        self.acc = None if d_in is None else td_probe.ProbeAccumulator(d_in, n_targets, folds)
        self.fit = None
        self.sums = None
        self.block, self.y0 = None, None

    def update(self, data: dict, split: "ChunkSplit") -> list[tuple]:
        """Build the chunk's targets (real, then the partner's) once for every probe on these columns; the
        input baseline's (accumulator, features) to add (`ProbeSet.update`)."""
        self.block = td_probe.TargetBlock([split.Y[:, self.take], split.Ys[:, self.take]], split.grouping, self.y0)
        self.y0 = self.block.y0
        return [] if self.acc is None else [(self.acc, data["prompts/z"][:, self.take])]

    def start_scoring(self, n_tasks: int) -> None:
        self.fit = None if self.acc is None else self.acc.result()
        z = lambda w=self.T: np.zeros((n_tasks, w))  # noqa: E731
        self.sums = {"n": z(1), "n_prompts": z(1), "sy": z(), "syy": z(), "sys": z(), "syys": z(), "sse_input": z()}

    def score(self, data: dict, slot: np.ndarray, Y: np.ndarray, Ys: np.ndarray) -> None:
        y, ys = Y[:, self.take], Ys[:, self.take]
        s = self.sums
        np.add.at(s["n"], slot, float(self.cols.size))
        np.add.at(s["n_prompts"], slot, 1.0)
        for key, v in (("sy", y.sum(1)), ("syy", (y * y).sum(1)), ("sys", ys.sum(1)), ("syys", (ys * ys).sum(1))):
            np.add.at(s[key], slot, v)
        if self.fit is not None:
            X = data["prompts/z"][:, self.take]
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
            self.held_select = (slice(None), slice(self.q_last, self.q_last + 1), slice(None, n))
            """What scoring reads of a held-out prompt's pattern: the last query row's first n sources (the
            features), kept from pass 1 or read in pass 2 without the rest of the pattern."""
            self.cols = np.arange(n)
            self.src = np.arange(n)
            F = shape[1]
        else:
            p = inputs.positions(ds.attrs, shape, 1, pos, hook)
            keep = np.nonzero(p < n)[0]
            if keep.size == 0:
                raise ValueError("no context column is recorded")
            self.src, self.cols = as_slice(keep), p[keep]
            self.held_select = None  # scoring reads the whole rows
            F = int(np.prod(shape[2:]))
        self.take = as_slice(self.cols)
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

    def features(self, data: dict, path: str, held: bool = False) -> np.ndarray:
        """[B, columns, F] features of a chunk's rows (`held`: of held-out rows as scoring has them, the
        pattern's `held_select` only)."""
        act = data[path]
        if self.kind == "scores":
            return np.moveaxis(act[:, :, 0 if held else self.q_last, : self.n], 1, -1)  # [B, n, heads]
        X = act[:, self.src]
        return X.reshape(X.shape[0], X.shape[1], -1)

    def update(self, data: dict) -> list[tuple]:
        """(accumulator, features) of the probe and its random-init baseline to add (`ProbeSet.update`)."""
        out = [(self.acc, self.features(data, self.path))]
        return out + ([] if self.base is None else [(self.base, self.features(data, self.base_path))])

    def start_scoring(self, n_tasks: int) -> None:
        self.fits = {"model": self.acc.result(), "random_init": None if self.base is None else self.base.result()}
        self.sums = {k: np.zeros((n_tasks, self.T)) for k in ("sse", "sse_shuffled", "sse_random_init")}
        self.baselines = ["input"] * (self.group.fit is not None) + ["random_init"] * (self.base is not None) + ["shuffled"]
        self.ci = np.full((2, self.T), np.nan)

    def score(self, data: dict, slot: np.ndarray, Y: np.ndarray, Ys: np.ndarray) -> None:
        y, ys = Y[:, self.take], Ys[:, self.take]
        fit = self.fits["model"]
        sse = td_probe.residual_sums(self.features(data, self.path, held=True), [y, ys],
                                     fit["coef"], fit["intercept"])
        np.add.at(self.sums["sse"], slot, sse[:, : self.T])
        np.add.at(self.sums["sse_shuffled"], slot, sse[:, self.T :])
        if self.base is not None:
            fit = self.fits["random_init"]
            np.add.at(self.sums["sse_random_init"], slot,
                      td_probe.residual_sums(self.features(data, self.base_path, held=True), y, fit["coef"],
                                             fit["intercept"]))

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


GROUP_SUMS = ("n", "sy", "syy", "sys", "syys", "sse_input")
PROBE_SUMS = ("sse", "sse_shuffled", "sse_random_init")
"""The per-task sums `selectivity` reads: of a probe's column group, of the probe."""
STAND_IN = {"sse_input": "sy", "sse_random_init": "sse"}
"""A baseline's residual sums that an owner has not got (no input baseline, no random-init baseline; `unread`) are read
from this sum of the same width instead, so the bootstrap's product leaves their columns out: `selectivity` masks the
baselines a probe has not got, so the stand-in's values are never used."""


def unread(owner) -> set[str]:
    """The per-task sums of a column group or probe that `selectivity` does not use for it: the prompt counts (the
    JSON's per-task table only), and a baseline's residuals where there is no such baseline (zeros)."""
    if isinstance(owner, ColumnGroup):
        return {"n_prompts"} | ({"sse_input"} if owner.fit is None else set())
    return set() if owner.base is not None else {"sse_random_init"}


def selectivity(s: dict, has_input, has_random_init) -> np.ndarray:
    """R^2 - max(baselines) from summed residuals and target sums `s` (the keys of `ColumnGroup.sums` and
    `ProbeStream.sums`, arrays of any shape ending in targets: [resamples, probes, targets] in `_intervals`),
    per target; a baseline a probe has not got (`has_*` False, broadcast against the arrays) is left out."""
    real = (s["n"], s["sy"], s["syy"])
    base = np.stack([np.where(has_input, td_probe.r2_of_sums(s["sse_input"], *real), np.nan),
                     np.where(has_random_init, td_probe.r2_of_sums(s["sse_random_init"], *real), np.nan),
                     td_probe.r2_of_sums(s["sse_shuffled"], s["n"], s["sys"], s["syys"])], -2)
    return td_probe.r2_of_sums(s["sse"], *real) - td_probe.max_baseline(base)


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


HELD_OUT_CACHE_BYTES = 32 * 2**20
"""Held-out rows kept from pass 1 for scoring in a live analysis, at most (`ProbeSet`); beyond it they are read
again (the forward pass run again): it keeps the live analysis's peak memory within 1.2x from 1k to 100k prompts."""
FILE_HELD_OUT_CACHE_BYTES = 128 * 2**20
"""The same for a recording read from a file: one chunk's budget (`analyze.DEFAULT_CHUNK_MIB`), about what a chunk
of pass 2 would hold instead. The 1.19 GB recording of `benchmarks/bench_targets.py --only analyze` keeps 79 MiB of
held-out rows (2026-12-02), so it is read once, not a second time for its held-out prompts."""


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
    prompts, never the training ones. `finish` fits every probe, then scores the held-out prompts with
    the fitted coefficients for per-task residual sums, which sufficient statistics cannot give before
    the coefficients are known: the bootstrap interval of the selectivity resamples held-out tasks from
    them. Pass 1 keeps the held-out prompts' rows (the probes' features: of an attention pattern only the
    query row a probe reads, `ProbeStream.held_select`; targets, partners' targets) while they fit in
    HELD_OUT_CACHE_BYTES (live) or FILE_HELD_OUT_CACHE_BYTES (a file), so scoring reads nothing again (a live
    analysis runs no second forward pass); a larger held-out set is read once more instead (pass 2: only the
    probes' datasets, that same part of them, only those rows, and the partners' targets), so memory stays flat
    in the number of prompts. Both give the same sums from the same rows in the same order: bit for bit on the
    test recordings, within float64 rounding in general (an interval bound of the 1.19 GB benchmark recording
    differed by 2e-16, before the pattern's row selection too).
    """

    def __init__(self, f, N: int, pos: int, n: int, opts, live: bool = False):
        self.live = live
        """A live analysis (HELD_OUT_CACHE_BYTES of held-out rows kept), else a file (FILE_HELD_OUT_CACHE_BYTES)."""
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
        self.held: list[tuple] | None = []  # pass 1's copy of the held-out rows; None once over budget
        self.held_bytes = 0

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

    def update(self, chunk: Chunk) -> None:
        o, data = self.opts, chunk.data
        rows = np.arange(chunk.start, chunk.stop)
        split = ChunkSplit(self._task(data, rows), rows, self.targets.gather(data), self.chain, o.seed,
                           o.test_fraction, o.folds, self.fraction)
        held = split.keep & (split.fold == o.folds)
        if held.any():  # remembered for scoring: the held-out prompts and their partners
            self.test_rows.append(rows[held])
            self.test_mates.append(split.mate[held])
            self.test_tasks.append(np.unique(split.task[held]))
            self._keep_held(data, held, split, chunk.stop)
        adds = [(g, add) for g in self.groups.values() for add in g.update(data, split)]  # the groups' first:
        adds += [(p.group, add) for p in self.probes.values() for add in p.update(data)]  # they build the targets
        # the accumulators on the same columns with the same shape are added together (`td_probe.update_together`:
        # one call of the products for all of them; each gets the numbers it would get alone)
        together: dict[tuple, list] = {}
        for g, (acc, X) in adds:
            together.setdefault((id(g), acc.n_features, acc.n_targets), [g.block]).append((acc, X))
        for block, *items in together.values():
            td_probe.update_together([acc for acc, _ in items], [X for _, X in items], block)

    @property
    def feature_paths(self) -> list[str]:
        """What scoring reads besides the targets: the probes' (and baselines') activations, the prompts'
        own columns for the input baseline."""
        out = {x for p in self.probes.values() for x in (p.path, p.base_path) if x}
        out.update(("prompts/z",) if self.d_in is not None else ())
        return sorted(out)

    @property
    def held_select(self) -> dict:
        """{path: the part of its rows scoring reads} where that is less than the whole row
        (`ProbeStream.held_select`)."""
        return {x: p.held_select for p in self.probes.values() if p.held_select is not None
                for x in (p.path, p.base_path) if x}

    def _keep_held(self, data: dict, held: np.ndarray, split: "ChunkSplit", seen: int) -> None:
        """Copy the chunk's held-out rows for scoring (`finish`) while all of them will fit in
        HELD_OUT_CACHE_BYTES (live; FILE_HELD_OUT_CACHE_BYTES from a file): the bytes kept per prompt seen so far,
        times the recording's prompts (the split is a hash of the task ids, so the share held out is the same in
        every stretch). A recording that will
        not fit keeps nothing from its first chunk on, so its peak memory does not carry a cache to be dropped."""
        if self.held is None:
            return
        select = self.held_select
        part = {p: np.asarray(data[p][(held, *select.get(p, ()))]) for p in self.feature_paths}  # a copy already
        block = (part, split.task[held], split.Y[held], split.Ys[held])
        self.held_bytes += sum(a.nbytes for a in part.values()) + sum(a.nbytes for a in block[1:])
        budget = HELD_OUT_CACHE_BYTES if self.live else FILE_HELD_OUT_CACHE_BYTES
        if max(self.held_bytes, self.held_bytes * self.N / max(seen, 1)) > budget:
            self.held = None  # too many held-out prompts to keep: pass 2 reads them again
        else:
            self.held.append(block)

    def _held_blocks(self, rec, rows: int, test: np.ndarray, mates: np.ndarray):
        """(features, task ids, targets, partners' targets) of the held-out prompts, in row order: pass 1's
        copy, or (over budget) pass 2 over the recording, by chunks."""
        if self.held is not None:
            yield from self.held
            return
        for idx, data in read_rows(rec, self.paths, test, rows, self.held_select):
            # the partners' targets: earlier prompts, mostly within the same stretch of the file
            u, back = np.unique(mates[np.searchsorted(test, idx)], return_inverse=True)
            Ys = self.targets.gather(read_at(rec, self.targets.paths, u))[back.ravel()]
            yield data, self._task(data, idx), self.targets.gather(data), Ys

    def finish(self, rec, rows: int) -> None:
        """Fit every probe, then score the held-out prompts (their features and targets, and their
        partners' targets): per-task residual sums of every score."""
        test = np.concatenate(self.test_rows) if self.test_rows else np.zeros(0, dtype=np.int64)
        mates = np.concatenate(self.test_mates) if self.test_mates else np.zeros(0, dtype=np.int64)
        ids = np.unique(np.concatenate(self.test_tasks)) if self.test_tasks else np.zeros(0, dtype=np.int64)
        self.task_ids = ids
        for g in self.groups.values():
            g.start_scoring(ids.size)
        for p in self.probes.values():
            p.start_scoring(ids.size)
        owners = [*self.groups.values(), *self.probes.values()]  # each adds to its own sums only
        with threads.spread() as run:  # side by side: the reading is done, its core is free
            for data, task, Y, Ys in self._held_blocks(rec, rows, test, mates):
                slot = np.searchsorted(ids, task)
                run(lambda owner: owner.score(data, slot, Y, Ys), owners)  # a block's, then the next block's
        if ids.size >= td_probe.MIN_CI_TASKS:
            self._intervals()

    def _intervals(self) -> None:
        """Percentile bootstrap over held-out tasks of every probe's selectivity, per target: each
        resample recomputes every R^2 (probe and baselines, so also which baseline is the largest)
        from the resampled per-task sums. All sums sit side by side in one matrix, so one product
        per block of resamples serves every probe, and every probe's selectivity is computed at once
        ([resamples, probes, targets]: each probe's columns, and its group's, picked by index)."""
        owners = list(self.groups.values()) + list(self.probes.values())
        blocks, where, at = [], {}, 0
        for obj in owners:
            for name, arr in obj.sums.items():
                if name in unread(obj):  # no columns in the product (a third of them, without random-init baselines)
                    continue
                where[(id(obj), name)] = np.arange(at, at + arr.shape[1])
                at += arr.shape[1]
                blocks.append(arr)
        for obj in owners:
            for name in unread(obj) & STAND_IN.keys():
                where[(id(obj), name)] = where[(id(obj), STAND_IN[name])]
        M = np.concatenate(blocks, 1)
        probes = list(self.probes.values())
        T = probes[0].T
        idx = {name: np.stack([np.broadcast_to(where[(id(p.group), name)], T) for p in probes])  # "n": one column
               for name in GROUP_SUMS}
        idx.update({name: np.stack([where[(id(p), name)] for p in probes]) for name in PROBE_SUMS})
        has = (np.array([[p.group.fit is not None] for p in probes]), np.array([[p.base is not None] for p in probes]))
        samples = np.concatenate([selectivity({name: S[:, i] for name, i in idx.items()}, *has)
                                  for S in td_probe.resampled_sums(M, self.opts.seed)])
        ci = td_probe.percentile_interval(samples.reshape(len(samples), -1), td_probe.LEVEL).reshape(2, len(probes), T)
        for i, p in enumerate(probes):
            p.ci = ci[:, i]

    def result(self, layer: int, hook: str) -> dict:
        return self.probes[(layer, hook)].result(self.targets.names, self.task_ids, self.opts.per_task_max)


# ------------------------------------------------------------------ the analyzer
def primary_probe(order: tuple[str, ...], layer: int, probes: dict) -> str | None:
    """The hook whose R^2 is the contract's td_probe_r2: the first of `Hints.primary_probe` (hooks
    relative to blocks.{layer}, where the construction puts delta) that was probed."""
    for rel in order:
        h = f"blocks.{layer}.{rel}"
        if h in probes:
            return h
    return None


class Probes:
    """The analyzer's stream: the `ProbeSet` of a recording, and per layer its probes and headline."""

    def __init__(self, probes: ProbeSet, ctx):
        self.probes, self.reasons, self.n_layers = probes, ctx.reasons, ctx.n_layers
        self.primary = ctx.hints.primary_probe if ctx.hints is not None else DEFAULT_PRIMARY_PROBE

    @property
    def paths(self) -> list[str]:
        return self.probes.paths

    def update(self, chunk: Chunk) -> None:
        self.probes.update(chunk)

    def finish(self, rec, rows: int) -> None:
        """Score the held-out prompts only (kept from pass 1, or read again), for the per-task intervals."""
        self.probes.finish(rec, rows)

    def fields(self, layer: int) -> dict:
        """One layer's entries: every probe of the layer and the headline numbers of the primary hook."""
        layer_probes = guard(self.reasons, f"{TD_PROBE}.layer{layer}", lambda: {
            h: self.probes.result(layer, h) for (ll, h) in self.probes.probes if ll == layer}) or {}
        if not layer_probes:
            return {}
        hook = primary_probe(self.primary, layer, layer_probes)
        head = {} if hook is None else layer_probes[hook]
        # the headline: R^2 minus the largest baseline (input, random init, shuffled), with its interval
        return {TD_PROBE: layer_probes, TD_PROBE_HOOK: hook, TD_PROBE_R2: head.get("r2"),
                "td_probe_r2_shuffled": head.get("r2_shuffled"), TD_PROBE_SELECTIVITY: head.get("selectivity"),
                TD_PROBE_SELECTIVITY_CI: head.get("selectivity_ci"), "td_probe_baseline": head.get("max_baseline")}

    def finalize(self) -> dict:
        by_layer = {layer: self.fields(layer) for layer in range(self.n_layers)}
        return {LAYERS: {layer: f for layer, f in by_layer.items() if f}}


def open_probes(ctx):
    """A probe of every hook of every layer the reference has a TD error for."""
    facts, f = ctx.facts, ctx.f
    if not facts.has_ref:
        ctx.reasons[TD_PROBE] = "no /reference/td_errors in the recording"
        return None
    probes = ProbeSet(f, facts.N, facts.pos, facts.n, ctx.opts, live=ctx.kind == "live")
    if probes.targets.note:
        ctx.reasons[f"{TD_PROBE}.values"] = probes.targets.note
    direction = td_direction(ctx.hints, ctx.layout)
    steps = f["reference/td_errors"].shape[1]
    for l in range(ctx.n_layers):
        for h in sorted(x for x in facts.hooks if x.startswith(f"blocks.{l}.")):
            it = probe_iteration(h, l)
            if it >= steps:
                ctx.reasons[f"{TD_PROBE}.{h}"] = f"no reference TD error for iteration {it}"
                continue
            try:
                base = f.get(f"baseline/acts/{h}")  # the same hook at random initialization, when recorded
                p = probes.add(l, h, f[f"acts/{h}"], direction if h.endswith("hook_resid_post") else None, base)
                if p.base_note and "baseline" in f:
                    ctx.reasons[f"{TD_PROBE}.{h}.random_init"] = p.base_note
            except ValueError as e:
                ctx.reasons[f"{TD_PROBE}.{h}"] = str(e)
    return Probes(probes, ctx) if probes.probes else None


def selectivity_text(value, ci) -> str:
    """'+0.131 [+0.101, +0.173]' (the interval left out when the analysis has none)."""
    lo, hi = (ci if isinstance(ci, list) and len(ci) == 2 else [None, None])
    text = f"{num(value):+.3f}"
    return text + (f" [{num(lo):+.3f}, {num(hi):+.3f}]" if num(lo) is not None and num(hi) is not None else "")


def last_selectivity(analysis) -> str | None:
    """The last layer's headline selectivity with its interval, as text (None: no layer has one)."""
    sel = [x for x in layers(analysis) if num(x.get(TD_PROBE_SELECTIVITY)) is not None]
    return selectivity_text(sel[-1][TD_PROBE_SELECTIVITY], sel[-1].get(TD_PROBE_SELECTIVITY_CI)) if sel else None


register(Analyzer(
    name="probes", reason_key=TD_PROBE, open=open_probes, roles=("resid_pre", "resid_post", "pattern", "attn_out"),
    arrays=("reference/td_errors", "reference/values", "prompts/z", "prompts/task_id"), layer_keys=(TD_PROBE_R2,),
    summary="held-out ridge probes of every hook to the reference TD error, against the input, random-init and "
            "shuffled baselines",
    computed=lambda a: any_layer(a, TD_PROBE_R2, TD_PROBE),
    missing="not applicable: no hook to probe",
    columns=(Column(TD_PROBE_SELECTIVITY, "TD-probe selectivity [95% CI] (last layer)", last_selectivity, "{}",
                    "probe sel. [CI]", "probe sel.: TD-probe R² minus the largest of its input, random-init and "
                    "shuffled baselines, with its 95% interval over held-out tasks (last layer; ≈ 0: nothing beyond "
                    "the input)"),)))
