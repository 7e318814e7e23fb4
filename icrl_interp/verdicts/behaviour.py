"""The algorithm verdict: which candidate RL algorithm (`icrl_interp.verdicts.candidates`) does a model's forward
pass run, layer by layer (docs/verdict.md; JSON: docs/formats.md, "Verdict JSON").

From a recording, per candidate and layer:

* **behaviour**: the model's layer-l readout y_l (the recorded logit lens `lens/{l}`, the prompt layout's
  readout of `blocks.{l}.hook_resid_post` for a model in the prompt layout, or a tuned linear lens fitted on
  training tasks) against the candidate's output after k steps. The candidate's step sizes and k are fitted
  on training tasks (`candidates.fit`), the score is the held-out R^2 of y_l - y_0 by the candidate's
  c_k - y_0 (y_0: the output before any update, 0 or the prompt's parameters), with a bootstrap interval
  over held-out tasks. Baselines: the mean (R^2 = 0) and a ridge map from the prompt's own summary (the mean
  context column and the last column) to y_l.
* **representation**: ridge probes from layer l's residual stream at each context column to the candidate's
  internal quantities (its TD / regression errors and values at the fitted step), with the input,
  random-init and shuffled baselines and the selectivity interval of `td_probe` (same split by task).
* **causation** (needs the model; `causation` callable, e.g. `icrl_interp.verdicts.causal_evidence`): erasing the
  candidate's probe direction versus random directions.

The verdict of a layer ranks the candidates by held-out behaviour R^2: the best, the runner-up and the
paired margin with its interval; "none fits" when the best does not clear `min_r2` and the baselines;
"reward regression (no bootstrapping)" when the best's fitted gamma' may be 0; clear only when the
Bonferroni-adjusted paired intervals over the runner-up, the input baseline and every decoy explanation
(`decoys`) lie above 0 (and, with the model, its out-of-distribution checks hold: `ood`); otherwise how many
more tasks would likely resolve it. The winner's fitted parameters come with intervals over refits on
resampled training tasks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._version import __version__
from ..analyzers import inputs, td_probe
from ..analyzers.readout import Ridge
from ..core.errors import UserError
from ..families import registry
from ..interventions.statistics import interval
from ..tasks import sampling
from ..tasks.layouts import PromptLayout
from . import candidates as C
from . import decoys as D

SCHEMA = inputs.VERDICT_SCHEMA
FOLDS = 5
"""Training folds of the probes' penalty choice; fold FOLDS is the held-out test set."""
FIT_RESAMPLES = 100
"""Refits on bootstrap resamples of the training tasks, for the fitted parameters' intervals."""


def default_steps(layers: int) -> int:
    """The largest candidate step tried first by default: 2 per layer + 2 (doubled, up to MAX_DOUBLINGS times,
    while a target's best candidate needs all of them: a model may run several steps per layer)."""
    return 2 * int(layers) + 2


MAX_DOUBLINGS = 2


# ------------------------------------------------------------------ data
@dataclass
class VerdictData:
    """What the verdict reads from a recording (or builds from a model run), in memory."""

    z: np.ndarray
    """[N, pos, D] prompts."""
    layout: PromptLayout
    gamma: float
    task_id: np.ndarray
    """[N] task of each prompt."""
    hints: registry.Hints | None
    readouts: dict[int, np.ndarray]
    """layer -> [N, k] the model's layer-l readout."""
    output: np.ndarray
    """[N, k] the model's output."""
    readout_kind: str
    """'lens', 'layout' or 'tuned-linear'."""
    acts: dict[int, np.ndarray] = field(default_factory=dict)
    """layer -> [N, n, F] residual stream after layer l at the context columns 0..n-1 (where recorded)."""
    baseline_acts: dict[int, np.ndarray] = field(default_factory=dict)
    """The same for the architecture at random initialization."""
    resid_last: dict[int, np.ndarray] = field(default_factory=dict)
    """layer -> [N, F] residual stream after layer l at the last position (the tuned lens reads it)."""
    states: np.ndarray | None = None
    policy: np.ndarray | None = None
    """[N, S, A] behaviour policy of MDP tasks."""
    source: str = ""
    task_family: str | None = None
    model_info: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    roles: dict = field(default_factory=dict)
    """[roles] of the probe spec the recording was made with: role -> the recorded model's module path
    (a model of your own; empty for the package's and TransformerLens models). The causal evidence edits
    the model there when no other spec is given."""
    config: object = None
    """The recording's checkpoint config (`models.CheckpointConfig`: its task samples fresh prompts for the
    out-of-distribution checks), or None."""


def _context_features(ds, pos: int, n: int, name: str) -> np.ndarray | None:
    p = inputs.positions(ds.attrs, ds.shape, 1, pos, name)
    keep = np.nonzero(p < n)[0]
    if keep.size != n or not np.array_equal(p[keep], np.arange(n)):
        return None
    X = np.asarray(ds[()][:, keep], dtype=np.float64)
    return X.reshape(X.shape[0], n, -1)


def _last(ds, pos: int, name: str) -> np.ndarray | None:
    p = inputs.positions(ds.attrs, ds.shape, 1, pos, name)
    if pos - 1 not in p:
        return None
    return np.asarray(ds[:, int(np.nonzero(p == pos - 1)[0][0])], dtype=np.float64)


