"""Readouts: the value error, and its convergence with depth, of a model whose residual stream is
NOT in the prompt layout (a foreign model: its own embedding inside, a residual width of its own),
read through two lenses.

* ``model-readout`` (the logit lens): the model's own readout (probe-spec role ``readout``) applied
  by the recorder to layer l's residual stream at the last position, ``lens/{l}`` [N, k];
* ``tuned-linear`` (a tuned lens): a ridge map per layer from ``blocks.{l}.hook_resid_post`` at the
  last position to the model's own final output ``outputs/model`` [N, k], fitted on training tasks
  and scored on held-out tasks. The split hashes the task id (``prompts/task_id``; the prompt index
  where the recording has none), so it does not depend on the chunking, and no task is on both
  sides. The penalty is chosen by generalized cross-validation from streamed sufficient statistics
  (one Gram matrix per layer), so the fit is one pass; scoring the held-out tasks is a second pass
  that reads only the last position of those prompts.

Each lens's prediction y_l [N, k] is scored like the model's output (`Target`, by the task family's
``Hints.output``): 'query' / 'positions' tasks (linear-td, softmax-td) compare it with the true value
of the query state, |y_l − v_π(s_q)| (``tasks/values``, ``prompts/state[:, -1]``); 'parameters' tasks
(sarsa, actor-critic) and prompts of no known task with the reference algorithm's output,
‖y_l − reference/output‖₂. Beside each lens's curve: the model's own output scored the same way, the
REFERENCE CURVE (the reference algorithm's error after k steps: ``reference/values[:, k, -1]``, or for
'parameters' tasks the prompt's parameters at step 0 and ``reference/output`` at step 1), and the same
lens on the same architecture at random initialization (``baseline/lens/{l}``, ``baseline/acts/...``,
``baseline/outputs/model``) when the recording has it. Layer l is compared with reference step l + 1
(the residual stream after l + 1 updates), as `value_error` does for the package's own models.
"""
from __future__ import annotations

import numpy as np

from . import convergence, inputs
from .base import Analyzer, Chunk, failure
from .keys import READOUTS, REFERENCE_VALUE_ERROR, RANDOM_INIT_VALUE_ERROR, VALUE_ERROR
from .registry import register
from .streams import TASK_KEY, PerTask, dtype_attr, mean_or_none
from .td_probe import splitmix64

LENSES = {
    "model-readout": ("the model's own readout applied to layer l's residual stream at the last position "
                      "(lens/{l}: the logit lens), on every prompt"),
    "tuned-linear": ("a ridge map per layer from hook_resid_post at the last position to the model's own output "
                     "(outputs/model), fitted on training tasks and scored on held-out tasks (a tuned lens)"),
}
"""The lenses, with the one-line description the JSON carries."""
RANDOM_INIT = "baseline/"
"""Prefix of the same architecture at random initialization in a recording."""
ALPHA_GRID = np.logspace(-10, 2, 13)
"""Ridge penalties tried (GCV), relative to the mean feature variance times the sample count."""
SPLIT_SALT = 0x7E11
"""Mixed into the seed of the tuned lens's task split."""


# ------------------------------------------------------------------ what a readout is scored against
class Target:
    """How a prediction y [B, k] of the model's output is scored (per prompt; NaN where it cannot be)."""

    def __init__(self, kind: str, width: int):
        self.kind, self.width = kind, width
        if kind == "value":
            self.paths = ["tasks/values", "prompts/state"]
            self.description = "|y − v_π(s_q)|: the value read out against the true value of the query state"
        else:
            self.paths = ["reference/output"]
            self.description = "‖y − reference/output‖₂: the output read out against the reference algorithm's output"

    def errors(self, y: np.ndarray, data: dict) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64).reshape(y.shape[0], -1)
        if self.kind == "value":
            q = np.asarray(data["prompts/state"][:, -1])
            v = np.take_along_axis(np.asarray(data["tasks/values"], dtype=np.float64), np.maximum(q, 0)[:, None], 1)[:, 0]
            return np.where(q >= 0, np.abs(y[:, 0] - v), np.nan)
        return np.linalg.norm(y - np.asarray(data["reference/output"], dtype=np.float64), axis=-1)


