"""Causal test of the TD-error direction: erase it, or steer along it, at one layer and measure what
the model's output does, against the same edit along random directions (docs/causal.md).

At layer l the direction that carries the reference TD error is fitted on *training* tasks (a ridge
probe, as `analyzers.td_probe`, from the activation at each context column k to delta_k of the same
prompt), or taken from the construction (`Hints.td_direction`), or given. On *held-out* tasks (split
by task) every context column of that layer's activation is then edited:

* **erase**: mean-ablation of the projection on the unit direction u, x -> x - u (u.x - mu) (mu: the
  mean of u.x on training columns); zero-ablation (mu = 0); or LEACE, the least-squares concept eraser
  (Belrose et al., 2023), whose closed form for one scalar concept is the oblique rank-one projection
  x -> x - c b.(x - mean_x), c = Cov(x, delta), b = Cov(x)^+ c / (c^T Cov(x)^+ c);
* **steer**: x -> x + s sigma u for a few s (sigma: the std of u.x on training columns).

Every edit is x -> x - c (b.x - m) + v (`Edit`). The same edit along random directions (seeded draws
g, bent toward the top or bottom of Cov(x) as Cov(x)^p g) is the control, each draw of the same size
as the TD edit: an erasure removes as much variance as the TD erasure does (`variance_matched`), a
steering shifts by the same vector norm. Output and value-error changes are compared per held-out
task, with paired effect sizes and bootstrap intervals. Every erasure also reports how much of delta a
ridge probe refitted on the edited features still reads (`r2_after`): mean-ablating the probe's
direction removes its readout, not necessarily delta; LEACE leaves none linearly.

By default the identical test also runs on the same architecture at random initialization
(`recorder.random_init_copy`: same tasks, split, random directions and resamples, its own direction),
and the two models are compared on the excess output change (TD minus random directions, in output
units, per task), which a model whose output barely moves cannot win by a scale-free ratio.

Works for the package's models (TransformerLens hook names) and for any torch module through the
[roles] of a probe spec (`capture.role_points`); the residual stream may have its own width.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..families import registry
from ..core.errors import UserError

SCHEMA = "icrl_interp.causal/1"
METHODS = ("mean", "leace", "zero")
"""Erasure methods: mean-ablation of the projection, LEACE, zero-ablation of the projection."""
SITES = {
    "resid_post": "blocks.{layer}.hook_resid_post",
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "attn_out": "blocks.{layer}.hook_attn_out",
    "attn_scores": "blocks.{layer}.attn.hook_attn_scores",
}
"""Where the test can intervene (canonical TransformerLens names; the first three are also roles)."""
DIRECTIONS = ("probe", "construction")
DEFAULT_STEER = (-2.0, -1.0, 1.0, 2.0)
FOLDS = 5
MIN_TASKS = 8


# ------------------------------------------------------------------------- edits
@dataclass(frozen=True)
class Edit:
    """x -> x - c (b.x - m) + v on the feature vector x of every context column.

    Erasures set (c, b, m) with b.c = 1 (a rank-one projection: mean-ablation c = b = u, m = mean;
    zero-ablation m = 0; LEACE an oblique one); steering sets v. Either part may be absent."""

    c: np.ndarray | None = None
    """Direction that is removed (None: no erasure)."""
    b: np.ndarray | None = None
    """Functional that reads the part removed (b.c = 1)."""
    m: float = 0.0
    """Value b.x is set to."""
    v: np.ndarray | None = None
    """Vector added (None: no steering)."""

    def apply(self, x):
        """The edited features (numpy or torch, last axis = features)."""
        if self.c is not None:
            c, b = self._as(x, self.c), self._as(x, self.b)
            x = x - ((x @ b) - self.m)[..., None] * c
        if self.v is not None:
            x = x + self._as(x, self.v)
        return x

    @staticmethod
    def _as(x, a: np.ndarray):
        if isinstance(x, np.ndarray):
            return np.asarray(a, dtype=np.float64)
        import torch

        return torch.as_tensor(np.asarray(a), dtype=x.dtype, device=x.device)


def projection_edit(u: np.ndarray, m: float = 0.0) -> Edit:
    """Set the projection on the unit direction u to m: x -> x - u (u.x - m) (m = mean: mean-ablation)."""
    u = _unit(u, "direction")
    return Edit(c=u, b=u, m=float(m))


def leace_edit(cov_x: np.ndarray, cov_xz: np.ndarray, mean_x: np.ndarray) -> Edit:
    """LEACE for one scalar concept z: x -> x - W^+ P_{W Cov(x,z)} W (x - mean_x), W = (Cov(x)^{1/2})^+.

    With c = Cov(x, z) (which lies in the range of Cov(x)), W^+ P W = c (Cov(x)^+ c)^T / (c^T Cov(x)^+ c):
    a rank-one oblique projection that leaves the mean unchanged and makes Cov(edited x, z) = 0."""
    cov_x = np.asarray(cov_x, dtype=np.float64)
    c = np.asarray(cov_xz, dtype=np.float64)
    pinv = pinv_psd(cov_x)
    q = pinv @ c
    denom = float(c @ q)
    if not denom > 0.0:
        raise UserError("LEACE: the concept has no covariance with the features at this site (nothing to erase)")
    b = q / denom
    return Edit(c=c, b=b, m=float(b @ np.asarray(mean_x, dtype=np.float64)))


MATCH_POWER = 30.0
"""Largest |p| of the control's Cov(x)^p g; beyond it the erased variance is that of an eigenvector."""


def erased_variance(cov: np.ndarray, edit: Edit) -> float:
    """Variance a rank-one erasure removes, E||x - edit(x)||^2 = ||c||^2 b.Cov.b (mean-ablation along a unit
    u: u.Cov.u; LEACE of a concept with cross-covariance c: ||c||^2 / c.Cov^+.c)."""
    c, b = np.asarray(edit.c, dtype=np.float64), np.asarray(edit.b, dtype=np.float64)
    return float(c @ c * (b @ cov @ b))