def layout_readout(resid_last: np.ndarray, layout: PromptLayout, hints) -> np.ndarray:
    """The output a model in the prompt layout writes at the last column: the family's output blocks
    ('parameters') or the layout's readout block (with its sign)."""
    if hints is not None and hints.output == "parameters":
        return np.concatenate([resid_last[:, layout.slice(b)] for b in hints.output_blocks], axis=-1)
    return layout.readout_sign * resid_last[:, layout.slice(layout.readout_block)]


def load(path, max_prompts: int = 1024) -> VerdictData:
    """Read a recording's prompts, task labels, readouts and context activations (the first `max_prompts`)."""
    from ..recording.format import Recording

    with Recording(path) as rec:
        f, lay = rec.f, rec.layout
        if lay is None or "prompts/z" not in f:
            raise UserError(f"{path}: the verdict needs prompts in a known layout (the recording has none)")
        N = min(rec.n_prompts, int(max_prompts))
        if N < 2 * FOLDS:
            raise UserError(f"{path}: {N} prompts; the verdict needs at least {2 * FOLDS}")
        z = np.asarray(f["prompts/z"][:N], dtype=np.float64)
        pos, n = z.shape[1], z.shape[1] - 1
        gamma = float(rec.attr("gamma", float("nan")))
        if not np.isfinite(gamma):
            raise UserError(f"{path}: the recording has no discount gamma (record it on a task)")
        fam = registry.find(rec.task_family)
        hints = fam.hints if fam is not None else None
        task_id = np.asarray(f["prompts/task_id"][:N]) if "prompts/task_id" in f else np.arange(N)
        acts, base, readouts, notes = {}, {}, {}, []
        layers = sorted(int(h.split(".")[1]) for h in rec.hooks()
                        if h.startswith("blocks.") and h.endswith(".hook_resid_post") and h.split(".")[1].isdigit())
        resid_last = {}
        for l in layers:
            name = f"blocks.{l}.hook_resid_post"
            ds = f["acts"][name]
            sub = _Head(ds, N)
            X = _context_features(sub, pos, n, name)
            if X is not None:
                acts[l] = X
            else:
                notes.append(f"{name}: not every context column is recorded (no representation evidence there)")
            last = _last(sub, pos, name)
            if last is not None:
                resid_last[l] = last.reshape(N, -1)
            bpath = f"baseline/acts/{name}"
            if bpath in f and f[bpath].shape[1:] == ds.shape[1:]:
                Xb = _context_features(_Head(f[bpath], N), pos, n, bpath)
                if Xb is not None:
                    base[l] = Xb
        lens = sorted(int(k) for k in f["lens"] if k.isdigit()) if "lens" in f else []
        if lens:
            kind = "lens"
            readouts = {l: np.asarray(f[f"lens/{l}"][:N], dtype=np.float64) for l in lens}
        elif resid_last and all(v.shape[-1] == lay.d_model for v in resid_last.values()):
            kind = "layout"
            readouts = {l: layout_readout(v, lay, hints) for l, v in resid_last.items()}
        else:
            kind = "tuned-linear"
            readouts = {}  # fitted below, once the split is known
        if "outputs/model" in f:
            output = np.asarray(f["outputs/model"][:N], dtype=np.float64).reshape(N, -1)
        elif readouts:
            output = readouts[max(readouts)]
        else:
            raise UserError(f"{path}: no model output (outputs/model) and no readable layer output")
        data = VerdictData(
            z=z, layout=lay, gamma=gamma, task_id=task_id, hints=hints, readouts=readouts, output=output,
            readout_kind=kind, acts=acts, baseline_acts=base,
            states=np.asarray(f["prompts/state"][:N]) if "prompts/state" in f else None,
            policy=np.asarray(f["tasks/policy"][:N], dtype=np.float64) if "tasks/policy" in f else None,
            source=str(path), task_family=rec.task_family, model_info=rec.model_info, notes=notes,
            resid_last=resid_last, roles=_recorded_roles(rec.attr("probe_spec")), config=_config(rec))
        return data


def _config(rec):
    """The recording's checkpoint config, or None when it has none or an unreadable one."""
    try:
        return rec.checkpoint_config
    except UserError:
        return None


def _recorded_roles(spec) -> dict:
    """The [roles] table of a recording's `probe_spec` attribute ({} when it has none)."""
    roles = spec.get("roles") if isinstance(spec, dict) else None
    return dict(roles) if isinstance(roles, dict) else {}


class _Head:
    """The first N rows of a dataset, with its attributes (a view for `inputs.positions`)."""

    def __init__(self, ds, N):
        self.ds, self.N, self.attrs = ds, N, ds.attrs
        self.shape = (N,) + tuple(ds.shape[1:])

    def __getitem__(self, idx):
        rows = self.ds[: self.N]
        return rows if idx == () else rows[idx]


