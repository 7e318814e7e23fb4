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
paired margin with its interval; "none fits" when the best does not clear `min_r2` and the baselines.
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

SCHEMA = inputs.VERDICT_SCHEMA
FOLDS = 5
"""Training folds of the probes' penalty choice; fold FOLDS is the held-out test set."""


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
            resid_last=resid_last, roles=_recorded_roles(rec.attr("probe_spec")))
        return data


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
def behaviour(tr: C.Transitions, cands: list[C.Candidate], targets: dict, z: np.ndarray, task: np.ndarray,
              test: np.ndarray, K: int, seed: int, resamples: int, progress: bool = False):
    """Per target (layer or 'output') and candidate: the fit on training prompts, held-out R^2 with its
    interval, and the input-ridge baseline; plus the bootstrap samples for the margins."""
    train = ~test
    keys = list(targets)
    start = C.td_lambda(tr, 0.0, 0).outputs[:, 0]  # y_0: the output before any update (same for all)
    Y = np.stack([targets[k] - start for k in keys])  # [L, N, k]
    tr_train, tr_test = tr.take(train), tr.take(test)
    from tqdm import tqdm

    fits = {c.name: C.fit(c, tr_train, Y[:, train] + start[train], K)
            for c in tqdm(cands, desc="fitting candidates", disable=not progress, leave=False)}
    pred = {}
    for c in cands:
        pred[c.name] = []
        for li, f in enumerate(fits[c.name]):
            out = c.run(tr_test, f.hyper, K if f.step is None else f.step).outputs
            pred[c.name].append(out[:, -1 if f.step is not None else 0] - start[test])
    # the input baseline: a ridge map from the prompt's summary to y_l - y_0
    S = _summary(z)
    base = []
    for li in range(len(keys)):
        r = Ridge(S.shape[1], Y.shape[2])
        r.update(S[train], Y[li, train])
        coef, icpt, _ = r.solve()
        base.append(S[test] @ coef + icpt)
    # per held-out task: sse of each candidate and the baseline, and sst, per target
    Yt = Y[:, test]
    mean = Yt.mean(1, keepdims=True)
    cols = []
    for li in range(len(keys)):
        cols.append(((Yt[li] - mean[li]) ** 2).sum(-1))
        cols.append(((Yt[li] - base[li]) ** 2).sum(-1))
        for c in cands:
            cols.append(((Yt[li] - pred[c.name][li]) ** 2).sum(-1))
    M = np.stack(cols, 1)
    _, sums = _task_sums(M, task[test])
    width = 2 + len(cands)
    point = sums.sum(0)
    boot = np.concatenate(list(td_probe.resampled_sums(sums, seed, resamples)), axis=0)

    def r2(tot):
        tot = tot.reshape(*tot.shape[:-1], len(keys), width)
        with np.errstate(divide="ignore", invalid="ignore"):
            return 1.0 - tot[..., 1:] / tot[..., :1]  # [.., L, 1 + C]: baseline, candidates

    return keys, fits, r2(point), r2(boot), int(sums.shape[0])


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
def decide(names: list[str], r2: np.ndarray, boot: np.ndarray, baseline: float, baseline_boot: np.ndarray,
           min_r2: float) -> dict:
    """Best and runner-up by held-out behaviour R^2, the paired margin with its bootstrap interval, and
    whether the best fits at all (its interval clears `min_r2` and the input baseline's point value)."""
    order = np.argsort(-np.where(np.isfinite(r2), r2, -np.inf), kind="stable")
    best = names[order[0]]
    ci = interval(boot[:, order[0]])
    out = {"best": best, "best_r2": _num(r2[order[0]]), "best_r2_ci": ci, "runner_up": None, "margin": None,
           "margin_ci": None}
    if len(names) > 1:
        out["runner_up"] = names[order[1]]
        out["margin"] = _num(r2[order[0]] - r2[order[1]])
        out["margin_ci"] = interval(boot[:, order[0]] - boot[:, order[1]])
    lo = ci[0] if ci else -np.inf
    base_ok = not np.isfinite(baseline) or lo > baseline
    fits = bool(r2[order[0]] >= min_r2 and base_ok and lo > 0)
    clear = bool(fits and out["margin_ci"] is not None and out["margin_ci"][0] > 0)
    out["fits"] = fits
    out["clear"] = clear
    if not fits:  # the model-level `best` is null here: the text names the closest candidate, not a best one
        out["text"] = (f"none fits: the closest candidate ({best}) has held-out R^2 {out['best_r2']:.3g}"
                       f" (needs >= {min_r2:g}, an interval above 0 and above the input baseline {baseline:.3g})")
    elif clear:
        out["text"] = f"{best} (margin over {out['runner_up']}: {out['margin']:.3g}, interval above 0)"
    else:
        out["text"] = (f"{best}, not separated from {out['runner_up']} (margin {out['margin']:.3g}, interval "
                       f"{out['margin_ci']} includes 0)" if out["runner_up"] else best)
    return out