def target_for(f, hints, width: int) -> tuple[Target | None, str | None]:
    """The target of a k-wide output on this recording's task, or (None, why not)."""
    if hints is not None and hints.output in ("query", "positions"):
        if width != 1:
            return None, f"the model's output has width {width}, the task's output is one value"
        if "tasks/values" not in f or "prompts/state" not in f:
            return None, "no task data (tasks/values): the true values are unknown"
        return Target("value", width), None
    if "reference/output" not in f:
        return None, "no reference/output to compare the model's output with"
    if f["reference/output"].shape[1:] != (width,):
        return None, f"reference/output has shape {f['reference/output'].shape[1:]}, the model's output width {width}"
    return Target("teacher", width), None


class Reference:
    """The reference algorithm's prediction of the output after each of its steps."""

    def __init__(self, f, target: Target, hints, layout):
        self.steps: list = []  # per step: ('values', k) or ('params', None) or ('output', None)
        self.paths: list[str] = []
        if target.kind == "value" and "reference/values" in f and f["reference/values"].ndim == 3:
            self.steps = [("values", k) for k in range(f["reference/values"].shape[1])]
            self.paths = ["reference/values"]
        elif target.kind == "teacher" and "reference/output" in f:
            blocks = tuple(hints.output_blocks) if hints is not None else ()
            if layout is not None and blocks and "prompts/z" in f and f["prompts/z"].shape[-1] == layout.d_model \
                    and sum(layout.size(b) for b in blocks) == target.width:
                self.blocks, self.layout = blocks, layout
                self.steps = [("params", None), ("output", None)]
                self.paths = ["prompts/z", "reference/output"]

    def predict(self, step: int, data: dict) -> np.ndarray:
        what, k = self.steps[step]
        if what == "values":
            return np.asarray(data["reference/values"][:, k, -1:], dtype=np.float64)
        if what == "params":  # the prompt's own parameters: the algorithm before its update
            z = np.asarray(data["prompts/z"][:, -1], dtype=np.float64)
            return np.concatenate([z[:, self.layout.slice(b)] for b in self.blocks], axis=-1)
        return np.asarray(data["reference/output"], dtype=np.float64)


# ------------------------------------------------------------------ scores
class Score:
    """Streamed score of one prediction: mean error against the target, mean distance to the model's
    own output, pooled R² against that output, and per-task mean errors."""

    def __init__(self, per_task_max: int, width: int):
        self.err = self.gap = 0.0
        self.n_err = self.n_gap = 0
        self.sse = 0.0
        self.sy, self.syy = np.zeros(width), np.zeros(width)
        self.n = 0
        self.per_task = PerTask((VALUE_ERROR,), per_task_max)

    def update(self, err: np.ndarray, task: np.ndarray, y: np.ndarray | None = None, out: np.ndarray | None = None):
        ok = np.isfinite(err)
        self.err += float(err[ok].sum())
        self.n_err += int(ok.sum())
        self.per_task.update(task, value_error=err)
        if y is not None and out is not None:
            d = np.asarray(y, dtype=np.float64).reshape(out.shape) - out
            self.gap += float(np.linalg.norm(d, axis=-1).sum())
            self.n_gap += d.shape[0]
            self.sse += float((d * d).sum())
            self.sy += out.sum(0)
            self.syy += (out * out).sum(0)
            self.n += out.shape[0]

    @property
    def value_error(self) -> float | None:
        return mean_or_none(self.err, self.n_err)

    def r2(self) -> float | None:
        if self.n < 2:
            return None
        sst = float((self.syy - self.sy**2 / self.n).sum())
        return 1.0 - self.sse / sst if sst > 0 else None

    def entry(self, with_r2: bool = False) -> dict:
        out = {VALUE_ERROR: self.value_error, "output_gap": mean_or_none(self.gap, self.n_gap)}
        if with_r2:
            out["r2"] = self.r2()
        return out