# ------------------------------------------------------------------ transitions from prompts
def transitions(data: VerdictData) -> C.Transitions:
    """The candidates' view of the prompts, read by the layout's block names (docs/verdict.md)."""
    lay, z, gamma = data.layout, data.z, data.gamma
    names = set(lay.names)
    ctx = z[:, :-1]
    if {"x", "reward"} <= names:  # a trajectory S_0..S_n with its rewards: softmax-kernel prompts
        x = z[..., lay.slice("x")]
        states = data.states if data.states is not None and np.all(data.states >= 0) else None
        return C.Transitions(x[:, :-1], x[:, 1:], ctx[..., lay.slice("reward")][..., 0], gamma, x=x, states=states)
    if not {"phi", "gamma_phi_next", "reward"} <= names:
        raise UserError(f"the verdict reads transitions from blocks (phi, gamma_phi_next, reward) or (x, reward); "
                        f"this layout has {', '.join(lay.names)}")
    phi = ctx[..., lay.slice("phi")]
    phi_next = sampling.unscale(ctx[..., lay.slice("gamma_phi_next")], gamma)
    rewards = ctx[..., lay.slice("reward")][..., 0]
    if "w" not in names:
        return C.Transitions(phi, phi_next, rewards, gamma, phi_query=z[:, -1, lay.slice("phi")])
    kw = {"w0": z[:, -1, lay.slice("w")]}
    if "score" in names and "lam" in names:
        kw["scores"] = sampling.unscale(ctx[..., lay.slice("score")], gamma ** np.arange(ctx.shape[1]))
        kw["lam0"] = z[:, -1, lay.slice("lam")]
    kw.update(_next_options(phi_next, data.policy))
    return C.Transitions(phi, phi_next, rewards, gamma, **kw)


def _next_options(phi_next: np.ndarray, policy: np.ndarray | None) -> dict:
    """Every action's features at the next state, where the features are state-action one-hot (d = S*A, A from
    the tasks' policy) so the next state can be read off phi'; with the policy there."""
    if policy is None:
        return {}
    _, S, A = policy.shape
    d = phi_next.shape[-1]
    hot = np.isclose(phi_next, 1.0) | np.isclose(phi_next, 0.0)
    if d != S * A or not hot.all() or not np.allclose(phi_next.sum(-1), 1.0):
        return {}
    s_next = np.argmax(phi_next, -1) // A
    table = np.eye(d).reshape(S, A, d)
    return {"next_options": table[s_next], "next_policy": policy[np.arange(policy.shape[0])[:, None], s_next]}


# ------------------------------------------------------------------ statistics
def _task_sums(values: np.ndarray, task: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique tasks, [tasks, c] sums of the rows of `values` [N, c] per task)."""
    uniq, inv = np.unique(task, return_inverse=True)
    out = np.zeros((uniq.size, values.shape[1]))
    np.add.at(out, inv, values)
    return uniq, out


def _num(x):
    return None if x is None or not np.isfinite(x) else float(x)


def _summary(z: np.ndarray) -> np.ndarray:
    """The input baseline's features: the mean context column and the last column of each prompt."""
    return np.concatenate([z[:, :-1].mean(1), z[:, -1]], axis=-1)


# ------------------------------------------------------------------ behaviour
def train_resamples(task: np.ndarray, seed: int, resamples: int) -> np.ndarray | None:
    """[R, N] bootstrap resamples of the training tasks as per-prompt weights (each prompt counts as often as
    its task is drawn), for the intervals of the fitted parameters; None for R = 0."""
    if resamples <= 0:
        return None
    uniq, inv = np.unique(task, return_inverse=True)
    rng = np.random.default_rng([seed, 0xF17])
    draw = rng.integers(0, uniq.size, size=(resamples, uniq.size))
    counts = np.stack([np.bincount(d, minlength=uniq.size) for d in draw]).astype(np.float64)
    return counts[:, inv]


def behaviour(tr: C.Transitions, cands: list[C.Candidate], targets: dict, z: np.ndarray, task: np.ndarray,
              test: np.ndarray, K: int, seed: int, resamples: int, progress: bool = False, fit_resamples: int = 0):
    """Per target (layer or 'output') and candidate: the fit on training prompts (refitted on `fit_resamples`
    resamples of the training tasks), held-out R^2 with its interval, the input-ridge baseline and the decoy
    explanations (`decoys`); plus the bootstrap samples for the margins. Returns (keys, fits, r2 [L, 1 + C + D],
    boot [R, L, 1 + C + D], held-out tasks, decoy names, per-task sums [tasks, L (2 + C + D)]): R^2 columns
    input ridge, candidates, decoys; the sums' columns per target: sst, then the same."""
    train = ~test
    keys = list(targets)
    start = C.td_lambda(tr, 0.0, 0).outputs[:, 0]  # y_0: the output before any update (same for all)
    Y = np.stack([targets[k] - start for k in keys])  # [L, N, k]
    tr_train, tr_test = tr.take(train), tr.take(test)
    from tqdm import tqdm

    W = train_resamples(task[train], seed, fit_resamples)
    fits = {c.name: C.fit(c, tr_train, Y[:, train] + start[train], K, W)
            for c in tqdm(cands, desc="fitting candidates", disable=not progress, leave=False)}
    pred = {}
    for c in cands:
        pred[c.name] = []
        for li, f in enumerate(fits[c.name]):
            out = C.run(c, tr_test, f.hyper, K if f.step is None else f.step).outputs
            pred[c.name].append(out[:, -1 if f.step is not None else 0] - start[test])
    # the input baseline: a ridge map from the prompt's summary to y_l - y_0
    S = _summary(z)
    base = []
    for li in range(len(keys)):
        r = Ridge(S.shape[1], Y.shape[2])
        r.update(S[train], Y[li, train])
        coef, icpt, _ = r.solve()
        base.append(S[test] @ coef + icpt)
    decoy = D.features(tr)
    # per held-out task: sse of each candidate and the baseline, and sst, per target
    Yt = Y[:, test]
    mean = Yt.mean(1, keepdims=True)
    cols = []
    for li in range(len(keys)):
        cols.append(((Yt[li] - mean[li]) ** 2).sum(-1))
        cols.append(((Yt[li] - base[li]) ** 2).sum(-1))
        for c in cands:
            cols.append(((Yt[li] - pred[c.name][li]) ** 2).sum(-1))
        for f in decoy.values():
            cols.append(((Yt[li] - D.fit_predict(f, Y[li], train)[test]) ** 2).sum(-1))
    M = np.stack(cols, 1)
    _, sums = _task_sums(M, task[test])
    width = 2 + len(cands) + len(decoy)
    point = sums.sum(0)
    boot = np.concatenate(list(td_probe.resampled_sums(sums, seed, resamples)), axis=0)

    def r2(tot):
        tot = tot.reshape(*tot.shape[:-1], len(keys), width)
        with np.errstate(divide="ignore", invalid="ignore"):
            return 1.0 - tot[..., 1:] / tot[..., :1]  # [.., L, 1 + C + D]: baseline, candidates, decoys

    return keys, fits, r2(point), r2(boot), int(sums.shape[0]), list(decoy), sums