def _grows(steps: list) -> bool | None:
    s = [k for k in steps if k is not None]
    if len(s) < 2:
        return None
    return bool(all(b >= a for a, b in zip(s, s[1:])) and s[-1] > s[0])


# ------------------------------------------------------------------ the whole verdict
def run(data: VerdictData, *, candidates=None, steps: int | None = None, test_fraction: float = 0.3, seed: int = 0,
        resamples: int = 1000, min_r2: float = 0.5, causation=None, progress: bool = False) -> dict:
    """The verdict JSON (`icrl_interp.verdict/1`) of `data`. `causation(data, layer, directions, test)` (optional)
    returns the causal evidence of a layer given each candidate's probe direction (needs the model)."""
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
    K = int(steps) if steps is not None else max(2 * len(layers) + 2, 4)
    targets = {**{l: data.readouts[l] for l in layers}, "output": data.output}
    widths = {v.shape[-1] for v in targets.values()}
    out_width = C.td_lambda(tr.take(slice(0, 1)), 0.0, 0).outputs.shape[-1]
    if widths != {out_width}:
        raise UserError(f"the model's outputs have width {sorted(widths)}, the candidates' {out_width}")
    names = [c.name for c in cands]
    keys, fits, r2, boot, n_test_tasks = behaviour(tr, cands, targets, data.z, data.task_id, test, K, seed, resamples,
                                                   progress)
    sections = []
    for li, key in enumerate(keys):
        entry = {"layer": key, "behaviour": {}, "baselines": {
            "mean": 0.0, "input_ridge": {"r2": _num(r2[li, 0]), "ci": interval(boot[:, li, 0])}}}
        for ci_, c in enumerate(cands):
            f = fits[c.name][li]
            entry["behaviour"][c.name] = {"r2": _num(r2[li, 1 + ci_]), "ci": interval(boot[:, li, 1 + ci_]),
                                          **f.to_json()}
        entry["verdict"] = decide(names, r2[li, 1:], boot[:, li, 1:], float(r2[li, 0]), boot[:, li, 0], min_r2)
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
    growth = {c.name: {"steps": [fits[c.name][li].step for li, k in enumerate(keys) if k != "output"]}
              for c in cands}
    for g in growth.values():
        g["grows_with_layer"] = _grows(g["steps"])
    final = sections[-1]["verdict"]
    return {
        "schema": SCHEMA, "source": data.source,
        "versions": {"icrl_interp": __version__, "numpy": np.__version__},
        "task": {"family": data.task_family, "output": None if data.hints is None else data.hints.output,
                 "n": int(tr.shape[1]), "gamma": data.gamma, "output_width": out_width},
        "model": data.model_info,
        "settings": {"split_seed": int(seed), "test_fraction": float(test_fraction), "bootstrap": int(resamples),
                     "max_steps": K, "min_r2": float(min_r2), "n_prompts": int(data.z.shape[0]),
                     "n_test_prompts": int(test.sum()), "n_test_tasks": n_test_tasks},
        "readout": {"kind": data.readout_kind, "description": READOUTS[data.readout_kind]},
        "candidates": {**{c.name: {"applicable": True, "description": c.description,
                                   "hyperparameters": sorted(c.grid)} for c in cands},
                       **{k: {"applicable": False, "reason": v} for k, v in why.items()}},
        "layers": [s for s in sections if s["layer"] != "output"],
        "output": sections[-1],
        "step_growth": growth,
        "verdict": {"best": final["best"] if final["fits"] else None, "runner_up": final["runner_up"],
                    "margin": final["margin"], "margin_ci": final["margin_ci"], "fits": final["fits"],
                    "clear": final["clear"], "text": final["text"]},
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
        trace = c.run(tr, f.hyper, f.step or 0)
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