def variance_matched(cov: np.ndarray, g: np.ndarray, target: float, leace: bool = False) -> np.ndarray:
    """Cov^p g with p chosen so that its erasure removes `target` variance: the unit direction's u.Cov.u
    (mean- or zero-ablation) or, with `leace`, the LEACE eraser's ||c||^2 / c.Cov^+.c for c = Cov^p g.

    Both are means of Cov's eigenvalues weighted by lambda^{2p} (g.e)^2 (LEACE: by lambda^{2p-1} (g.e)^2,
    a harmonic mean), so they grow with p: p is found by bisection in [-MATCH_POWER, MATCH_POWER]. p = 0
    is g itself (mean-ablation), p = 1 the eraser of the raw concept g.x (LEACE). A target beyond the
    reachable range gives the nearest end (an eigenvector's variance). Only the range of Cov counts."""
    lam, U = np.linalg.eigh((cov + cov.T) / 2)
    keep = lam > 1e-10 * max(float(lam.max(initial=0.0)), 1e-300)
    lam, U = lam[keep], U[:, keep]
    a = U.T @ np.asarray(g, dtype=np.float64)
    if lam.size == 0 or not float(a @ a) > 0:
        raise UserError("the features do not vary along the random direction: no variance to erase")
    log_l = np.log(lam / lam.max())
    with np.errstate(divide="ignore"):
        log_a2 = np.log(a ** 2)

    def variance(p: float) -> float:
        e = log_a2 + 2 * p * log_l
        w = np.exp(e - e.max())  # the weights up to a constant, without overflow
        return float(w.sum() / (w @ (1 / lam))) if leace else float(w @ lam / w.sum())

    lo, hi = -MATCH_POWER, MATCH_POWER
    for _ in range(200):
        mid = (lo + hi) / 2
        if variance(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13:
            break
    p = (lo + hi) / 2
    return U @ (np.exp(p * log_l - np.max(p * log_l)) * a)  # Cov^p g up to a positive constant


def pinv_psd(S: np.ndarray, rtol: float = 1e-10) -> np.ndarray:
    """Pseudo-inverse of a symmetric positive semi-definite matrix (eigenvalues below rtol * max dropped)."""
    lam, U = np.linalg.eigh((S + S.T) / 2)
    keep = lam > rtol * max(float(lam.max(initial=0.0)), 1e-300)
    return (U[:, keep] / lam[keep]) @ U[:, keep].T


def _unit(u, what: str) -> np.ndarray:
    u = np.asarray(u, dtype=np.float64).ravel()
    norm = float(np.linalg.norm(u))
    if not np.isfinite(norm) or norm == 0.0:
        raise UserError(f"the {what} is zero or not finite: nothing to erase or steer along")
    return u / norm


def random_directions(width: int, draws: int, seed: int, layer: int = 0) -> np.ndarray:
    """[draws, width] unit vectors, uniform on the sphere, a pure function of (seed, layer)."""
    g = np.random.default_rng([int(seed), int(layer), 0xCA05A1]).standard_normal((int(draws), int(width)))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


# ------------------------------------------------------------------------- sites
@dataclass(frozen=True)
class Site:
    """Where the edit happens: one hook of one layer, on the context columns."""

    hook: str
    """Short name (a key of SITES)."""
    layer: int
    canonical: str
    """TransformerLens name, e.g. blocks.2.hook_resid_post."""
    point: str
    """The model's own hook or module path ('#k': element k of a tuple output)."""
    kind: str
    """'columns' (one feature vector per position) or 'scores' (the last query row, one entry per head)."""
    n_layers: int


def _own(model) -> bool:
    from ..models.config import ModelConfig

    return isinstance(getattr(model, "config", None), ModelConfig)


def _has_tl_hooks(model) -> bool:
    return any(isinstance(getattr(m, "hook_dict", None), dict) and m.hook_dict for m in model.modules())


def _check_int(name: str, value, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise UserError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def default_hook(model) -> str:
    """The package's models: the first hook of the family's `Hints.primary_probe` (sarsa / actor-critic:
    the attention scores, where delta sits); any other model: resid_post."""
    if _own(model):
        for hook in registry.get(model.config.family).hints.primary_probe:
            for short, name in SITES.items():
                if name.split("{layer}.", 1)[1] == hook:
                    return short
    return "resid_post"


def site_of(model, layer: int, hook: str | None = None, roles: dict | None = None) -> Site:
    """Resolve (layer, hook) on `model`: TransformerLens names where the model has them, else [roles]."""
    from ..recording.capture import hookable, role_points

    hook = default_hook(model) if hook is None else hook
    if hook not in SITES:
        raise UserError(f"--hook {hook!r}: expected one of {', '.join(SITES)}")
    layer = _check_int("--layer", layer)
    template = SITES[hook]
    if roles:
        points = role_points(model, dict(roles))
    elif _own(model) or _has_tl_hooks(model):
        points = {name: name for name in hookable(model) if name.startswith("blocks.")}
    else:
        raise UserError(f"{type(model).__name__} is not a TransformerLens model: give a probe spec whose [roles] map "
                        f"resid_post (and resid_pre / attn_out) to its modules (docs/byom.md)")
    tail = template.split("{layer}", 1)[1]
    layers = sorted(int(name.split(".")[1]) for name in points
                    if name.endswith(tail) and name.split(".")[1].isdigit() and name == template.format(layer=name.split(".")[1]))
    if not layers:
        how = "a TransformerLens attn.hook_attn_scores hook" if hook == "attn_scores" else f"role {hook}"
        raise UserError(f"--hook {hook}: the model has no {template.format(layer='L')} (it needs {how})")
    if layer not in layers:
        raise UserError(f"--layer {layer}: the model has {hook} at layers {layers[0]}..{layers[-1]}")
    n_layers = int(getattr(model, "n_layers", 0) or 0) if _own(model) else max(layers) + 1
    canonical = template.format(layer=layer)
    return Site(hook, layer, canonical, points[canonical], "scores" if hook == "attn_scores" else "columns",
                max(n_layers, max(layers) + 1))


# ------------------------------------------------------------------------- running
def _dtype_device(model):
    import torch

    p = next(iter(model.parameters()), None)
    return (p.dtype, p.device) if p is not None else (torch.float32, torch.device("cpu"))


@contextmanager
def eval_mode(model):
    """The model in eval mode for the block, each module's own mode restored afterwards."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        for m, _ in modes:
            m.training = False
        yield model
    finally:
        for m, mode in modes:
            m.training = mode


def _features(t, kind: str, n: int) -> np.ndarray:
    """[B, n, F] float64 features at the context columns of a captured activation."""
    if kind == "scores":
        t = t[:, :, -1, :n].transpose(1, 2)
    else:
        t = t[:, :n].reshape(t.shape[0], n, -1)
    return t.detach().to("cpu").double().numpy()


def _edit_hook(kind: str, n: int, edit: Edit):
    def fn(t):
        if kind == "scores":
            out = t.clone()
            out[:, :, -1, :n] = edit.apply(t[:, :, -1, :n].transpose(1, 2)).transpose(1, 2)
            return out
        B, pos = t.shape[0], t.shape[1]
        flat = t.reshape(B, pos, -1).clone()
        flat[:, :n] = edit.apply(flat[:, :n])
        return flat.reshape(t.shape)
    return fn


class Runner:
    """The model's forward on prompts, with an optional edit at the site; returns the output [B, k]."""

    def __init__(self, model, site: Site, pos: int, width: int | None, batch_size: int = 256):
        self.model, self.site, self.pos, self.width = model, site, pos, width
        self.n = pos - 1
        self.dtype, self.device = _dtype_device(model)
        self.batch_size = batch_size
        self.own = _own(model)
        if self.own:
            hints = registry.get(model.config.family).hints
            self.blocks = list(hints.output_blocks) if hints.output == "parameters" else None

    def output(self, y, batch: int) -> np.ndarray:
        if self.own:
            lay = self.model.layout
            if self.blocks:
                y = np.concatenate([y[:, -1, lay.slice(b)].detach().cpu().double().numpy() for b in self.blocks], -1)
            else:
                y = lay.readout(y).detach().cpu().double().numpy()
            return y.reshape(batch, -1)
        from ..recording.recorder import per_prompt_output

        return per_prompt_output(y, batch, self.width).cpu().double().numpy()

    def _check(self, t) -> None:
        shape = tuple(t.shape)
        if self.site.kind == "scores":
            ok = t.ndim == 4 and shape[2] == shape[3] == self.pos
            want = f"[batch, heads, {self.pos}, {self.pos}]"
        else:
            ok = t.ndim >= 3 and shape[1] == self.pos
            want = f"[batch, {self.pos}, width] (one vector per prompt position)"
        if not ok:
            raise UserError(f"{self.site.canonical} ({self.site.point}) has shape {shape}, expected {want}")

    def run(self, z: np.ndarray, edit: Edit | None = None, features: bool = False):
        """(outputs [B, k], features [B, n, F] or None) of prompts z, in batches."""
        import torch

        from ..recording.capture import capture, intervene
        from ..models import user

        forward = (lambda x: self.model(x)) if self.own else (lambda x: user.forward(self.model, x))
        outs, feats = [], []
        n_batches = -(-z.shape[0] // self.batch_size)
        for lo in range(0, z.shape[0], self.batch_size):
            x = torch.from_numpy(np.ascontiguousarray(z[lo: lo + self.batch_size])).to(self.device, self.dtype)
            seen: list = []

            def grab(_name, t):
                self._check(t)
                seen.append(_features(t, self.site.kind, self.n) if features else None)

            with torch.no_grad(), eval_mode(self.model), capture(self.model, {self.site.canonical: self.site.point}, grab):
                if edit is None:
                    y = forward(x)
                else:
                    with intervene(self.model, self.site.point, _edit_hook(self.site.kind, self.n, edit)):
                        y = forward(x)
            if not seen:
                raise UserError(f"{self.site.canonical} ({self.site.point}) did not fire during the forward pass")
            if features:
                feats.append(seen[0])
            outs.append(self.output(y, x.shape[0]))
            user.check_output(outs[-1], "the model's output" + (" under the edit" if edit is not None else ""),
                              f"batch {lo // self.batch_size + 1} of {n_batches} (prompts {lo}..{lo + x.shape[0] - 1})")
        return np.concatenate(outs, 0), (np.concatenate(feats, 0) if features else None)


ROUNDING_ULPS = 64
"""Units of rounding (eps of the model's dtype, at the largest |entry| of the unedited output) within which
an edited output counts as unchanged (`unchanged_within_rounding`)."""


def rounding_floor(dtype, base: np.ndarray) -> float:
    """ROUNDING_ULPS * eps(dtype) * max |base|: how far two forward passes of the same prompts can differ
    with nothing changed that the output reads. The BLAS kernel, its thread count and the batch the prompts
    run in each round differently (docs/causal.md#the-rounding-floor). `dtype`: a torch dtype."""
    import torch

    eps = float(torch.finfo(dtype).eps) if dtype.is_floating_point else 0.0
    return ROUNDING_ULPS * eps * float(np.max(np.abs(base), initial=0.0))


def unchanged_within_rounding(out: np.ndarray, base: np.ndarray, dtype) -> np.ndarray:
    """`out` [N, k] with each row whose change ||out - base||_2 is at most `rounding_floor(dtype, base)`
    replaced by base's row, so an edit that nothing downstream reads has effect exactly 0 on every machine."""
    same = np.linalg.norm(out - base, axis=-1) <= rounding_floor(dtype, base)
    return np.where(same[:, None], base, out)


# ------------------------------------------------------------------------- setup
def probe_iteration(hook: str, layer: int) -> int:
    """Reference step the hook of layer l carries: resid_post delta^(l+1), everything computed from the
    layer's input delta^(l) (as the analyzers' probes)."""
    return layer + 1 if hook == "resid_post" else layer


@dataclass
class CausalSetup:
    """What was fitted on the training tasks, ready to edit the held-out ones (`prepare`)."""

    runner: Runner
    site: Site
    family: str
    z_test: np.ndarray
    """Held-out prompts [N_test, pos, d_model]."""
    base: np.ndarray
    """The model's output on them, unedited [N_test, k]."""
    truth: np.ndarray
    """What the value error is measured against [N_test, k]."""
    truth_kind: str
    """'true value' (v_pi at the query / last state) or 'reference output'."""
    direction: np.ndarray
    """Unit TD direction u in feature space."""
    direction_source: str
    mean: float
    """Mean of u.x over training context columns."""
    std: float
    """Std of u.x over training context columns."""
    mean_x: np.ndarray
    cov_x: np.ndarray
    cov_xz: np.ndarray
    probe: dict
    """Ridge probe: r2_train, r2_test, r2_shuffled, alpha, target_iteration, ..."""
    train_index: np.ndarray
    test_index: np.ndarray
    batch: object
    """The sampled PromptBatch (all tasks)."""
    notes: list = field(default_factory=list)
    probe_sums: np.ndarray | None = None
    """Per held-out task [N_test, 4]: the probe's sum of squared residuals, samples, sum and sum of squares
    of its targets (the probe's held-out R^2 from any subset of tasks: `analyzers.td_probe.r2_of_sums`)."""
    features: np.ndarray | None = None
    """The unedited features of every task [tasks, n, F] (what `r2_after` edits and refits on)."""
    targets: np.ndarray | None = None
    """The probe's targets delta_k of every task [tasks, n]."""

    @property
    def width(self) -> int:
        return int(self.direction.size)

    def erase(self, method: str = "mean") -> Edit:
        """The erasure of the TD direction by `method`."""
        if method == "mean":
            return projection_edit(self.direction, self.mean)
        if method == "zero":
            return projection_edit(self.direction, 0.0)
        if method == "leace":
            return leace_edit(self.cov_x, self.cov_xz, self.mean_x)
        raise UserError(f"--method {method!r}: expected one of {', '.join(METHODS)}")

    def erase_random(self, method: str, g: np.ndarray) -> Edit:
        """The same erasure along the random vector g, of the same size as the TD erasure: bent to
        Cov(x)^p g so that it removes the variance the TD erasure removes (`variance_matched`).
        Mean- / zero-ablation: the unit direction with u.Cov.u = sigma^2 of the TD direction. LEACE: the
        eraser of the concept whose cross-covariance is Cov(x)^p g (p = 1: the raw concept g.x), with
        the TD eraser's ||c||^2 / c.Cov^+.c. An unmatched control compares edits of different sizes: the
        random draws' effects grow with the variance they remove (docs/causal.md#the-random-control)."""
        td = self.erase(method)
        target = erased_variance(self.cov_x, td)
        if method == "leace":
            return leace_edit(self.cov_x, variance_matched(self.cov_x, g, target, leace=True), self.mean_x)
        u = _unit(variance_matched(self.cov_x, g, target), "random direction")
        if method == "zero":
            return projection_edit(u, 0.0)
        return projection_edit(u, float(self.mean_x @ u))

    def steer(self, scale: float, direction: np.ndarray | None = None) -> Edit:
        """x -> x + scale * std * unit(direction) (default: the TD direction)."""
        u = self.direction if direction is None else _unit(direction, "steering direction")
        return Edit(v=float(scale) * self.std * u)

    def r2_after(self, edit: Edit) -> float | None:
        """Held-out R^2 of a ridge probe refitted (as the direction's probe: same split, penalty by CV on
        the training tasks) on the features under `edit`: how much of delta the edited features still
        carry linearly. About 0 after LEACE; near the unedited R^2 when the edit left delta decodable."""
        if self.features is None or self.targets is None:
            return None
        return _probe(edit.apply(self.features), self.targets, self.train_index, self.test_index,
                      shuffled=False)["r2_test"]

    def output(self, edit: Edit | None = None) -> np.ndarray:
        """The model's output on the held-out prompts [N_test, k] under `edit`; a task whose output moved by
        no more than the rounding floor keeps its unedited output (`unchanged_within_rounding`)."""
        if edit is None:
            return self.base
        return unchanged_within_rounding(self.runner.run(self.z_test, edit)[0], self.base, self.runner.dtype)

    def value_error(self, out: np.ndarray) -> np.ndarray:
        """Per held-out task: ||out - truth||_2."""
        return np.linalg.norm(out - self.truth, axis=-1)


def _truth(batch, idx: np.ndarray, hints, width: int) -> tuple[np.ndarray, str]:
    ref = np.asarray(batch.reference["output"], dtype=np.float64)[idx].reshape(idx.size, -1)
    values, states = batch.tasks.get("values"), getattr(batch.prompt, "states", None)
    if hints.output in ("query", "positions") and width == 1 and values is not None and states is not None:
        s = np.asarray(states)[idx, -1]
        if np.all(s >= 0):
            return np.take_along_axis(np.asarray(values, dtype=np.float64)[idx], s[:, None], 1), "true value"
    return ref, "reference output"


def _probe(X: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray, shuffled: bool = True) -> dict:
    """Ridge probe with intercept (analyzers.td_probe's RidgeStats: the penalty picked by 5-fold CV over
    the training tasks), its R^2 on training and held-out tasks, and (unless `shuffled` is False) the
    shuffled control (each task's targets replaced by those of the next task of the same fold)."""
    from ..analyzers import td_probe

    N, n, F = X.shape
    fold = np.full(N, FOLDS, dtype=np.int64)
    fold[train] = np.arange(train.size) % FOLDS
    shuffled_y = np.empty_like(y)
    for f in range(FOLDS + 1):
        members = np.nonzero(fold == f)[0]
        shuffled_y[members] = y[np.roll(members, 1)]
    x0, y0 = X[train].reshape(-1, F).mean(0), float(y[train].mean())
    out = {}
    for key, target in (("", y), ("_shuffled", shuffled_y))[:2 if shuffled else 1]:
        stats = []
        for f in range(FOLDS + 1):
            st = td_probe.RidgeStats(F)
            st.set_origin(x0, y0)
            rows = fold == f
            st.update(X[rows].reshape(-1, F), target[rows].ravel())
            stats.append(st)
        alpha, pooled = td_probe.select_alpha(stats[:FOLDS])
        coef, b0 = pooled.fit(alpha)
        out[f"r2_test{key}"] = _num(stats[FOLDS].r2(coef, b0))
        if not key:
            out.update({"r2_train": _num(pooled.r2(coef, b0)), "alpha": alpha, "coef": coef, "intercept": b0,
                        "n_train": int(pooled.n), "n_test": int(stats[FOLDS].n)})
    if shuffled:
        out["r2_shuffled"] = out.pop("r2_test_shuffled")
    return out


def _construction_direction(model, site: Site, width: int) -> np.ndarray | None:
    if not _own(model):
        return None
    hints = registry.get(model.config.family).hints
    if site.kind == "scores":  # the family says delta sits in the query row of the scores (LSA: c delta_k)
        return np.ones(1) if width == 1 and "attn.hook_attn_scores" in hints.primary_probe else None
    from ..analyzers.streams import td_direction

    v = td_direction(hints, model.layout)
    return v if v is not None and v.size == width else None


def prepare(model, config, layer: int, *, hook: str | None = None, roles: dict | None = None,
            direction="probe", tasks: int = 256, test_fraction: float = 0.5, seed: int = 0,
            batch_size: int = 256) -> CausalSetup:
    """Sample `tasks` tasks of `config` (a CheckpointConfig, checkpoint directory or family name), split
    them by task, fit the TD direction at (layer, hook) on the training ones and run the held-out ones
    unedited. `direction`: 'probe' (ridge), 'construction' (`Hints.td_direction`; scores: the score
    itself) or an array in feature space."""
    from ..recording.recorder import task_of

    config = task_of(config)
    tasks = _check_int("--tasks", tasks, MIN_TASKS)
    seed = _check_int("--seed", seed)
    batch_size = _check_int("--batch-size", batch_size, 1)
    if not (isinstance(test_fraction, (int, float)) and 0.0 < float(test_fraction) < 1.0):
        raise UserError(f"test fraction must lie in (0, 1), got {test_fraction!r}")
    site = site_of(model, layer, hook, roles)
    fam = registry.get(config.task.family)
    batch = config.sample(tasks, np.random.default_rng([seed, 0x7A5C]))
    z = np.asarray(batch.prompt.z, dtype=np.float64)
    ref_out = np.asarray(batch.reference["output"])
    width = int(np.prod(ref_out.shape[1:]))
    runner = Runner(model, site, z.shape[1], width, batch_size)
    n = z.shape[1] - 1
    perm = np.random.default_rng([seed, 0x5B1]).permutation(tasks)
    n_test = min(max(2, int(round(tasks * float(test_fraction)))), tasks - FOLDS)
    test, train = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    notes: list[str] = []
    out, X = runner.run(z, features=True)
    if out.shape[1] != width:
        raise UserError(f"the model's output has {out.shape[1]} values per prompt, the task's {width}")
    td = np.asarray(batch.reference["td_errors"], dtype=np.float64)
    steps = td.shape[1]
    it = probe_iteration(site.hook, site.layer)
    if it >= steps:
        notes.append(f"{site.canonical} carries delta^({it}) but the reference has {steps - 1} step(s): "
                     f"compared with delta^({steps - 1})")
        it = steps - 1
    y = td[:, it, :n]
    F = X.shape[-1]
    probe = _probe(X, y, train, test)
    probe["target_iteration"] = it
    construction = _construction_direction(model, site, F)
    probe["construction_cosine"] = (None if construction is None or not np.any(probe["coef"]) else
                                    float(probe["coef"] @ construction / np.linalg.norm(probe["coef"])
                                          / np.linalg.norm(construction)))
    if isinstance(direction, str):
        if direction == "probe":
            u = _unit(probe["coef"], "probe direction (all ridge coefficients are 0)")
        elif direction == "construction":
            if construction is None:
                raise UserError(f"--direction construction: the construction names no TD direction at "
                                f"{site.canonical} of this model (use the probe direction)")
            u = _unit(construction, "construction direction")
        else:
            raise UserError(f"--direction {direction!r}: expected one of {', '.join(DIRECTIONS)}")
        source = direction
    else:
        u = np.asarray(direction, dtype=np.float64).ravel()
        if u.size != F:
            raise UserError(f"the direction has {u.size} entries, the features at {site.canonical} have {F}")
        u, source = _unit(u, "direction"), "given"
    if F == 1:
        notes.append("feature width 1: every direction is the TD direction up to sign, so the random control "
                     "is not informative")
    yh = y[test]
    resid = yh - (X[test] @ probe["coef"] + probe["intercept"])
    probe_sums = np.stack([(resid ** 2).sum(1), np.full(test.size, float(n)), yh.sum(1), (yh ** 2).sum(1)], 1)
    Xt, yt = X[train].reshape(-1, F), y[train].ravel()
    proj = Xt @ u
    mean_x = Xt.mean(0)
    Xc = Xt - mean_x
    cov_x = Xc.T @ Xc / Xt.shape[0]
    cov_xz = Xc.T @ (yt - yt.mean()) / Xt.shape[0]
    truth, truth_kind = _truth(batch, test, fam.hints, width)
    return CausalSetup(runner=runner, site=site, family=fam.name, z_test=z[test], base=out[test], truth=truth,
                       truth_kind=truth_kind, direction=u, direction_source=source, mean=float(proj.mean()),
                       std=float(proj.std()), mean_x=mean_x, cov_x=cov_x, cov_xz=cov_xz, probe=probe,
                       train_index=train, test_index=test, batch=batch, notes=notes, probe_sums=probe_sums,
                       features=X, targets=y)


# ------------------------------------------------------------------------- statistics
def _ci(samples: np.ndarray):
    s = np.asarray(samples, dtype=np.float64)
    ok = s[np.isfinite(s)]
    if ok.size < 0.95 * s.size or ok.size == 0:
        return None
    return [float(np.percentile(ok, 2.5)), float(np.percentile(ok, 97.5))]


def _paired_d(diff: np.ndarray) -> np.ndarray:
    """mean / sd (ddof 1) along the last axis; 0 where every difference is 0, NaN where sd = 0 alone."""
    m = diff.mean(-1)
    sd = diff.std(-1, ddof=1) if diff.shape[-1] > 1 else np.zeros_like(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = m / sd
    return np.where(sd > 0, d, np.where(m == 0, 0.0, np.nan))


def excess(td: np.ndarray, rand: np.ndarray) -> np.ndarray:
    """Per held-out task: the TD direction's effect minus the mean over the random draws (td [N], rand
    [N, K]), in the effect's own units; differences at the level of rounding are 0."""
    td, rand = np.asarray(td, dtype=np.float64), np.asarray(rand, dtype=np.float64)
    diff = td - rand.mean(1)
    scale = max(float(np.max(np.abs(td), initial=0.0)), float(np.max(np.abs(rand), initial=0.0)))
    return np.where(np.abs(diff) <= 1e-10 * scale, 0.0, diff)  # rounding is no difference


def compare(td: np.ndarray, rand: np.ndarray, rng: np.random.Generator, n_boot: int = 1000,
            ratio: bool = True) -> dict:
    """TD-direction effect per held-out task (td [N]) against random draws (rand [N, K]).

    `difference`: mean over tasks of td - mean_k rand (paired); `cohen_d`: that mean over its sd across
    tasks; `ratio`: mean td / mean rand; `z_draws`: (mean td - mean of the draws' means) / their sd;
    `p_random`: (1 + draws whose mean reaches the TD one) / (1 + draws). Intervals: 95% percentile
    bootstrap over held-out tasks."""
    td, rand = np.asarray(td, dtype=np.float64), np.asarray(rand, dtype=np.float64)
    N, K = rand.shape
    rbar = rand.mean(1)
    diff = excess(td, rand)
    idx = rng.integers(0, N, size=(n_boot, N))
    td_b, r_b, diff_b = td[idx].mean(1), rbar[idx].mean(1), diff[idx]
    draws = rand.mean(0)
    sd_draws = float(draws.std(ddof=1)) if K > 1 else 0.0
    out = {
        "td": {"mean": float(td.mean()), "ci": _ci(td_b)},
        "random": {"mean": float(rbar.mean()), "ci": _ci(r_b), "sd_draws": sd_draws,
                   "draws": [float(v) for v in draws]},
        "difference": {"mean": float(diff.mean()), "ci": _ci(diff_b.mean(1))},
        "cohen_d": {"value": _num(_paired_d(diff)), "ci": _ci(_paired_d(diff_b))},
        "z_draws": (float((td.mean() - draws.mean()) / sd_draws) if sd_draws > 0 else None),
        "p_random": float((1 + np.sum(draws >= td.mean() - 1e-12 * max(1.0, abs(td.mean())))) / (1 + K)),
    }
    if ratio:
        with np.errstate(divide="ignore", invalid="ignore"):
            rb = np.where(r_b > 0, td_b / r_b, np.nan)
        out["ratio"] = {"value": float(td.mean() / rbar.mean()) if rbar.mean() > 0 else None, "ci": _ci(rb)}
    return out


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


# ------------------------------------------------------------------------- the test
BASELINES = ("random-init", "none")
"""What the identical test also runs on: the same architecture at random initialization
(`recorder.random_init_copy`), or nothing."""
MEASURE = ("excess output change: per held-out task, ||out_edited - out||_2 from erasing the TD direction "
           "minus its mean over the random directions of the same size (variance-matched), in the output's own "
           "units (the task's values); "
           "trained minus random-init per task, 95% bootstrap over held-out tasks")
"""What the trained-vs-random-init comparison is based on (docs/causal.md#trained-against-random-init)."""


@dataclass
class Measured:
    """One model's effects on the held-out tasks: the JSON statistics and the per-task arrays behind them."""

    erasure: dict
    steering: list
    per_task: dict
    """'output', 'value_error': (TD [N], random [N, K]) of the erasure; 'steer': one such pair per scale."""
    largest: float
    """The largest output change of any edit (TD or random direction, erasure or steering)."""


def measure(setup: CausalSetup, method: str, G: np.ndarray, scales, seed: int, n_boot: int) -> Measured:
    """Erase and steer the TD direction of `setup` and the random directions G [K, width] on its
    held-out tasks. The bootstrap resamples are a pure function of `seed`, so two models measured on the
    same tasks share them."""
    rng = np.random.default_rng([int(seed), 0xB007])
    base, ve0 = setup.base, setup.value_error(setup.base)

    def effect(edit: Edit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = setup.output(edit)
        return np.linalg.norm(out - base, axis=-1), setup.value_error(out) - ve0, (out - base)

    with eval_mode(setup.runner.model):
        td_edit = setup.erase(method)
        td_abs, td_ve, td_delta = effect(td_edit)
        rand_edits = [setup.erase_random(method, g) for g in G]
        rand = [effect(e) for e in rand_edits]
        r_abs = np.stack([r[0] for r in rand], 1)
        r_ve = np.stack([r[1] for r in rand], 1)
        erasure = {"output_change": compare(td_abs, r_abs, rng, n_boot),
                   "value_error_change": compare(td_ve, r_ve, rng, n_boot, ratio=False)}
        if base.shape[1] == 1:
            signed = td_delta[:, 0]
            idx = rng.integers(0, signed.size, size=(n_boot, signed.size))
            erasure["output_change"]["td"]["signed"] = {"mean": float(signed.mean()), "ci": _ci(signed[idx].mean(1))}
        if method == "leace":
            c = td_edit.c
            erasure["leace_cosine"] = float(c @ setup.direction / np.linalg.norm(c))
        sizes = [erased_variance(setup.cov_x, e) for e in rand_edits]
        erasure["erased_variance"] = {"td": erased_variance(setup.cov_x, td_edit), "random": float(np.mean(sizes))}
        after = [setup.r2_after(e) for e in rand_edits]
        erasure["r2_after"] = {"before": setup.probe.get("r2_test"), "td": setup.r2_after(td_edit),
                               "random": (None if not after or any(a is None for a in after)
                                          else float(np.mean(after)))}
        curve, steer = [], []
        for s in scales:
            t_abs, t_ve, t_delta = effect(setup.steer(s))
            rs = [effect(setup.steer(s, g)) for g in G]
            ra = np.stack([r[0] for r in rs], 1)
            rv = np.stack([r[1] for r in rs], 1)
            cmp = compare(t_abs, ra, rng, n_boot)
            means = ra.mean(0)
            curve.append({
                "scale": s, "shift": s * setup.std,
                "td": {"change": cmp["td"]["mean"], "ci": cmp["td"]["ci"],
                       "signed": float(t_delta[:, 0].mean()) if base.shape[1] == 1 else None,
                       "value_error_change": float(t_ve.mean())},
                "random": {"change": cmp["random"]["mean"],
                           "band": [float(np.percentile(means, 5)), float(np.percentile(means, 95))],
                           "value_error_change": float(rv.mean())},
                "ratio": cmp["ratio"]["value"], "cohen_d": cmp["cohen_d"]["value"]})
            steer.append((t_abs, ra))
    largest = max([float(td_abs.max(initial=0.0)), float(r_abs.max(initial=0.0))]
                  + [max(float(t.max(initial=0.0)), float(r.max(initial=0.0))) for t, r in steer])
    return Measured(erasure, curve, {"output": (td_abs, r_abs), "value_error": (td_ve, r_ve), "steer": steer},
                    largest)


def reach_note(setup: CausalSetup, largest: float) -> str | None:
    """A note when no edit at all (TD or random direction) moved the output beyond the rounding floor
    (`unchanged_within_rounding`, so `largest` is then exactly 0): at the last layer's context columns
    nothing reads them any more; elsewhere the output does not depend on them."""
    if largest > 0.0:
        return None
    site = setup.site
    if site.layer == site.n_layers - 1:
        return (f"layer {site.layer} is the last of {site.n_layers}: the edits touch only the context columns "
                f"of {site.canonical}, and no later layer reads them (the output is read at the last column), "
                f"so no edit, along the TD direction or a random one, changed the output: every effect is 0 "
                f"and says nothing about whether the model uses the direction. Test an earlier layer")
    return (f"no edit, along the TD direction or a random one, changed the output: the output does not depend "
            f"on the context columns of {site.canonical}")


def _model_part(setup: CausalSetup, m: Measured, seed: int) -> dict:
    """The per-model fields of the section (also those of `baseline`)."""
    probe_out = {k: v for k, v in setup.probe.items() if k not in ("coef", "intercept")}
    note = reach_note(setup, m.largest)
    return {
        "direction": {"source": setup.direction_source, "width": setup.width, "mean": setup.mean, "std": setup.std,
                      **probe_out},
        "tasks": {"train": int(setup.train_index.size), "test": int(setup.test_index.size), "seed": int(seed)},
        "value_error": {"target": setup.truth_kind, "base": float(setup.value_error(setup.base).mean())},
        "erasure": m.erasure,
        "steering": m.steering,
        "notes": list(setup.notes) + ([note] if note else []),
    }


def _versus(a: np.ndarray, b: np.ndarray, idx: np.ndarray) -> dict:
    """Per-task a (trained) and b (random-init) on the same tasks: means, and the paired difference."""
    d = a - b
    return {"trained": {"mean": float(a.mean()), "ci": _ci(a[idx].mean(1))},
            "random_init": {"mean": float(b.mean()), "ci": _ci(b[idx].mean(1))},
            "difference": {"mean": float(d.mean()), "ci": _ci(d[idx].mean(1))}}


def _probe_versus(a: np.ndarray, b: np.ndarray, idx: np.ndarray) -> dict:
    """Held-out probe R^2 of each model from per-task sums [N, 4], and the paired difference."""
    from ..analyzers.td_probe import r2_of_sums

    r2 = lambda sums: r2_of_sums(*np.moveaxis(sums, -1, 0))  # noqa: E731
    ra, rb = r2(a[idx].sum(1)), r2(b[idx].sum(1))
    return {"trained": {"mean": _num(r2(a.sum(0))), "ci": _ci(ra)},
            "random_init": {"mean": _num(r2(b.sum(0))), "ci": _ci(rb)},
            "difference": {"mean": _num(r2(a.sum(0)) - r2(b.sum(0))), "ci": _ci(ra - rb)}}


def _g(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def _stat(st: dict) -> str:
    ci = st.get("ci")
    return _g(st.get("mean")) + (f" [{_g(ci[0])}, {_g(ci[1])}]" if ci else " (no interval)")


def verdict(v: dict, what: str) -> str:
    """'yes: ...' when the trained model's interval lies wholly above the random-init model's and above 0
    (an excess that random directions match is no effect, however low the random-init one); else 'no: ...'
    with the reason."""
    t, b, d = v["trained"], v["random_init"], v["difference"]
    desc = f"{what}: trained {_stat(t)}, random-init {_stat(b)}; paired difference {_stat(d)}"
    if not t.get("ci") or not b.get("ci"):
        return f"no: no interval to compare ({desc})"
    if t["ci"][1] < b["ci"][0]:
        return f"no: the random-init model's is larger, intervals do not overlap ({desc})"
    if t["ci"][0] <= b["ci"][1]:
        return f"no: intervals overlap ({desc})"
    if t["ci"][0] <= 0.0:
        return f"no: intervals do not overlap, but the trained model's reaches 0 ({desc})"
    return f"yes: intervals do not overlap ({desc})"


def compare_models(trained: Measured, base: Measured, setup: CausalSetup, base_setup: CausalSetup,
                   seed: int, n_boot: int) -> dict:
    """The trained model against its random-init copy on the same held-out tasks and random draws.

    Per task and model, the excess of the TD direction's effect over the random directions' (`excess`);
    the bootstrap resamples of the tasks are the first of each model's own statistics, so the
    `erasure.output_change` intervals here equal the models' own `difference` intervals."""
    N = setup.z_test.shape[0]
    idx = np.random.default_rng([int(seed), 0xB007]).integers(0, N, size=(n_boot, N))
    ex = lambda pair: excess(*pair)  # noqa: E731
    t, b = trained.per_task, base.per_task
    ratio = lambda m: m.erasure["output_change"].get("ratio")  # noqa: E731
    out = {
        "measure": MEASURE,
        "erasure": {"output_change": _versus(ex(t["output"]), ex(b["output"]), idx),
                    "value_error_change": _versus(ex(t["value_error"]), ex(b["value_error"]), idx),
                    "td_output_change": _versus(t["output"][0], b["output"][0], idx),
                    "random_output_change": _versus(t["output"][1].mean(1), b["output"][1].mean(1), idx)},
        "ratio": {"trained": ratio(trained), "random_init": ratio(base)},
        "steering": [{"scale": p["scale"], **_versus(ex(ts), ex(bs), idx)}
                     for p, ts, bs in zip(trained.steering, t["steer"], b["steer"])],
        "probe_r2_test": _probe_versus(setup.probe_sums, base_setup.probe_sums, idx),
        "scale": {"trained": _rms(setup.base), "random_init": _rms(base_setup.base), "target": _rms(setup.truth)},
    }
    for point in out["steering"]:
        point["exceeds_random_init"] = verdict(point, f"excess output change, steering s={point['scale']:g}")
    out["exceeds_random_init"] = verdict(out["erasure"]["output_change"], "excess output change")
    out["probe_exceeds_random_init"] = verdict(out["probe_r2_test"], "held-out probe R²")
    return out


def _rms(out: np.ndarray) -> float:
    """Root mean square over held-out tasks of ||out||_2."""
    return float(np.sqrt(np.mean(np.sum(np.asarray(out, dtype=np.float64) ** 2, -1))))


def scale_note(comparison: dict, factor: float = 10.0) -> str | None:
    """A note when the two models' outputs differ in scale by more than `factor`: absolute effects of a
    model whose output is much larger than the task's values are large and noisy whatever it uses."""
    sc = comparison["scale"]
    t, b = sc["trained"], sc["random_init"]
    if t > 0 and b > 0 and max(t / b, b / t) <= factor:
        return None
    return (f"the random-init copy's output (rms {b:.3g}) and the trained model's (rms {t:.3g}; the target's "
            f"{sc['target']:.3g}) differ in scale by more than {factor:g}x: absolute effects scale with the "
            f"output, so read the comparison with the ratio and the scale")


def causal_test(model, config, layer: int, *, method: str = "mean", hook: str | None = None,
                roles: dict | None = None, probe=None, direction="probe", tasks: int = 256,
                test_fraction: float = 0.5, seed: int = 0, random_draws: int = 32, steer=DEFAULT_STEER,
                bootstrap: int = 1000, batch_size: int = 256, baseline: str = "random-init",
                baseline_seed: int | None = None) -> dict:
    """Erase / steer the TD-error direction at `layer` and compare with random directions (docs/causal.md).

    `model`: one of the package's models or any torch module (with `roles` or a `probe` spec path whose
    [roles] map resid_post etc. to its modules, unless it is a TransformerLens model). `config`: the task
    (a CheckpointConfig, a checkpoint directory, or a family name with its default options).
    `baseline='random-init'` runs the identical test (same held-out tasks and split, same random
    directions, same bootstrap resamples, its own direction fitted the same way) on the same architecture
    at random initialization (`recorder.random_init_copy(model, baseline_seed)`, default seed: `seed`)
    and compares the two; 'none' does not.
    Returns the `causal` section of the causal JSON (docs/formats.md#causal-json)."""
    if method not in METHODS:
        raise UserError(f"--method {method!r}: expected one of {', '.join(METHODS)}")
    if baseline not in BASELINES:
        raise UserError(f"--baseline {baseline!r}: expected one of {', '.join(BASELINES)}")
    draws = _check_int("--random-draws", random_draws, 2)
    n_boot = _check_int("--bootstrap", bootstrap, 10)
    base_seed = _check_int("--baseline-seed", seed if baseline_seed is None else baseline_seed)
    scales = [float(s) for s in (steer or ())]
    if not all(math.isfinite(s) for s in scales):
        raise UserError(f"steering scales must be finite, got {steer!r}")
    if probe is not None and roles is None:
        from ..recording.recorder import spec_for

        roles = dict(spec_for(model, probe).roles) or None
    common = dict(hook=hook, roles=roles, tasks=tasks, test_fraction=test_fraction, seed=seed, batch_size=batch_size)
    setup = prepare(model, config, layer, direction=direction, **common)
    G = random_directions(setup.width, draws, seed, setup.site.layer)
    measured = measure(setup, method, G, scales, seed, n_boot)
    fam = registry.get(setup.family)
    section = {
        "model": {"class": type(model).__name__,
                  "family": model.config.family if _own(model) else None},
        "task": {"family": setup.family, "n": int(setup.z_test.shape[1] - 1), "output": fam.hints.output,
                 "output_width": int(setup.base.shape[1])},
        "layer": setup.site.layer, "n_layers": setup.site.n_layers, "hook": setup.site.canonical,
        "module": setup.site.point, "method": method,
        "random_draws": draws, "bootstrap": n_boot,
    }
    part = _model_part(setup, measured, seed)
    notes = part.pop("notes")
    section.update(part)
    section["notes"] = notes
    if baseline == "random-init":
        section["baseline"] = _baseline(model, config, layer, setup, measured, method, direction, G, scales,
                                        seed, base_seed, n_boot, common)
    return section


def _baseline(model, config, layer, setup, measured, method, direction, G, scales, seed, base_seed, n_boot,
              common) -> dict:
    """The `baseline` section: the identical test on `random_init_copy(model, base_seed)`, compared."""
    from ..recording.recorder import random_init_copy

    copy, info = random_init_copy(model, base_seed)
    out = {"kind": info["kind"], "seed": info["seed"], "reset_modules": info["reset_modules"],
           "redrawn": list(info["redrawn"])}
    own = direction if isinstance(direction, str) else "probe"
    try:
        bset = prepare(copy, config, layer, direction=own, **common)
        if not (np.array_equal(bset.z_test, setup.z_test) and np.array_equal(bset.train_index, setup.train_index)):
            raise AssertionError("the random-init baseline drew other tasks")  # prepare is a pure function of seed
        if bset.width != setup.width:
            raise UserError(f"the random-init copy's features at {bset.site.canonical} have width {bset.width}, "
                            f"the model's {setup.width}")
        bm = measure(bset, method, G, scales, seed, n_boot)
    except UserError as e:
        out["error"] = str(e)
        return out
    part = _model_part(bset, bm, seed)
    if not isinstance(direction, str):
        part["notes"].insert(0, "the model's direction was given: the random-init copy uses its own probe direction")
    out.update(part)
    out["comparison"] = compare_models(measured, bm, setup, bset, seed, n_boot)
    note = scale_note(out["comparison"])
    if note:
        out["notes"].append(note)
    return out