# ------------------------------------------------------------------ representation
def representation(X: np.ndarray, Xin: np.ndarray, Xbase: np.ndarray | None, targets: dict[str, np.ndarray],
                   task: np.ndarray, seed: int, test_fraction: float, resamples: int) -> dict:
    """Ridge probes from X [N, n, F] to every target [N, n] with the input / random-init / shuffled
    baselines (`td_probe`), and the selectivity (R^2 minus the best baseline) with a bootstrap interval over
    held-out tasks."""
    names = list(targets)
    Y = np.stack([targets[k] for k in names], -1)  # [N, n, T]
    N = Y.shape[0]
    chain = td_probe.PartnerChain()
    _, partner = chain.link(np.ones(N, bool), task, np.arange(N), Y)
    keep = np.isfinite(partner).all((1, 2))
    fold = td_probe.task_folds(task, seed, test_fraction, FOLDS)
    grouping = td_probe.fold_grouping(fold, keep, FOLDS)
    T = len(names)
    Yp = np.where(np.isfinite(partner), partner, 0.0)
    results, sums = {}, {}
    test = (fold == FOLDS) & keep
    for key, feats, tg in (("model", X, [Y, Yp]), ("input", Xin, [Y]), ("random_init", Xbase, [Y])):
        if feats is None:
            continue
        acc = td_probe.ProbeAccumulator(feats.shape[-1], T * len(tg), FOLDS)
        acc.update(feats, tg, grouping)
        res = acc.result()
        results[key] = res
        full = np.concatenate(tg, -1)
        sums[key] = td_probe.residual_sums(feats[test], full[test], res["coef"], res["intercept"])
    # per held-out task: sse of model, input, random_init, shuffled, then n, sum y, sum y^2 per target
    Yt = Y[test]
    cnt = np.full((Yt.shape[0], T), float(Yt.shape[1]))
    blocks = [sums["model"][:, :T], sums["input"]]
    kinds = ["model", "input"]
    if "random_init" in sums:
        blocks.append(sums["random_init"])
        kinds.append("random_init")
    blocks.append(sums["model"][:, T:])
    kinds.append("shuffled")
    # the shuffled control is scored against the partner's targets
    Ypt = Yp[test]
    blocks += [cnt, Yt.sum(1), (Yt ** 2).sum(1), Ypt.sum(1), (Ypt ** 2).sum(1)]
    M = np.concatenate(blocks, 1)
    _, per_task = _task_sums(M, task[test])
    nk = len(kinds)

    def sel(tot):
        parts = tot.reshape(*tot.shape[:-1], nk + 5, T)
        n_, sy, syy, spy, spyy = (parts[..., nk + i, :] for i in range(5))
        r2 = [td_probe.r2_of_sums(parts[..., i, :], n_, sy, syy) for i in range(nk - 1)]
        r2.append(td_probe.r2_of_sums(parts[..., nk - 1, :], n_, spy, spyy))
        r2 = np.stack(r2, -2)  # [.., kinds, T]
        return r2, r2[..., 0, :] - td_probe.max_baseline(r2[..., 1:, :])

    r2, s = sel(per_task.sum(0))
    boot = np.concatenate([sel(b)[1] for b in td_probe.resampled_sums(per_task, seed, resamples)], 0)
    out = {}
    for t, name in enumerate(names):
        out[name] = {f"r2{'' if k == 'model' else '_' + k}": _num(r2[i, t]) for i, k in enumerate(kinds)}
        out[name]["selectivity"] = _num(s[t])
        out[name]["selectivity_ci"] = interval(boot[:, t]) if per_task.shape[0] >= td_probe.MIN_CI_TASKS else None
        out[name]["coef"] = results["model"]["coef"][:, t]
        out[name]["intercept"] = float(results["model"]["intercept"][t])
    if Xbase is None:
        for v in out.values():
            v["r2_random_init"] = None
    return out


# ------------------------------------------------------------------ the decision
ADJUSTED_TAIL = 10
"""Bootstrap samples beyond each end of an adjusted interval (`adjusted_resamples`)."""
REWARD_REGRESSION = "reward_regression"
"""The name the verdict gives a bootstrapping candidate whose fitted gamma' may be 0 (`label`)."""
REWARD_LABEL = "reward regression (no bootstrapping)"


