"""One model's causal experiment (docs/causal.md, "What is measured"): tasks sampled and split by task,
the TD direction fitted at one site on the training tasks (`prepare` -> `CausalSetup`), then the
erasure and steering along it and along random directions measured on the held-out tasks (`measure`),
and the JSON fields of that model (`model_part`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..core.errors import UserError
from ..families import registry
from ..models.modes import eval_mode
from . import conclusion, selective
from .edits import Edit, erased_variance, leace_edit, projection_edit, unit, variance_matched
from .sites import Runner, Site, check_int, own_model, site_of, unchanged_within_rounding
from .statistics import compare, excess, interval, num, spread

METHODS = ("mean", "leace", "zero")
"""Erasure methods: mean-ablation of the projection, LEACE, zero-ablation of the projection."""
DEFAULT_METHOD = "leace"
"""The causal test's erasure unless `--method` says otherwise. LEACE leaves no linear readout of the erased part
of delta anywhere at the site; mean-ablating the one probe direction leaves it readable along correlated directions,
so a model holding delta in several directions moved no more than under random directions of the same size (zoo
seed 5's `mimic_plain_td_lambda0.5_layer1`). Chosen with conclusion.INPUT_SHARE on zoo seeds 0-5, frozen before
seed 6 was scored (docs/causal.md, "The erasure: LEACE by default")."""
DIRECTIONS = ("probe", "construction")
ERASED = ("td", "selective", "input")
"""What an erasure removes: the TD direction (probe, construction or given), the selective direction (the probe of
the part of delta the prompt does not explain) or the input-explained direction (`selective`)."""
FOLDS = 5
MIN_TASKS = 8


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
    selective: selective.Selective | None = None
    """The selective and input-explained directions (`selective.fit`; None where the directions are not probed)."""
    explained: np.ndarray | None = None
    """What explains delta without the model, of every task [tasks, n, D + 1] (`selective.explained_by`; what
    `refit` refits the directions' split on)."""

    @property
    def width(self) -> int:
        return int(self.direction.size)

    def _along(self, which: str) -> tuple[np.ndarray, float, np.ndarray]:
        """(unit direction, training mean of its projection, Cov(x, concept)) of what `which` erases (ERASED)."""
        if which not in ERASED:
            raise UserError(f"erase {which!r}: expected one of {', '.join(ERASED)}")
        if which == "td":
            return self.direction, self.mean, self.cov_xz
        d = None if self.selective is None else getattr(self.selective, which)  # Selective.selective / .input
        if d is None:
            raise UserError(f"no {which} direction at {self.site.canonical}: its probe found nothing to read")
        return d.u, d.mean, d.cov_xz

    def erase(self, method: str = DEFAULT_METHOD, which: str = "td") -> Edit:
        """The erasure by `method` of the TD direction (`which` 'td'), the selective or the input-explained one."""
        u, mean, cov_xz = self._along(which)
        if method == "mean":
            return projection_edit(u, mean)
        if method == "zero":
            return projection_edit(u, 0.0)
        if method == "leace":
            return leace_edit(self.cov_x, cov_xz, self.mean_x)
        raise UserError(f"--method {method!r}: expected one of {', '.join(METHODS)}")

    def erase_random(self, method: str, g: np.ndarray, which: str = "td") -> Edit:
        """The same erasure along the random vector g, of the same size as the TD erasure: bent to
        Cov(x)^p g so that it removes the variance the TD erasure removes (`variance_matched`).
        Mean- / zero-ablation: the unit direction with u.Cov.u = sigma^2 of the TD direction. LEACE: the
        eraser of the concept whose cross-covariance is Cov(x)^p g (p = 1: the raw concept g.x), with
        the TD eraser's ||c||^2 / c.Cov^+.c. An unmatched control compares edits of different sizes: the
        random draws' effects grow with the variance they remove (docs/causal.md#the-random-control)."""
        td = self.erase(method, which)
        target = erased_variance(self.cov_x, td)
        if method == "leace":
            return leace_edit(self.cov_x, variance_matched(self.cov_x, g, target, leace=True), self.mean_x)
        u = unit(variance_matched(self.cov_x, g, target), "random direction")
        if method == "zero":
            return projection_edit(u, 0.0)
        return projection_edit(u, float(self.mean_x @ u))

    def steer(self, scale: float, direction: np.ndarray | None = None) -> Edit:
        """x -> x + scale * std * unit(direction) (default: the TD direction)."""
        u = self.direction if direction is None else unit(direction, "steering direction")
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


def _probe(X: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray, shuffled: bool = True,
           groups: np.ndarray | None = None) -> dict:
    """Ridge probe with intercept (analyzers.td_probe's RidgeStats: the penalty picked by 5-fold CV over
    the training tasks), its R^2 on training and held-out tasks, and (unless `shuffled` is False) the
    shuffled control (each task's targets replaced by those of the next task of the same fold). Training row j
    lies in CV fold j mod 5, or `groups[j]` mod 5 (`refit`: the copies of a task drawn twice share a fold, so
    no task is scored by a penalty fitted on its own copy)."""
    from ..analyzers import td_probe

    N, n, F = X.shape
    fold = np.full(N, FOLDS, dtype=np.int64)
    fold[train] = (np.arange(train.size) if groups is None else np.asarray(groups)) % FOLDS
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
        out[f"r2_test{key}"] = num(stats[FOLDS].r2(coef, b0))
        if not key:
            out.update({"r2_train": num(pooled.r2(coef, b0)), "alpha": alpha, "coef": coef, "intercept": b0,
                        "n_train": int(pooled.n), "n_test": int(stats[FOLDS].n)})
    if shuffled:
        out["r2_shuffled"] = out.pop("r2_test_shuffled")
    return out


def _construction_direction(model, site: Site, width: int) -> np.ndarray | None:
    if not own_model(model):
        return None
    hints = registry.get(model.config.family).hints
    if site.kind == "scores":  # the family says delta sits in the query row of the scores (LSA: c delta_k)
        return np.ones(1) if width == 1 and "attn.hook_attn_scores" in hints.primary_probe else None
    from ..analyzers.probes import td_direction

    v = td_direction(hints, model.layout)
    return v if v is not None and v.size == width else None


def prepare(model, config, layer: int, *, hook: str | None = None, roles: dict | None = None,
            direction="probe", tasks: int = 256, test_fraction: float = 0.5, seed: int = 0,
            split_seed: int | None = None, batch_size: int = 256, fold: int = 0) -> CausalSetup:
    """Sample `tasks` tasks of `config` (a CheckpointConfig, checkpoint directory or family name) with the
    task sampler's seed `seed`, split them by task (`split_seed`, default `seed`), fit the TD direction at
    (layer, hook) on the training ones and run the held-out ones unedited. `direction`: 'probe' (ridge),
    'construction' (`Hints.td_direction`; scores: the score itself) or an array in feature space. `fold` 1: the
    split's two parts trade places (the held-out tasks train, the training tasks are held out), the second fold
    of a two-fold cross-fit (`measure_selective`'s `others`)."""
    from ..models.construct import task_of

    config = task_of(config)
    tasks = check_int("--tasks", tasks, MIN_TASKS)
    seed = check_int("--prompt-seed", seed)
    split_seed = check_int("--split-seed", seed if split_seed is None else split_seed)
    batch_size = check_int("--batch-size", batch_size, 1)
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
    perm = np.random.default_rng([split_seed, 0x5B1]).permutation(tasks)
    n_test = min(max(2, int(round(tasks * float(test_fraction)))), tasks - FOLDS)
    test, train = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    if fold not in (0, 1):
        raise UserError(f"fold {fold!r}: expected 0 (the split) or 1 (its two parts swapped)")
    if fold:
        test, train = train, test
        if train.size < FOLDS:
            raise UserError(f"--tasks {tasks}: the swapped fold trains on {train.size} tasks, fewer than the "
                            f"probe's {FOLDS} cross-validation folds")
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
            u = unit(probe["coef"], "probe direction (all ridge coefficients are 0)")
        elif direction == "construction":
            if construction is None:
                raise UserError(f"--direction construction: the construction names no TD direction at "
                                f"{site.canonical} of this model (use the probe direction)")
            u = unit(construction, "construction direction")
        else:
            raise UserError(f"--direction {direction!r}: expected one of {', '.join(DIRECTIONS)}")
        source = direction
    else:
        u = np.asarray(direction, dtype=np.float64).ravel()
        if u.size != F:
            raise UserError(f"the direction has {u.size} entries, the features at {site.canonical} have {F}")
        u, source = unit(u, "direction"), "given"
    if F == 1:
        notes.append("feature width 1: every direction is the TD direction up to sign, so the random control "
                     "is not informative")
    yh = y[test]
    resid = yh - (X[test] @ probe["coef"] + probe["intercept"])
    probe_sums = np.stack([(resid ** 2).sum(1), np.full(test.size, float(n)), yh.sum(1), (yh ** 2).sum(1)], 1)
    Xt, yt = X[train].reshape(-1, F), y[train].ravel()
    proj = Xt @ u
    mean_x, cov_x = _moments(Xt)
    cov_xz = (Xt - mean_x).T @ (yt - yt.mean()) / Xt.shape[0]
    truth, truth_kind = _truth(batch, test, fam.hints, width)
    Z = selective.explained_by(config, z, it, n)
    sel = selective.fit(_probe, X, Z, y, train, test)
    return CausalSetup(runner=runner, site=site, family=fam.name, z_test=z[test], base=out[test], truth=truth,
                       truth_kind=truth_kind, direction=u, direction_source=source, mean=float(proj.mean()),
                       std=float(proj.std()), mean_x=mean_x, cov_x=cov_x, cov_xz=cov_xz, probe=probe,
                       train_index=train, test_index=test, batch=batch, notes=notes, probe_sums=probe_sums,
                       features=X, targets=y, selective=sel, explained=Z)


def _moments(Xt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, covariance with divisor m) of the training columns Xt [m, F]."""
    mean_x = Xt.mean(0)
    Xc = Xt - mean_x
    return mean_x, Xc.T @ Xc / Xt.shape[0]


def training_resamples(setup: CausalSetup, refits: int, seed: int, fold: int = 0) -> np.ndarray:
    """[refits, training tasks]: positions in `setup.train_index` drawn with replacement, one row per refit (`refit`);
    a pure function of (`seed`, `fold`)."""
    m = int(setup.train_index.size)
    return np.random.default_rng([int(seed), 0x2EF17, int(fold)]).integers(0, m, size=(int(refits), m))


def refit(setup: CausalSetup, draw: np.ndarray) -> CausalSetup:
    """`setup` with what the selective test fitted on the training tasks fitted again on the resample `draw` of them
    (positions in `train_index`, with replacement): the split of delta, the selective and input-explained probes and
    directions (`selective.fit`), and the training mean and covariance of the features (the mean- and LEACE-erasures'
    and the random directions' size matching). A task drawn twice enters twice, its copies in one CV fold (`_probe`'s
    `groups`). The held-out tasks, the model and the TD direction are `setup`'s."""
    train = setup.train_index[np.sort(np.asarray(draw))]
    m, test = train.size, setup.test_index
    rows = np.concatenate([train, test])
    groups = np.unique(train, return_inverse=True)[1]
    probe = lambda X, y, tr, te, shuffled=True: _probe(X, y, tr, te, shuffled, groups=groups)  # noqa: E731
    X = setup.features[rows]
    sel = selective.fit(probe, X, setup.explained[rows], setup.targets[rows], np.arange(m), np.arange(m, rows.size))
    mean_x, cov_x = _moments(X[:m].reshape(-1, X.shape[-1]))
    return replace(setup, selective=sel, mean_x=mean_x, cov_x=cov_x)


@dataclass
class Measured:
    """One model's effects on the held-out tasks: the JSON statistics and the per-task arrays behind them."""

    erasure: dict
    steering: list
    per_task: dict
    """'output', 'value_error': (TD [N], random [N, K]) of the erasure; 'steer': one such pair per scale."""
    largest: float
    """The largest output change of any edit (TD or random direction, erasure or steering)."""
    selective: dict | None = None
    """The selective test's JSON (`measure_selective`); None where the setup has no selective directions."""


def measure(setup: CausalSetup, method: str, G: np.ndarray, scales, seed: int, n_boot: int,
            others: tuple = (), refits: int = 0) -> Measured:
    """Erase and steer the TD direction of `setup` and the random directions G [K, width] on its
    held-out tasks. The bootstrap resamples are a pure function of `seed`, so two models measured on the
    same tasks share them. `others`: further folds of the same model and tasks (`prepare(..., fold=1)`) whose
    held-out tasks the selective test pools with this one's; `refits`: the selective test's refits of its
    directions on resampled training tasks (`measure_selective`)."""
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
            erasure["output_change"]["td"]["signed"] = {"mean": float(signed.mean()), "ci": interval(signed[idx].mean(1))}
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
    per_task = {"output": (td_abs, r_abs), "value_error": (td_ve, r_ve), "steer": steer}
    sel = None
    if all(f.selective is not None and f.selective.selective is not None and f.selective.input is not None
           for f in (setup, *others)):
        with eval_mode(setup.runner.model):
            sel, arrays = measure_selective(setup, method, G, seed, n_boot, effect=lambda e: effect(e)[0],
                                            others=others, refits=refits)
        per_task["selective"] = arrays
        largest = max(largest, *(float(np.max(a, initial=0.0)) for a in arrays))
    return Measured(erasure, curve, per_task, largest, sel)


def _selective_fold(setup: CausalSetup, method: str, G: np.ndarray, effect) -> dict:
    """One fold's part of the selective test: |Δ output| per held-out task of the selective erasure, the
    input-explained one (shrunk to the selective one's size, and in full) and the random directions G bent to that
    size, with the variances they erase."""
    sel_edit, full_in = setup.erase(method, "selective"), setup.erase(method, "input")
    size, full_size = erased_variance(setup.cov_x, sel_edit), erased_variance(setup.cov_x, full_in)
    # the input-explained erasure shrunk (or stretched) to the selective one's size: x -> x - t c (b.x - m) removes
    # t^2 times the variance, so the comparison is per equal amount erased, as with the random directions
    shrink = float(np.sqrt(size / full_size)) if full_size > 0 else 1.0
    in_edit = Edit(c=shrink * np.asarray(full_in.c), b=full_in.b, m=full_in.m)
    rand_edits = [setup.erase_random(method, g, "selective") for g in G]
    return {"s": effect(sel_edit), "i": effect(in_edit), "i_full": effect(full_in),
            "r": np.stack([effect(e) for e in rand_edits], 1), "shrink": shrink,
            "erased_variance": {"selective": size, "input_explained": erased_variance(setup.cov_x, in_edit),
                                "input_explained_full": full_size,
                                "random": float(np.mean([erased_variance(setup.cov_x, e) for e in rand_edits]))}}


def measure_selective(setup: CausalSetup, method: str, G: np.ndarray, seed: int, n_boot: int, effect=None,
                      others: tuple = (), refits: int = 0):
    """The selective test on the held-out tasks (docs/causal.md, "The selective test"): |Δ output| per task from
    erasing (by `method`) the selective direction, the input-explained one and the random directions G bent to
    the selective erasure's size (the input-explained erasure too: shrunk to that size, and in full); the paired
    excess over random, the paired difference to the size-matched input-explained erasure (in full and, as the
    conclusion reads it, less `conclusion.INPUT_SHARE` of it: `against_input`) and the probe's
    selectivity, all on the same bootstrap resamples (a pure function of `seed`). `effect(edit)` -> |Δ output|
    per held-out task (default: from `setup.output`). `others`: further folds (`prepare(..., fold=1)`: the same
    tasks with the split swapped), each measured on its own held-out tasks with its own fitted directions; every
    per-task statistic is pooled over the folds' held-out tasks and resampled over all of them (cross-fitting: every
    task is measured with directions fitted without it, and all of them are measured), and `crossfit` says per fold
    what was fitted. `refits` R > 0 (docs/causal.md, "Refitting"): every fold's directions are also fitted again on R
    resamples of its training tasks (`training_resamples`, `refit`) and measured on the same held-out tasks;
    bootstrap resample b reads refit 1 + (b mod R) on its resample of the held-out tasks, so the intervals hold how
    the fitted directions vary as well as the held-out tasks; each criterion then gives the resamples' standard
    error `se`, and the refits' own values' mean and SD (`refit_mean`, `refit_sd`). The values (`mean`) are the
    directions fitted on all training tasks (R = 0: the intervals too, as without refits). The JSON's other fields
    are `setup`'s. Returns (JSON, (selective [N], input [N], random [N, K])) over the pooled held-out tasks."""
    refits = int(refits)
    parts = [[_selective_fold(setup, method, G, effect or (lambda e: _change(setup, e)))]
             + [_selective_fold(f, method, G, lambda e, f=f: _change(f, e)) for f in others]]
    folds = (setup, *others)
    if refits:
        fitted = [[refit(f, d) for d in training_resamples(f, refits, seed, k)] for k, f in enumerate(folds)]
        fitted = [[fs[r] for fs in fitted] for r in range(refits)]  # per refit, every fold's
        usable = [fs for fs in fitted if all(f.selective.selective is not None and f.selective.input is not None
                                             for f in fs)]  # a refit whose probe read nothing is left out
        parts += [[_selective_fold(f, method, G, lambda e, f=f: _change(f, e)) for f in fs] for fs in usable]
        fitted = [list(folds)] + usable
    else:
        fitted = [list(folds)]
    s, i, i_full, r = (np.stack([np.concatenate([fold[k] for fold in fit]) for fit in parts])
                       for k in ("s", "i", "i_full", "r"))  # [fits, N] ([fits, N, K]); fit 0: all training tasks
    sums = np.stack([np.concatenate([f.selective.sums for f in fs]) for fs in fitted])
    R, N = s.shape[0] - 1, s.shape[1]
    idx = np.random.default_rng([int(seed), 0x5E1EC7]).integers(0, N, size=(n_boot, N))
    which = np.zeros(n_boot, dtype=np.int64) if R == 0 else 1 + np.arange(n_boot) % R

    def boot(a: np.ndarray) -> dict:
        samples = a[which[:, None], idx].mean(1)
        out = {"mean": float(a[0].mean()), "ci": interval(samples)}
        return {**out, **spread(samples, a[1:].mean(1))} if R else out

    ex = np.stack([excess(a, b) for a, b in zip(s, r)])
    first = parts[0][0]
    cosine = lambda a, b: float(a.selective.selective.u @ b)  # noqa: E731
    out = {**setup.selective.probe, "refits": R,
           "selectivity": selective.selectivity(sums, idx, which),
           "erasure": {"selective": boot(s), "input_explained": boot(i), "input_explained_full": boot(i_full),
                       "input_explained_shrink": first["shrink"], "random": boot(r.mean(2)),
                       "excess_over_random": boot(ex), "minus_input_explained": boot(s - i),
                       "against_input": boot(conclusion.against_input(s, i)),
                       "erased_variance": first["erased_variance"],
                       "cosine_selective_input": cosine(setup, setup.selective.input.u),
                       "cosine_selective_td": cosine(setup, setup.direction)}}
    if others:
        out["crossfit"] = {"folds": len(folds), "held_out_tasks": N,
                           "per_fold": [{"held_out_tasks": int(f.test_index.size),
                                         "r2_test": f.selective.probe["r2_test"],
                                         "cosine_selective_input": cosine(f, f.selective.input.u),
                                         "cosine_selective_first_fold": cosine(f, setup.selective.selective.u),
                                         "erased_variance": part["erased_variance"]}
                                        for f, part in zip(folds, parts[0])]}
    return out, (s[0], i[0], r[0])


def _change(setup: CausalSetup, edit: Edit) -> np.ndarray:
    """|Δ output| per held-out task of `setup` under `edit`."""
    return np.linalg.norm(setup.output(edit) - setup.base, axis=-1)


def conclude(setup: CausalSetup, m: Measured, test_fraction: float) -> tuple[str, str, dict]:
    """`causal.conclusion` of one model: (answer, reason, detail) by `conclusion.decide` (docs/causal.md, "The
    conclusion"). Cross-fitted (`measure_selective`'s `others`), every task is held out once: the held-out count
    is the pooled one and `test_fraction` should be 1."""
    n_test = int(((m.selective or {}).get("crossfit") or {}).get("held_out_tasks", setup.test_index.size))
    note = None
    if m.largest <= 0.0:
        note = ("inconclusive: no edit at this site changes the output (" + (reach_note(setup, 0.0) or "") + ")")
    elif setup.width == 1:
        note = ("inconclusive: the site has one feature, so the selective, input-explained and random directions are "
                "the same direction and cannot be told apart")
    if m.selective is None:
        st = {"mean": None, "ci": None}
        crit = conclusion.criteria(st, st, 0.0, st)
        return conclusion.decide(crit, n_test, test_fraction, note or (
            "inconclusive: the selective or input-explained probe found nothing to read (all its coefficients are 0)"))
    e = m.selective["erasure"]
    crit = conclusion.criteria(m.selective["selectivity"], e["excess_over_random"], e["random"]["mean"],
                               e["against_input"])
    return conclusion.decide(crit, n_test, test_fraction, note)


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


def model_part(setup: CausalSetup, m: Measured, seeds: dict) -> dict:
    """The per-model fields of the section (also those of `baseline`); `seeds`: the tasks' prompt_seed and
    split_seed."""
    probe_out = {k: v for k, v in setup.probe.items() if k not in ("coef", "intercept")}
    note = reach_note(setup, m.largest)
    return {
        "direction": {"source": setup.direction_source, "width": setup.width, "mean": setup.mean, "std": setup.std,
                      **probe_out},
        "tasks": {"train": int(setup.train_index.size), "test": int(setup.test_index.size),
                  **{k: int(v) for k, v in seeds.items()}},
        "value_error": {"target": setup.truth_kind, "base": float(setup.value_error(setup.base).mean())},
        "erasure": m.erasure,
        "steering": m.steering,
        "selective": m.selective,
        "notes": list(setup.notes) + ([note] if note else []),
    }