# ------------------------------------------------------------------ ridge from sufficient statistics
class Ridge:
    """Multi-target ridge with intercept from the Gram matrix of Z = [X − x0, Y − y0, 1] (x0, y0: the
    first samples' means, a fixed shift for numerical stability); the penalty is the one of
    ALPHA_GRID (× mean feature variance × samples) with the least generalized cross-validation error
    n·RSS / (n − df)², summed over targets (the smallest among ties)."""

    def __init__(self, n_features: int, n_targets: int):
        self.F, self.T = n_features, n_targets
        self.G = np.zeros((self.F + self.T + 1,) * 2)
        self.x0 = self.y0 = None

    def update(self, X: np.ndarray, Y: np.ndarray) -> None:
        if X.shape[0] == 0:
            return
        X, Y = np.asarray(X, dtype=np.float64), np.asarray(Y, dtype=np.float64)
        if self.x0 is None:
            self.x0, self.y0 = X.mean(0), Y.mean(0)
        Z = np.empty((X.shape[0], self.F + self.T + 1))
        Z[:, : self.F] = X - self.x0
        Z[:, self.F : -1] = Y - self.y0
        Z[:, -1] = 1.0
        self.G += Z.T @ Z

    @property
    def n(self) -> int:
        return int(round(self.G[-1, -1]))

    def solve(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(coef [F, T], intercept [T], penalty) in the original coordinates."""
        F, G, n = self.F, self.G, self.G[-1, -1]
        if n < 2:
            raise ValueError("fewer than 2 training prompts")
        mx, my = G[:F, -1] / n, G[F:-1, -1] / n
        cxx = G[:F, :F] - n * np.outer(mx, mx)
        cxy = G[:F, F:-1] - n * np.outer(mx, my)
        cyy = np.diag(G[F:-1, F:-1]) - n * my * my
        lam, U = np.linalg.eigh(cxx)
        lam = np.maximum(lam, 0.0)
        P = U.T @ cxy
        alphas = max(float(np.trace(cxx)) / F, 1e-300) * ALPHA_GRID
        gcv = np.full(len(alphas), np.inf)
        for i, a in enumerate(alphas):
            rss = np.maximum(cyy - ((P * P) * (2 / (lam + a) - lam / (lam + a) ** 2)[:, None]).sum(0), 0.0)
            df = float((lam / (lam + a)).sum()) + 1.0  # + the intercept
            if n - df > 0.5:
                gcv[i] = n * float(rss.sum()) / (n - df) ** 2
        if not np.isfinite(gcv).any():
            best = len(alphas) - 1
        else:  # the smallest penalty within rounding of the best (an exact fit: all ~0)
            best = int(np.nonzero(gcv <= gcv.min() + 1e-12 * max(float(cyy.sum()), 1e-300) / n)[0][0])
        coef = U @ (P / (lam + alphas[best])[:, None])
        intercept = (my + self.y0) - (mx + self.x0) @ coef
        return coef, intercept, float(alphas[best])


# ------------------------------------------------------------------ the split
def held_out(task: np.ndarray, seed: int, test_fraction: float) -> np.ndarray:
    """Whether each prompt's task is held out: a pure function of (task id, seed), so every prompt of
    a task falls on the same side, whatever the chunking or the order of the prompts."""
    key = splitmix64(np.array([int(seed) + SPLIT_SALT]))[0]
    u = (splitmix64(np.asarray(task).astype(np.uint64) ^ key) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return u < test_fraction


def _decode(ds, raw: np.ndarray) -> np.ndarray:
    from ..recording.format import BF16, bf16_to_float32

    return bf16_to_float32(raw) if dtype_attr(ds) == BF16 else raw


# ------------------------------------------------------------------ the lenses
class Readouts:
    """Every readout of one recording: fed the analyzer's chunks (`update`), then `finish` (the tuned
    lens's held-out pass), then `result` (the JSON of `activations.readouts`)."""

    def __init__(self, f, hints, layout, pos: int, seed: int, test_fraction: float, per_task_max: int,
                 reasons: dict):
        self.f, self.reasons = f, reasons
        self.seed, self.test_fraction, self.per_task_max = seed, test_fraction, per_task_max
        self.has_ids = "prompts/task_id" in f
        widths = {f[p].shape[1] for p in self._output_paths(f) if f[p].ndim == 2}
        self.target = self.reference = None
        self.ok = False
        if not widths:
            return
        if len(widths) > 1:
            reasons[READOUTS] = f"outputs/model and lens/* disagree on the output width ({sorted(widths)})"
            return
        self.width = widths.pop()
        self.target, why = target_for(f, hints, self.width)
        if self.target is None:
            reasons[READOUTS] = why
            return
        self.reference = Reference(f, self.target, hints, layout)
        self.ok = True
        self.logit = {pre: self._lens_layers(f, pre) for pre in ("", RANDOM_INIT)}
        if not self.logit[""]:
            reasons["readouts.model-readout"] = ("no lens/{l} recorded (the model has no readout role; give its output "
                                                 "modules as role 'readout' in the probe spec)")
        self.tuned = {pre: self._tuned_layers(f, pre, pos) for pre in ("", RANDOM_INIT)}
        if "outputs/model" not in f:
            reasons["readouts.tuned-linear"] = "no outputs/model recorded (the tuned lens is fitted to the model's output)"
            self.tuned = {"": {}, RANDOM_INIT: {}}
        elif not self.tuned[""]:
            reasons["readouts.tuned-linear"] = "no blocks.{l}.hook_resid_post with the last position recorded"
        if RANDOM_INIT + "outputs/model" not in f:
            self.tuned[RANDOM_INIT] = {}
        self.scores = {("logit", pre, l): Score(per_task_max, self.width) for pre, ls in self.logit.items() for l in ls}
        for pre in ("", RANDOM_INIT):
            self.scores[("logit", pre, "output")] = Score(per_task_max, self.width)
        for k in range(len(self.reference.steps)):
            self.scores[("logit", "", ("reference", k))] = Score(0, self.width)
        self.fits = {(pre, l): Ridge(F, self.width) for pre, ls in self.tuned.items() for l, (_, _, F) in ls.items()}
        self.solved: dict = {}
        self.n_prompts = self.n_train = self.n_test = self.n_test_tasks = 0

    # -------------------------------------------------------------- what is there
    @staticmethod
    def _output_paths(f) -> list[str]:
        out = [p for p in ("outputs/model",) if p in f]
        if "lens" in f:
            out += [f"lens/{k}" for k in f["lens"]]
        return out

    @staticmethod
    def _lens_layers(f, prefix: str) -> list[int]:
        group = f.get(prefix + "lens")
        return sorted(int(k) for k in group if k.isdigit()) if group is not None else []

    def _tuned_layers(self, f, prefix: str, pos: int) -> dict[int, tuple[str, int, int]]:
        """layer -> (dataset path, index of the last position, features) of the recorded residual streams."""
        group = f.get(prefix + "acts")
        out = {}
        if group is None:
            return out
        for name in group:
            parts = name.split(".")
            if len(parts) != 3 or parts[0] != "blocks" or not parts[1].isdigit() or parts[2] != "hook_resid_post":
                continue
            ds = group[name]
            if ds.ndim < 3:
                continue
            p = inputs.positions(ds.attrs, ds.shape, 1, pos, name)
            if pos - 1 not in p:
                if not prefix:
                    self.reasons[f"readouts.tuned-linear.layer{parts[1]}"] = f"{name}: the last position is not recorded"
                continue
            out[int(parts[1])] = (f"{prefix}acts/{name}", int(np.nonzero(p == pos - 1)[0][0]), int(np.prod(ds.shape[2:])))
        return dict(sorted(out.items()))

    @property
    def paths(self) -> list[str]:
        if not self.ok:
            return []
        out = set(self.target.paths) | set(self.reference.paths)
        out.update(p for p in ("outputs/model", RANDOM_INIT + "outputs/model", "prompts/task_id") if p in self.f)
        out.update(f"{pre}lens/{l}" for pre, ls in self.logit.items() for l in ls)
        out.update(path for ls in self.tuned.values() for path, _, _ in ls.values())
        return sorted(out)

    def _task(self, data: dict, start: int, stop: int) -> np.ndarray:
        return np.asarray(data[TASK_KEY] if TASK_KEY in data else
                          data["prompts/task_id"] if self.has_ids else np.arange(start, stop), dtype=np.int64)

    # -------------------------------------------------------------- pass 1
    def update(self, chunk: Chunk) -> None:
        """Score the logit lens and the reference on every prompt; add the training prompts to the fits."""
        if not self.ok:
            return
        data = chunk.data
        task = self._task(data, chunk.start, chunk.stop)
        self.n_prompts += task.size
        outs = {pre: np.asarray(data[pre + "outputs/model"], dtype=np.float64)
                for pre in ("", RANDOM_INIT) if pre + "outputs/model" in data}
        for pre in ("", RANDOM_INIT):
            if pre in outs:
                self.scores[("logit", pre, "output")].update(self.target.errors(outs[pre], data), task)
            for l in self.logit[pre]:
                y = np.asarray(data[f"{pre}lens/{l}"], dtype=np.float64)
                self.scores[("logit", pre, l)].update(self.target.errors(y, data), task, y, outs.get(pre))
        for k in range(len(self.reference.steps)):
            self.scores[("logit", "", ("reference", k))].update(self.target.errors(self.reference.predict(k, data), data), task)
        if self.fits:
            train = ~held_out(task, self.seed, self.test_fraction)
            for (pre, l), fit in self.fits.items():
                path, last, F = self.tuned[pre][l]
                fit.update(np.asarray(data[path][train, last], dtype=np.float64).reshape(-1, F), outs[pre][train])

    # -------------------------------------------------------------- pass 2
    def finish(self, rec, rows: int) -> None:
        """Pass 2, the tuned lens on held-out tasks: a failure there keeps the logit lens."""
        try:
            self._tuned(rec, rows)
        except Exception as e:  # noqa: BLE001
            self.reasons["readouts.tuned-linear"] = failure(e)
            self.solved = {}

    def _tuned(self, rec, rows: int) -> None:
        """Solve the tuned lenses, then score them on the held-out tasks (only their last positions are read)."""
        if not self.ok or not self.fits:
            return
        self.n_train = max((fit.n for (pre, _), fit in self.fits.items() if not pre), default=0)
        for key, fit in list(self.fits.items()):
            try:
                self.solved[key] = fit.solve()
            except (ValueError, np.linalg.LinAlgError) as e:
                self.reasons[f"readouts.tuned-linear.{'random_init.' if key[0] else ''}layer{key[1]}"] = \
                    f"cannot fit: {e} (record more tasks)"
        self.fits = {}  # the Gram matrices are no longer needed
        if not self.solved:
            return
        for pre in ("", RANDOM_INIT):
            self.scores[("tuned", pre, "output")] = Score(self.per_task_max, self.width)
        for pre, l in self.solved:
            self.scores[("tuned", pre, l)] = Score(self.per_task_max, self.width)
        for k in range(len(self.reference.steps)):
            self.scores[("tuned", "", ("reference", k))] = Score(0, self.width)
        small = sorted((set(self.target.paths) | set(self.reference.paths)
                        | {p for p in ("outputs/model", RANDOM_INIT + "outputs/model", "prompts/task_id") if p in self.f}))
        acts = sorted({self.tuned[pre][l][:2] for pre, l in self.solved})
        test_tasks: set = set()
        f, N = rec.f, rec.n_prompts
        for start in range(0, N, max(rows, 2)):
            stop = min(start + max(rows, 2), N)
            ids = np.asarray(f["prompts/task_id"][start:stop], dtype=np.int64) if self.has_ids else np.arange(start, stop)
            keep = held_out(ids, self.seed, self.test_fraction)
            if not keep.any():
                continue
            data = {p: _decode(f[p], f[p][start:stop])[keep] for p in small}
            for path, last in acts:
                data[path] = _decode(f[path], f[path][start:stop, last])[keep]
            task = ids[keep]
            self.n_test += int(keep.sum())
            test_tasks.update(np.unique(task).tolist())
            outs = {pre: np.asarray(data[pre + "outputs/model"], dtype=np.float64)
                    for pre in ("", RANDOM_INIT) if pre + "outputs/model" in data}
            for pre, out in outs.items():
                self.scores[("tuned", pre, "output")].update(self.target.errors(out, data), task)
            for (pre, l), (coef, intercept, _) in self.solved.items():
                path, _, F = self.tuned[pre][l]
                y = np.asarray(data[path], dtype=np.float64).reshape(-1, F) @ coef + intercept
                self.scores[("tuned", pre, l)].update(self.target.errors(y, data), task, y, outs[pre])
            for k in range(len(self.reference.steps)):
                self.scores[("tuned", "", ("reference", k))].update(
                    self.target.errors(self.reference.predict(k, data), data), task)
        self.n_test_tasks = len(test_tasks)

    # -------------------------------------------------------------- JSON
    def _lens(self, which: str, layers: list[int], extra: dict) -> dict:
        sc = self.scores
        ref = [sc[(which, "", ("reference", k))].value_error for k in range(len(self.reference.steps))]
        rows, curve, rcurve, base = [], [], [], []
        for l in layers:
            s = sc[(which, "", l)]
            entry = {"layer": l, **s.entry(with_r2=which == "tuned")}
            if which == "tuned":
                entry["alpha"] = self.solved[("", l)][2]
            entry[REFERENCE_VALUE_ERROR] = ref[l + 1] if l + 1 < len(ref) else None
            b = sc.get((which, RANDOM_INIT, l))
            entry[RANDOM_INIT_VALUE_ERROR] = None if b is None else b.value_error
            if which == "tuned":
                entry["random_init_r2"] = None if b is None else b.r2()
            entry["value_error_per_task"] = s.per_task.result()
            rows.append(entry)
            curve.append(entry[VALUE_ERROR])
            rcurve.append(entry[REFERENCE_VALUE_ERROR])
            base.append(entry[RANDOM_INIT_VALUE_ERROR])
        out_s, base_s = sc.get((which, "", "output")), sc.get((which, RANDOM_INIT, "output"))
        return {"lens": "model-readout" if which == "logit" else "tuned-linear",
                "description": LENSES["model-readout" if which == "logit" else "tuned-linear"], **extra,
                "output_value_error": None if out_s is None else out_s.value_error,
                "random_init_output_value_error": None if base_s is None else base_s.value_error,
                REFERENCE_VALUE_ERROR: ref,
                "layers": rows,
                "convergence": convergence.depth_summary(layers, curve, rcurve),
                "random_init_convergence": convergence.depth_summary(layers, base, rcurve) if any(
                    b is not None for b in base) else None}

    def result(self) -> dict | None:
        if not self.ok:
            return None
        lenses = {}
        if self.logit[""]:
            lenses["model-readout"] = self._lens("logit", self.logit[""], {"prompts": "all", "n_prompts": self.n_prompts})
        tuned = sorted(l for pre, l in self.solved if not pre)
        if tuned and self.n_test == 0:
            self.reasons["readouts.tuned-linear"] = "no held-out tasks to score the tuned lens on: record more tasks"
        elif tuned:
            lenses["tuned-linear"] = self._lens("tuned", tuned, {
                "prompts": "held-out tasks", "test_fraction": self.test_fraction, "n_train": self.n_train,
                "n_prompts": self.n_test, "n_tasks": self.n_test_tasks})
        if not lenses:
            self.reasons.setdefault(READOUTS, "no lens could be read (see readouts.*)")
            return None
        return {"target": self.target.kind, "target_description": self.target.description,
                "reference_steps": [what if k is None else f"{what}[{k}]" for what, k in self.reference.steps],
                "lenses": lenses}

    def finalize(self) -> dict:
        return {READOUTS: self.result()}


# ------------------------------------------------------------------ the analyzer
def open_readouts(ctx):
    """The lenses of a model that recorded its own output or readout (a foreign model); the package's
    models have their residual stream in the prompt layout, where `value_error` reads it."""
    f, facts = ctx.f, ctx.facts
    if "outputs/model" in f or "lens" in f:
        return Readouts(f, ctx.hints, ctx.layout, facts.pos, ctx.opts.seed, ctx.opts.test_fraction,
                        ctx.opts.per_task_max, ctx.reasons)
    if ctx.subject.model is not None or facts.readable:
        ctx.reasons[READOUTS] = "not applicable: the residual stream is in the prompt layout (value_error reads it)"
    else:
        ctx.reasons[READOUTS] = ("no outputs/model or lens/{l} recorded (record the model with this version's "
                                 "`icrl-interp record --model`)")
    return None


register(Analyzer(
    name=READOUTS, open=open_readouts, roles=("resid_post", "readout"),
    arrays=("outputs/model", "tasks/values", "prompts/state", "reference/values", "reference/output"),
    summary="a foreign model's value error by depth through its own readout (logit lens) and a tuned lens",
    missing="not applicable: no model output or lens recorded"))