def label(c: C.Candidate, fit: C.Fit, task_gamma: float) -> tuple[str, str, str]:
    """(name, label, what the text calls it) of a candidate at its fit: a bootstrapping candidate whose gamma'
    interval holds 0 regresses on the immediate reward (every TD variant is the same algorithm there) and is
    never called TD; the text of one with another discount than the task's says so."""
    g = fit.hyper.get("gamma")
    if g is None:
        return c.name, c.name, c.name
    ci = fit.interval("gamma") or [g, g]
    if g == 0.0 or ci[0] <= 0.0:
        return REWARD_REGRESSION, REWARD_LABEL, REWARD_LABEL
    if g == task_gamma:
        return c.name, c.name, c.name
    return c.name, c.name, f"{c.name} with discount {g:g} [{ci[0]:g}, {ci[1]:g}] (the task's: {task_gamma:g})"


def adjusted(diff: np.ndarray, comparisons: int):
    """The Bonferroni-adjusted two-sided 95 % percentile interval of a paired difference's bootstrap samples:
    the 2.5 / m and 100 - 2.5 / m percentiles (m = `comparisons`; m = 1 is the plain 95 % interval). None when
    fewer than 95 % of the samples are finite. The caller draws enough resamples for the tail
    (`adjusted_resamples`)."""
    ok = diff[np.isfinite(diff)]
    if ok.size < max(2, 0.95 * diff.size):
        return None
    tail = 2.5 / max(int(comparisons), 1)
    return [float(np.percentile(ok, tail)), float(np.percentile(ok, 100.0 - tail))]


def adjusted_resamples(comparisons: int, resamples: int) -> int:
    """Resamples for a percentile at 2.5 % / comparisons with ADJUSTED_TAIL samples beyond it (at least
    `resamples`)."""
    return max(int(resamples), int(np.ceil(ADJUSTED_TAIL * max(int(comparisons), 1) / 0.025)))


def decide(names: list[str], r2: np.ndarray, boot: np.ndarray, baseline: float, baseline_boot: np.ndarray,
           min_r2: float, *, decoys: dict | None = None, comparisons: int = 1, n_tasks: int | None = None,
           labels: dict | None = None, draw=None) -> dict:
    """Best and runner-up by held-out behaviour R^2, the paired margin with its bootstrap interval, whether the
    best fits at all (its interval clears `min_r2` and the input baseline's point value), and whether it is
    clear: the Bonferroni-adjusted intervals (`comparisons` in the family) of its paired differences with the
    runner-up, the input baseline and every decoy (`decoys`: name -> (r2, samples)) all lie above 0.
    Candidates whose held-out scores equal the best's on every resample make the same predictions: they are
    `equivalent`, not runners-up. `labels`: candidate -> (name, label, text) (`label`); `n_tasks`: held-out
    tasks, to say how many more would likely resolve a verdict that is not clear. `draw(columns)` -> [R, c]:
    R^2 samples of a larger paired bootstrap for the adjusted intervals, columns: a candidate's index,
    'input' or a decoy's name (None: the adjusted intervals use `boot`)."""
    labels = labels or {}
    order = np.argsort(-np.where(np.isfinite(r2), r2, -np.inf), kind="stable")
    b = order[0]
    best = names[b]
    ci = interval(boot[:, b])
    same = [j for j in order[1:] if r2[j] == r2[b] and np.array_equal(boot[:, j], boot[:, b], equal_nan=True)]
    rest = [j for j in order[1:] if j not in same]
    name, label_, text_name = labels.get(best, (best, best, best))
    out = {"best": best, "label": label_, "name": name, "best_r2": _num(r2[b]), "best_r2_ci": ci,
           "equivalent": [names[j] for j in same], "runner_up": None, "margin": None, "margin_ci": None,
           "margin_ci_adjusted": None, "comparisons": int(comparisons)}
    checks = {}

    def check(key, other, other_boot, column):
        d = float(r2[b] - other)
        if draw is None:
            diff = boot[:, b] - other_boot
        else:
            s_ = draw([int(b), column])
            diff = s_[:, 0] - s_[:, 1]
        adj = adjusted(diff, comparisons)
        checks[key] = {"difference": _num(d), "ci_adjusted": adj, "passes": bool(adj is not None and adj[0] > 0)}

    if rest:
        out["runner_up"] = names[rest[0]]
        out["margin"] = _num(r2[b] - r2[rest[0]])
        out["margin_ci"] = interval(boot[:, b] - boot[:, rest[0]])
        check("runner_up", r2[rest[0]], boot[:, rest[0]], int(rest[0]))
        out["margin_ci_adjusted"] = checks["runner_up"]["ci_adjusted"]
    if np.isfinite(baseline):
        check("input_ridge", baseline, baseline_boot, "input")
    for k, (r, s_) in (decoys or {}).items():
        check(k, r, s_, k)
    lo = ci[0] if ci else -np.inf
    base_ok = not np.isfinite(baseline) or lo > baseline
    fits = bool(r2[b] >= min_r2 and base_ok and lo > 0)
    failing = [k for k, v in checks.items() if not v["passes"]]
    clear = bool(fits and rest and not failing)
    out.update(fits=fits, clear=clear, checks=checks, more_tasks=None)
    if not fits:  # the model-level `best` is null here: the text names the closest candidate, not a best one
        out["text"] = (f"none fits: the closest candidate ({best}) has held-out R^2 {out['best_r2']:.3g}"
                       f" (needs >= {min_r2:g}, an interval above 0 and above the input baseline {baseline:.3g})")
        return out
    if clear:
        out["text"] = f"{text_name} (margin over {out['runner_up']}: {out['margin']:.3g}, interval above 0)"
        return out
    if not rest:
        out["text"] = text_name
        return out
    if "runner_up" in failing:
        out["text"] = (f"{text_name}, not separated from {out['runner_up']} (margin {out['margin']:.3g}, adjusted "
                       f"interval {_fmt(out['margin_ci_adjusted'])} includes 0)")
    else:
        out["text"] = f"{text_name}, not clear: it does not beat {', '.join(failing)} (adjusted intervals include 0)"
    out["more_tasks"] = more_tasks({k: checks[k] for k in failing}, n_tasks)
    if out["more_tasks"] is not None:
        out["text"] += f"; about {out['more_tasks']['held_out_tasks_needed']} held-out tasks would likely resolve it"
    return out


def _fmt(ci) -> str:
    return "null" if ci is None else f"[{ci[0]:.3g}, {ci[1]:.3g}]"


def more_tasks(failing: dict, n_tasks: int | None) -> dict | None:
    """How many held-out tasks would likely make every failing comparison's adjusted interval exclude 0: the
    interval's half-width h shrinks as sqrt(n_now / n), so n = n_now (h / d)^2 for a difference d > 0. None
    when a failing difference is not above 0 (more tasks would not make it positive) or nothing is known."""
    if not failing or not n_tasks:
        return None
    need = 0.0
    for v in failing.values():
        d, ci = v["difference"], v["ci_adjusted"]
        if d is None or ci is None or d <= 0:
            return None
        need = max(need, n_tasks * ((ci[1] - ci[0]) / 2 / d) ** 2)
    return {"held_out_tasks_now": int(n_tasks), "held_out_tasks_needed": int(np.ceil(need))}


def _grows(steps: list, cis: list | None = None) -> bool | None:
    """Whether the fitted step grows with depth: never falls and ends higher, and (with the steps' intervals
    `cis`) the first layer's interval lies below the last's. None with fewer than two steps (closed forms)."""
    keep = [i for i, k in enumerate(steps) if k is not None]
    s = [steps[i] for i in keep]
    if len(s) < 2:
        return None
    grows = all(b >= a for a, b in zip(s, s[1:])) and s[-1] > s[0]
    if cis is not None:
        first, last = cis[keep[0]], cis[keep[-1]]
        grows = grows and first is not None and last is not None and first[1] < last[0]
    return bool(grows)


def growth(fits: list[C.Fit]) -> dict:
    """A candidate's fitted steps per layer with their intervals, whether they grow with depth, and the steps per
    layer: the mean increase (k_last - k_first) / (layers - 1), with its interval over the refits."""
    steps = [f.step for f in fits]
    cis = [f.interval("step") if f.step is not None else None for f in fits]
    out = {"steps": steps, "step_ci": cis, "grows_with_layer": _grows(steps, cis), "steps_per_layer": None}
    if len(fits) >= 2 and steps[0] is not None and steps[-1] is not None:
        per = {"value": (steps[-1] - steps[0]) / (len(fits) - 1), "ci": None}
        if "step" in fits[0].samples:
            per["ci"] = C.outward_interval((fits[-1].samples["step"] - fits[0].samples["step"]) / (len(fits) - 1))
        out["steps_per_layer"] = per
    return out


def params(c: C.Candidate, fit: C.Fit, fits: dict, cands: list[C.Candidate], li: int, task_gamma: float) -> dict:
    """The winner's fitted parameters with intervals over the refits on resampled training tasks: its step sizes,
    gamma' (fixed at the task's for a candidate without a discount fit: ci null), lambda for the TD(lambda)
    family (which member wins each refit) and the step k."""
    out = {k: {"value": float(v), "ci": fit.interval(k)} for k, v in fit.hyper.items()}
    if "gamma" not in out:
        out["gamma"] = {"value": float(task_gamma), "ci": None, "fixed": True}
    if c.family_lambda is not None:
        fam = [x for x in cands if x.family_lambda is not None and fits[x.name][li].boot_sse is not None]
        ci = None
        if fam and c in fam:
            sse = np.stack([fits[x.name][li].boot_sse for x in fam])  # [members, R]
            ci = C.outward_interval(np.array([x.family_lambda for x in fam])[np.argmin(sse, 0)])
            ci = [min(ci[0], c.family_lambda), max(ci[1], c.family_lambda)]
        out["lambda"] = {"value": float(c.family_lambda), "ci": ci}
    if fit.step is not None:
        out["step"] = {"value": int(fit.step), "ci": fit.interval("step")}
    return out


# ------------------------------------------------------------------ the whole verdict
def run(data: VerdictData, *, candidates=None, steps: int | None = None, test_fraction: float = 0.3, seed: int = 0,
        resamples: int = 1000, min_r2: float = 0.5, causation=None, progress: bool = False,
        fit_resamples: int = FIT_RESAMPLES) -> dict:
    """The verdict JSON (`icrl_interp.verdict/2`) of `data`. `causation(data, layer, directions, test)` (optional)
    returns the causal evidence of a layer given each candidate's probe direction (needs the model).
    `fit_resamples`: refits on resampled training tasks for the parameters' intervals (0: none)."""
    if not 0.0 < float(test_fraction) < 1.0:
        raise UserError(f"test fraction must lie in (0, 1), got {test_fraction}")
    tr = transitions(data)
    cands, why = C.applicable(tr, candidates)
    if not cands:
        raise UserError("no candidate applies to these prompts: " + "; ".join(f"{k}: {v}" for k, v in why.items()))
    fold = td_probe.task_folds(data.task_id, seed, test_fraction, FOLDS)
    test = fold == FOLDS
    if test.sum() < 2 or (~test).sum() < 2:
        raise UserError("too few tasks for a held-out split: record more tasks")
    if data.readout_kind == "tuned-linear":
        data.readouts = _tuned(data, ~test)
    layers = sorted(data.readouts)
    K = int(steps) if steps is not None else default_steps(len(layers))
    targets = {**{l: data.readouts[l] for l in layers}, "output": data.output}
    widths = {v.shape[-1] for v in targets.values()}
    out_width = C.td_lambda(tr.take(slice(0, 1)), 0.0, 0).outputs.shape[-1]
    if widths != {out_width}:
        raise UserError(f"the model's outputs have width {sorted(widths)}, the candidates' {out_width}")
    names = [c.name for c in cands]
    for doubling in range(MAX_DOUBLINGS + 1):
        keys, fits, r2, boot, n_test_tasks, decoy_names, sums = behaviour(
            tr, cands, targets, data.z, data.task_id, test, K, seed, resamples, progress, fit_resamples)
        scores = np.where(np.isfinite(r2[:, 1:1 + len(cands)]), r2[:, 1:1 + len(cands)], -np.inf)
        leaders = [cands[int(j)] for j in np.argmax(scores, 1)]  # each target's best candidate
        if steps is not None or doubling == MAX_DOUBLINGS or all(fits[c.name][li].step != K
                                                                 for li, c in enumerate(leaders)):
            break
        K *= 2  # a target's best candidate used every step tried: it may run more
    nc = len(cands)
    comparisons = len(keys) * (nc + len(decoy_names))  # every target x (the other candidates, input, decoys)
    width = 2 + nc + len(decoy_names)
    n_adjusted = adjusted_resamples(comparisons, resamples)

    def drawer(li: int):
        """R^2 samples of target li's columns on n_adjusted resamples (the same tasks for every column), drawn
        once: draw(columns) picks a candidate's index, 'input' or a decoy's name."""
        tot = np.concatenate(list(td_probe.resampled_sums(sums[:, li * width:(li + 1) * width], seed, n_adjusted)))
        with np.errstate(divide="ignore", invalid="ignore"):
            r2_all = 1.0 - tot[:, 1:] / tot[:, :1]  # [R, 1 + C + D]: input, candidates, decoys

        def draw(columns):
            return r2_all[:, [0 if c == "input" else 1 + nc + decoy_names.index(c) if isinstance(c, str) else 1 + c
                              for c in columns]]
        return draw

    sections = []
    for li, key in enumerate(keys):
        dcol = {d: 1 + nc + i for i, d in enumerate(decoy_names)}
        entry = {"layer": key, "behaviour": {}, "baselines": {
            "mean": 0.0, "input_ridge": {"r2": _num(r2[li, 0]), "ci": interval(boot[:, li, 0])},
            "decoys": {d: {"r2": _num(r2[li, j]), "ci": interval(boot[:, li, j])} for d, j in dcol.items()}}}
        for ci_, c in enumerate(cands):
            f = fits[c.name][li]
            entry["behaviour"][c.name] = {"r2": _num(r2[li, 1 + ci_]), "ci": interval(boot[:, li, 1 + ci_]),
                                          **f.to_json()}
        entry["verdict"] = decide(names, r2[li, 1:1 + nc], boot[:, li, 1:1 + nc], float(r2[li, 0]), boot[:, li, 0],
                                  min_r2, decoys={d: (r2[li, j], boot[:, li, j]) for d, j in dcol.items()},
                                  comparisons=comparisons, n_tasks=n_test_tasks,
                                  labels={c.name: label(c, fits[c.name][li], data.gamma) for c in cands},
                                  draw=drawer(li))
        if key != "output":
            entry["representation"], directions = _representation(data, tr, cands, fits, li, key, seed,
                                                                  test_fraction, resamples)
            if causation is None:
                entry["causation"] = {"available": False, "reason": "needs the model (a recording alone cannot be "
                                      "edited): give the model to compute it"}
            elif directions:
                entry["causation"] = causation(data, key, directions, test)
            else:
                entry["causation"] = {"available": False, "reason": "no probe directions at this layer"}
            _agree(entry)
        sections.append(entry)
    step_growth = {c.name: growth([fits[c.name][li] for li, k in enumerate(keys) if k != "output"]) for c in cands}
    final = sections[-1]["verdict"]
    top = next(c for c in cands if c.name == final["best"])
    more = final["more_tasks"] and {**final["more_tasks"], "tasks_to_record": int(np.ceil(
        final["more_tasks"]["held_out_tasks_needed"] / float(test_fraction)))}
    if fits[top.name][-1].step == K:
        data.notes.append(f"{top.name}'s fitted step at the output is the largest tried (K = {K}): it may run more "
                          "steps; raise --max-step")
    return {
        "schema": SCHEMA, "source": data.source,
        "versions": {"icrl_interp": __version__, "numpy": np.__version__},
        "task": {"family": data.task_family, "output": None if data.hints is None else data.hints.output,
                 "n": int(tr.shape[1]), "gamma": data.gamma, "output_width": out_width},
        "model": data.model_info,
        "settings": {"split_seed": int(seed), "test_fraction": float(test_fraction), "bootstrap": int(resamples),
                     "fit_bootstrap": int(fit_resamples), "max_steps": K, "min_r2": float(min_r2),
                     "n_prompts": int(data.z.shape[0]), "n_test_prompts": int(test.sum()),
                     "n_test_tasks": n_test_tasks, "n_train_tasks": int(np.unique(data.task_id[~test]).size),
                     "comparisons": comparisons, "adjusted_bootstrap": n_adjusted,
                     "gamma_grid": [float(g) for g in C.gamma_grid(data.gamma)]},
        "readout": {"kind": data.readout_kind, "description": READOUTS[data.readout_kind]},
        "candidates": {**{c.name: {"applicable": True, "description": c.description,
                                   "hyperparameters": sorted(c.grid) + (["gamma"] if c.discount else [])}
                          for c in cands},
                       **{k: {"applicable": False, "reason": v} for k, v in why.items()}},
        "layers": [s for s in sections if s["layer"] != "output"],
        "output": sections[-1],
        "step_growth": step_growth,
        "verdict": {"best": final["name"] if final["fits"] else None,
                    "candidate": final["best"] if final["fits"] else None,
                    "label": final["label"] if final["fits"] else "none fits",
                    "params": {**params(top, fits[top.name][-1], fits, cands, len(keys) - 1, data.gamma),
                               **({"steps_per_layer": step_growth[top.name]["steps_per_layer"]}
                                  if step_growth[top.name]["steps_per_layer"] else {})} if final["fits"] else {},
                    "equivalent": final["equivalent"], "runner_up": final["runner_up"],
                    "margin": final["margin"], "margin_ci": final["margin_ci"],
                    "margin_ci_adjusted": final["margin_ci_adjusted"], "comparisons": comparisons,
                    "checks": final["checks"], "fits": final["fits"], "clear": final["clear"], "ood": None,
                    "more_tasks": more or None, "text": final["text"]},
        "notes": data.notes,
    }


READOUTS = {
    "lens": "the model's own readout applied to each layer's residual stream at the last position (lens/{l})",
    "layout": "the prompt layout's output block of each layer's residual stream at the last column",
    "tuned-linear": "a ridge map per layer from the residual stream at the last position to the model's output, "
                    "fitted on the training tasks",
}


def _tuned(data: VerdictData, train: np.ndarray) -> dict[int, np.ndarray]:
    out = {}
    for l, X in data.resid_last.items():
        r = Ridge(X.shape[1], data.output.shape[1])
        r.update(X[train], data.output[train])
        coef, icpt, _ = r.solve()
        out[l] = X @ coef + icpt
    if not out:
        raise UserError("no layer readout: record blocks.{l}.hook_resid_post with the last position, or a lens")
    return out


def _representation(data, tr, cands, fits, li, layer, seed, test_fraction, resamples):
    """Probe evidence of every candidate's internals at its fitted step for this layer."""
    if layer not in data.acts:
        return {"available": False, "reason": f"blocks.{layer}.hook_resid_post: context columns not recorded"}, {}
    targets, owner = {}, {}
    for c in cands:
        f = fits[c.name][li]
        trace = C.run(c, tr, f.hyper, f.step or 0)
        k = -1 if f.step is not None else 0
        for q, v in trace.internals.items():
            if np.ptp(v[:, k]) > 0:
                targets[f"{c.name}.{q}"] = v[:, k]
                owner[f"{c.name}.{q}"] = c.name
    if not targets:
        return {"available": False, "reason": "every candidate's internals are constant"}, {}
    n = tr.shape[1]
    res = representation(data.acts[layer], data.z[:, :n], data.baseline_acts.get(layer), targets, data.task_id,
                         seed, test_fraction, resamples)
    per, directions = {}, {}
    for name, r in res.items():
        c = owner[name]
        coef = r.pop("coef")
        icpt = r.pop("intercept")
        per.setdefault(c, {})[name[len(c) + 1:]] = r
        best = directions.get(c)
        if np.any(coef) and (best is None or (r["selectivity"] or -np.inf) > best[2]):
            directions[c] = (coef, icpt, r["selectivity"] if r["selectivity"] is not None else -np.inf)
    summary = {}
    for c, qs in per.items():
        sel = [(q, v["selectivity"]) for q, v in qs.items() if v["selectivity"] is not None]
        q, s = max(sel, key=lambda t: t[1]) if sel else (None, None)
        summary[c] = {"quantities": qs, "best_quantity": q, "best_selectivity": s,
                      "best_selectivity_ci": qs[q]["selectivity_ci"] if q else None}
    return {"available": True, "random_init": layer in data.baseline_acts, "candidates": summary}, \
        {c: v[0] for c, v in directions.items()}


def _agree(entry: dict) -> None:
    """Whether representation and causation point at the behaviour verdict's candidate."""
    best = entry["verdict"]["best"]
    rep = entry.get("representation", {})
    if rep.get("available"):
        scores = {c: v["best_selectivity"] for c, v in rep["candidates"].items() if v["best_selectivity"] is not None}
        top = max(scores, key=scores.get) if scores else None
        entry["verdict"]["representation_top"] = top
    cau = entry.get("causation", {})
    if cau.get("available"):
        entry["verdict"]["causation_top"] = cau.get("top")
