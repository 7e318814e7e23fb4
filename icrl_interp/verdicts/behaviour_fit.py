"""The behavioural part of the episode verdict: which tabular learning rule (`icrl_interp.tasks.learners`) chose
an agent's actions, by maximum likelihood and held-out log-likelihood (docs/episodes.md).

The histories are split into training and held-out ones (`split_seed`, `test_fraction`). Each candidate rule
is replayed on the training histories and its parameters (alpha in (0, 1], gamma in [0, 1], beta > 0, lambda
in [0, 1], as it has them) maximize the log-likelihood of the agent's choices, sum_t log pi(a_t | s_t) with
pi = softmax(beta Q): a coarse grid evaluated at once (`GRID`; beta profiled on `BETA_GRID` for the rules whose
updates do not use it, on the rows for those that do), then a bounded quasi-Newton search (scipy's L-BFGS-B)
from the best grid point, in the coordinates log alpha, gamma, log beta, lambda, with forward-difference
gradients evaluated in one vectorized replay. With `action_probs` [H, T, A] (a model's action probabilities on
a fixed history) the log-likelihood is the expected one, sum_t sum_a p_model(a) log pi(a | s_t) (minus the
cross-entropy).

The parameters' intervals: the fit refitted on bootstrap resamples of the training histories by one Newton
step from the fitted point (the resample's gradient less the fit's, and its Hessian, from per-history finite
differences at the fitted point; clipped to the bounds; a parameter the fit stopped at a bound of stays
there): cheap, and first-order accurate around the fit.

Candidates are compared by their held-out mean log-likelihood per step, with paired bootstrap intervals over
the held-out histories. Baselines the winner must beat: ``uniform`` (log 1/A per step), ``static`` (action
frequencies per observation on the training histories, add-one smoothed) and ``action_sequence``
(P(a_t | a_{t-1}, o_t) on the training histories, add-one smoothed; a_{-1} is a start symbol) and
``history_frequency``, the within-history action frequency: how often each action was taken so far IN THIS
HISTORY at this observation, backed off to how often it was taken so far in the history at any observation,
backed off to uniform (a hierarchical Dirichlet-multinomial predictive rule),
P(a_t = a) = (n_t(o_t, a) + c_s p_t(a)) / (n_t(o_t) + c_s), p_t(a) = (n_t(a) + c_h / A) / (n_t + c_h), the counts
n_t over the steps before t of the history's own actions (step t's is not among them). A policy maps
observations to actions, so a fixed stochastic policy drawn per history (a decoy no rule explains and no
baseline fitted across histories predicts) is what per-observation counts learn; where an observation is rare
the history-wide counts stand in (a perseverating agent). Its two concentrations are fitted by maximum
likelihood on the training histories (`fit_history_frequency`): c_s large is history-wide frequency, both
large is uniform. The label is
the best candidate when the plain 95 % intervals of its differences with every baseline lie above 0, else
"none fits"; it is `clear` when the Bonferroni-adjusted intervals (one comparison per other candidate and
baseline) of its differences with the runner-up and every baseline all lie above 0; otherwise
`more_histories` says how many held-out histories would likely resolve it. Pairs of candidates whose
held-out difference's interval covers 0 are reported indistinguishable (`pairs`: SARSA and expected SARSA
choose alike where the policy is near greedy or the successor's values are even).
"""
from __future__ import annotations

import itertools
import time

import numpy as np

from .._version import __version__
from ..core.errors import UserError
from ..interventions.statistics import interval
from ..tasks import learners
from .behaviour import adjusted, adjusted_resamples, more_tasks

SCHEMA = "icrl_interp.episode_verdict/2"
"""Version 2 (from 1): the baseline ``history_frequency`` (with its fitted ``params``) and its check in
``verdict.checks``, one more comparison in ``verdict.comparisons``, ``histories.split``; on an episode recording
``representation`` (`verdicts.episode_evidence`)."""
CANDIDATES = learners.NAMES
"""The candidate rules, in the verdict's order."""
BASELINES = ("uniform", "static", "action_sequence", "history_frequency")
CONCENTRATIONS = tuple(np.geomspace(1e-2, 1e3, 11))
"""The within-history baseline's concentrations tried on its grid (and the range of its search)."""
GRID = {"alpha": (0.03, 0.1, 0.2, 0.35, 0.6, 1.0), "gamma": (0.0, 0.5, 0.8, 0.95), "lam": (0.0, 0.4, 0.8, 1.0)}
"""The coarse grid of the fit's starting point, per parameter."""
BETA_GRID = tuple(np.geomspace(0.25, 64.0, 9))
"""Inverse temperatures profiled on the grid (rules whose updates use beta: every 2nd one, in the rows)."""
BOUNDS = {"alpha": (np.log(1e-3), 0.0), "gamma": (0.0, 1.0), "beta": (np.log(1e-2), np.log(1e3)), "lam": (0.0, 1.0)}
"""The search's bounds in its coordinates (log alpha, gamma, log beta, lambda)."""
LOG = ("alpha", "beta")
"""Parameters searched on a log scale."""
FD_STEP = 1e-6
"""Forward-difference step of the search's gradient (coordinates of order 1; the objective is per step)."""
HESS_STEP = 1e-3
"""Finite-difference step of the bootstrap's per-history gradients and Hessians."""
MAX_ITER = 60
ROW_BUDGET = 4_000_000
"""Table entries (rows x S x A) replayed at once: larger grids run in chunks."""
PAIRS = ((learners.sarsa.__name__, learners.expected_sarsa.__name__),)
"""Pairs reported as indistinguishable when their held-out difference's interval covers 0."""
NESTED = ((learners.sarsa_lambda.__name__, learners.sarsa.__name__, "lam", 0.0),)
"""(rule, the rule it is at one value of a parameter, the parameter, the value): where the fitted parameter's
interval covers that value, the larger rule adds nothing: it leaves the ranking (`reduces_to`)."""


# ------------------------------------------------------------------ the data
def targets(episodes, action_probs=None) -> np.ndarray:
    """[H, T, A] weights of the actions per step: one-hot of the episodes' actions, or the given action
    probabilities (checked: finite, >= 0, summing to 1 on valid steps); 0 outside the histories."""
    H, T, A = episodes.n_histories, episodes.n_steps, episodes.n_actions
    valid = episodes.valid
    if action_probs is None:
        w = np.zeros((H, T, A))
        h, t = np.nonzero(valid)
        w[h, t, episodes.actions[h, t]] = 1.0
        return w
    p = np.asarray(action_probs, dtype=np.float64)
    if p.shape != (H, T, A):
        raise UserError(f"action_probs has shape {p.shape}; expected [H, T, A] = {[H, T, A]}")
    pv = p[valid]
    if not np.all(np.isfinite(pv)) or np.any(pv < 0) or np.any(np.abs(pv.sum(-1) - 1.0) > 1e-6):
        raise UserError("action_probs must be finite, non-negative and sum to 1 over the actions on every valid step")
    return np.where(valid[..., None], p, 0.0)


def _weights(draws: np.ndarray, n: int) -> np.ndarray:
    """[R, n] how often each of n items is drawn in each resample (draws [R, n] indices)."""
    return np.stack([np.bincount(d, minlength=n) for d in draws]).astype(np.float64)


# ------------------------------------------------------------------ baselines
def baseline_logliks(train, w_train, test, w_test, fitted: dict | None = None) -> dict[str, np.ndarray]:
    """Per held-out history, the log-likelihood sum of each baseline fitted on the training histories; `fitted`
    (a dict, when given) receives the fitted parameters of the baselines that have them."""
    A = train.n_actions
    S = train.n_observations
    out = {"uniform": -np.log(A) * w_test.sum((1, 2))}
    obs_tr, obs_te = np.where(train.valid, train.observations, 0), np.where(test.valid, test.observations, 0)
    static = np.ones((S, A))
    np.add.at(static, obs_tr.ravel(), w_train.reshape(-1, A))
    static = np.log(static / static.sum(1, keepdims=True))
    out["static"] = (w_test * static[obs_te]).sum((1, 2))

    def prev(ep):  # the previous step's action in the history, A (the start symbol) at its first step
        a = np.where(ep.valid, ep.actions, 0)
        return np.concatenate([np.full((a.shape[0], 1), A), a[:, :-1]], 1)

    seq = np.ones((A + 1, S, A))
    np.add.at(seq, (prev(train).ravel(), obs_tr.ravel()), w_train.reshape(-1, A))
    seq = np.log(seq / seq.sum(-1, keepdims=True))
    out["action_sequence"] = (w_test * seq[prev(test), obs_te]).sum((1, 2))
    c_state, c_history = fit_history_frequency(train, w_train)
    out["history_frequency"] = history_frequency_loglik(test, w_test, c_state, c_history)
    if fitted is not None:
        fitted["history_frequency"] = {"c_state": c_state, "c_history": c_history}
    return out


def history_counts(episodes) -> tuple[np.ndarray, np.ndarray]:
    """([H, T, A] how often each action was taken in the history BEFORE step t, [H, T, A] the same among the
    earlier steps at o_t's observation): the history's own actions (what a model reading it has seen), not the
    fitted targets. Counts of 0/1 in float64: exact."""
    H, T, A = episodes.n_histories, episodes.n_steps, episodes.n_actions
    valid = np.asarray(episodes.valid, bool)
    onehot = np.zeros((H, T, A))
    h, t = np.nonzero(valid)
    onehot[h, t, episodes.actions[h, t]] = 1.0
    total = np.cumsum(onehot, 1) - onehot  # exclusive: step t's own action is not yet seen
    key = (np.arange(H)[:, None] * episodes.n_observations + np.where(valid, episodes.observations, 0)).ravel()
    order = np.argsort(key, kind="stable")  # grouped by (history, observation), time order kept inside a group
    x = onehot.reshape(-1, A)[order]
    c = np.cumsum(x, 0) - x
    k = key[order]
    first = np.maximum.accumulate(np.where(np.r_[True, k[1:] != k[:-1]], np.arange(k.size), 0))
    per_state = np.empty_like(c)
    per_state[order] = c - c[first]  # counts of the group's rows before this one
    return total, per_state.reshape(H, T, A)


def history_frequency_loglik(episodes, w, c_state, c_history, counts=None) -> np.ndarray:
    """[..., H] log-likelihood sums of the within-history action-frequency baseline (module docstring) with
    concentrations c_state, c_history (scalars or arrays broadcast over a leading grid axis); `counts`:
    `history_counts(episodes)`, when already made."""
    total, state = history_counts(episodes) if counts is None else counts
    cs = np.asarray(c_state, np.float64)[..., None, None, None]
    ch = np.asarray(c_history, np.float64)[..., None, None, None]
    A = total.shape[-1]
    p_hist = (total + ch / A) / (total.sum(-1, keepdims=True) + ch)
    p = (state + cs * p_hist) / (state.sum(-1, keepdims=True) + cs)
    return (w * np.log(p)).sum((-2, -1))


def fit_history_frequency(episodes, w) -> tuple[float, float]:
    """(c_state, c_history) maximizing the baseline's log-likelihood of `w` on these (training) histories: the best
    point of `CONCENTRATIONS` squared, then L-BFGS-B in log concentrations within the grid's range."""
    from scipy.optimize import minimize

    counts = history_counts(episodes)
    g = np.log(np.asarray(CONCENTRATIONS))
    cs, ch = np.meshgrid(g, g, indexing="ij")
    ll = np.stack([history_frequency_loglik(episodes, w, np.exp(cs[i]), np.exp(ch[i]), counts).sum(-1)
                   for i in range(g.size)])
    i, j = np.unravel_index(np.argmax(ll), ll.shape)
    steps = max(float(w.sum()), 1.0)

    def f(x):
        return -float(history_frequency_loglik(episodes, w, np.exp(x[0]), np.exp(x[1]), counts).sum()) / steps

    res = minimize(f, np.array([g[i], g[j]]), method="L-BFGS-B", bounds=[(g[0], g[-1])] * 2,
                   options={"maxiter": MAX_ITER, "ftol": 1e-12})
    x = res.x if res.fun <= f(np.array([g[i], g[j]])) else np.array([g[i], g[j]])
    return float(np.exp(x[0])), float(np.exp(x[1]))


# ------------------------------------------------------------------ the fit of one candidate
def _params(name: str, x: np.ndarray, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Rows of coordinates x [P, d] -> parameter arrays [P] (every parameter of the rule)."""
    return {k: (np.exp(x[:, i]) if k in LOG else x[:, i]) for i, k in enumerate(keys)}


def _coords(params: dict, keys) -> np.ndarray:
    return np.array([np.log(params[k]) if k in LOG else params[k] for k in keys], dtype=np.float64)


def _loglik(name, cols, S, A, target, params, policy_betas=None) -> np.ndarray:
    """[P, B, H] per-history log-likelihoods (`learners.run`), in chunks of at most ROW_BUDGET table entries."""
    P = next(iter(params.values())).shape[0]
    H = cols["obs"].shape[0]
    chunk = max(1, ROW_BUDGET // (H * S * A))
    out = []
    for i in range(0, P, chunk):
        part = {k: v[i:i + chunk] for k, v in params.items()}
        out.append(learners.run(name, cols, S, A, part, record=False, target=target, policy_betas=policy_betas)
                   ["loglik"].transpose(1, 0, 2))
    return np.concatenate(out, 0)


def _grid_start(name, cols, S, A, target) -> dict:
    """The best point of the coarse grid (by the training log-likelihood)."""
    cls = learners.rule_class(name)
    keys = [k for k in cls.params if k != "beta"]
    rows = [dict(zip(keys, v)) for v in itertools.product(*(GRID[k] for k in keys))]
    if cls.uses_beta:  # beta moves the table: it is a row of the grid
        rows = [{**r, "beta": b} for r in rows for b in BETA_GRID[::2]]
        betas = None
    else:  # beta only sets the choice probabilities: profiled on one replay (the deferred SARSA rules' targets
        rows = [{**r, "beta": 1.0} for r in rows]  # at truncations use it too: the search gets those right)
        betas = np.asarray(BETA_GRID)
    params = {k: np.array([r[k] for r in rows], dtype=np.float64) for k in cls.params}
    ll = _loglik(name, cols, S, A, target, params, betas).sum(-1)  # [P, B]
    p, b = np.unravel_index(np.argmax(ll), ll.shape)
    best = {k: float(params[k][p]) for k in cls.params}
    if betas is not None:
        best["beta"] = float(betas[b])
    return best


def _search(name, cols, S, A, target, start: dict, steps: float) -> tuple[dict, float, int]:
    """L-BFGS-B from `start`: (parameters, training mean log-likelihood per step, iterations)."""
    from scipy.optimize import minimize

    keys = learners.rule_class(name).params
    lo = np.array([BOUNDS[k][0] for k in keys])
    hi = np.array([BOUNDS[k][1] for k in keys])
    d = len(keys)

    best = [np.inf, None]  # the best point evaluated (the search's last one need not be)

    def f(x):
        x = np.clip(x, lo, hi)
        pts = np.repeat(x[None], d + 1, 0)
        h = np.where(x + FD_STEP <= hi, FD_STEP, -FD_STEP)  # step inside the bounds
        pts[np.arange(1, d + 1), np.arange(d)] += h
        ll = _loglik(name, cols, S, A, target, _params(name, pts, keys))[:, 0].sum(-1) / steps
        if -ll[0] < best[0]:
            best[:] = [-ll[0], x.copy()]
        return -ll[0], -(ll[1:] - ll[0]) / h

    res = minimize(f, np.clip(_coords(start, keys), lo, hi), jac=True, method="L-BFGS-B", bounds=list(zip(lo, hi)),
                   options={"maxiter": MAX_ITER, "ftol": 1e-12, "gtol": 1e-7})
    return {k: float(v[0]) for k, v in _params(name, best[1][None], keys).items()}, float(-best[0]), int(res.nit)


def _bootstrap_params(name, cols, S, A, target, fit: dict, weights: np.ndarray) -> dict:
    """Each parameter's 95 % interval over refits on resampled training histories (`weights` [R, H]: how
    often each history is drawn), each refit one Newton step from the fit (module docstring)."""
    keys = learners.rule_class(name).params
    d = len(keys)
    x0 = _coords(fit, keys)
    pts = [x0]
    for i in range(d):
        for s in (1, -1):
            pts.append(x0 + s * HESS_STEP * np.eye(d)[i])
    pairs = list(itertools.combinations(range(d), 2))
    for i, j in pairs:
        pts.append(x0 + HESS_STEP * (np.eye(d)[i] + np.eye(d)[j]))
    f = _loglik(name, cols, S, A, target, _params(name, np.array(pts), keys))[:, 0]  # [points, H]
    f0, fp, fm = f[0], f[1:2 * d + 1:2], f[2:2 * d + 1:2]
    g = (fp - fm) / (2 * HESS_STEP)  # [d, H]
    Hh = np.zeros((d, d, f.shape[1]))
    Hh[np.arange(d), np.arange(d)] = (fp - 2 * f0 + fm) / HESS_STEP ** 2
    for n, (i, j) in enumerate(pairs):
        Hh[i, j] = Hh[j, i] = (f[2 * d + 1 + n] - fp[i] - fp[j] + f0) / HESS_STEP ** 2
    lo = np.array([BOUNDS[k][0] for k in keys])
    hi = np.array([BOUNDS[k][1] for k in keys])
    g_fit = g.sum(1)  # the gradient at the fit: 0 inside the bounds, pointing out at a bound it stops at
    free = np.flatnonzero(~(((x0 <= lo + 1e-9) & (g_fit < 0)) | ((x0 >= hi - 1e-9) & (g_fit > 0))))
    x = np.repeat(x0[None], weights.shape[0], 0)
    if free.size:
        G = (weights - 1.0) @ g[free].T  # [R, f]: the resample's gradient less the fit's (the step is 0 at weights 1)
        Hs = np.einsum("rh,ijh->rij", weights, Hh[np.ix_(free, free)])
        vals, vecs = np.linalg.eigh(Hs)
        floor = 1e-9 * np.abs(vals).max(-1, keepdims=True) + 1e-300
        inv = 1.0 / np.maximum(np.abs(vals), floor)  # saddle-free: the step climbs along every direction
        step = np.einsum("rij,rj,rkj,rk->ri", vecs, inv, vecs, G)
        x[:, free] = np.clip(x0[free] + np.clip(step, -2.0, 2.0), lo[free], hi[free])
    p = _params(name, x, keys)
    return {k: interval(v) for k, v in p.items()}


def fit_candidate(name, train, w_train, test, w_test, weights: np.ndarray | None) -> dict:
    """One candidate fitted on the training histories and scored per held-out history."""
    t0 = time.perf_counter()
    S, A = train.n_observations, train.n_actions
    cols = learners.steps(train)
    steps = float(w_train.sum())
    start = _grid_start(name, cols, S, A, w_train)
    fit, ll, nit = _search(name, cols, S, A, w_train, start, steps)
    ci = _bootstrap_params(name, cols, S, A, w_train, fit, weights) if weights is not None else {}
    held = _loglik(name, learners.steps(test), S, A, w_test, {k: np.array([v]) for k, v in fit.items()})[0, 0]
    return {"params": {k: {"value": v, "ci": ci.get(k)} for k, v in fit.items()},
            "grid_start": start, "iterations": nit, "train_loglik": ll, "held_out": held,
            "seconds": time.perf_counter() - t0}


# ------------------------------------------------------------------ the verdict
def split(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) history indices: a random permutation by `seed`, disjoint, each non-empty."""
    if n < 4:
        raise UserError(f"the behavioural fit needs at least 4 histories (2 to fit, 2 to score), got {n}")
    perm = np.random.default_rng([seed, 0xE91]).permutation(n)
    k = int(np.clip(round(test_fraction * n), 2, n - 2))
    return np.sort(perm[k:]), np.sort(perm[:k])


def fit_behaviour(episodes, *, action_probs=None, split_seed: int = 0, test_fraction: float = 0.3,
                  bootstrap: int = 1000, fit_resamples: int = 100, candidates=None, source: str | None = None,
                  held_out=None) -> dict:
    """The episode verdict's behavioural part (JSON, schema `SCHEMA`; module docstring). `action_probs` [H, T, A]:
    fit to a model's action probabilities on the episodes (else to the episodes' own actions). `held_out`: the
    held-out history indices, when another part of the verdict fixes them (the probes' split,
    `verdicts.episode_evidence`); else `split(H, test_fraction, split_seed)`."""
    learners.discrete(episodes)
    if not 0.0 < test_fraction < 1.0:
        raise UserError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    names = list(CANDIDATES if candidates is None else candidates)
    for n in names:
        learners.rule_class(n)
    w = targets(episodes, action_probs)
    if held_out is None:
        tr_idx, te_idx = split(episodes.n_histories, test_fraction, split_seed)
    else:
        te_idx = np.unique(np.asarray(held_out, np.int64))
        tr_idx = np.setdiff1d(np.arange(episodes.n_histories), te_idx)
        if te_idx.size < 2 or tr_idx.size < 2 or te_idx[0] < 0 or te_idx[-1] >= episodes.n_histories:
            raise UserError(f"the behavioural fit needs at least 2 held-out and 2 training histories among "
                            f"{episodes.n_histories}, got {te_idx.size} held out")
    train, test = episodes.select(tr_idx), episodes.select(te_idx)
    w_tr, w_te = w[tr_idx], w[te_idx]
    rng = np.random.default_rng([split_seed, 0xB00])
    fit_w = _weights(rng.integers(0, tr_idx.size, (fit_resamples, tr_idx.size)), tr_idx.size) if fit_resamples else None
    fits = {n: fit_candidate(n, train, w_tr, test, w_te, fit_w) for n in names}
    base_params = {}
    base = baseline_logliks(train, w_tr, test, w_te, base_params)
    cols = names + list(BASELINES)
    LL = np.stack([fits[n]["held_out"] for n in names] + [base[b] for b in BASELINES], 1)  # [H_test, C + B]
    n_steps = w_te.sum((1, 2))
    comparisons = len(cols) - 1
    R = adjusted_resamples(comparisons, bootstrap)
    Wt = _weights(rng.integers(0, te_idx.size, (R, te_idx.size)), te_idx.size)
    boot = (Wt @ LL) / (Wt @ n_steps)[:, None]  # [R, C + B] mean log-likelihood per step
    mean = LL.sum(0) / n_steps.sum()
    reduces = {}
    for big, small, key, value in NESTED:
        ci = fits[big]["params"][key]["ci"] if big in fits else None
        if small in fits and ci is not None and ci[0] <= value <= ci[1]:
            reduces[big] = small
    verdict = decide(names, mean, boot, comparisons, te_idx.size, test_fraction, reduces)
    out = {"schema": SCHEMA, "version": __version__, "source": source,
           "fitted_to": "actions" if action_probs is None else "action_probs",
           "histories": {"train": int(tr_idx.size), "held_out": int(te_idx.size), "split_seed": int(split_seed),
                         "test_fraction": float(test_fraction), "held_out_indices": te_idx.tolist(),
                         "split": "seeded permutation" if held_out is None else "given"},
           "steps": {"train": float(w_tr.sum()), "held_out": float(n_steps.sum())},
           "bootstrap": {"held_out_resamples": int(R), "fit_resamples": int(fit_resamples)},
           "candidates": {}, "baselines": {}, "verdict": verdict}
    for j, c in enumerate(cols):
        entry = {"held_out_loglik": float(mean[j]), "held_out_loglik_ci": interval(boot[:, j])}
        if j < len(names):
            f = fits[c]
            out["candidates"][c] = {"params": f["params"], "train_loglik": f["train_loglik"], **entry,
                                    "grid_start": f["grid_start"], "iterations": f["iterations"],
                                    "fit_seconds": f["seconds"]}
        else:
            out["baselines"][c] = {**entry, **({"params": base_params[c]} if c in base_params else {})}
    return out


def decide(names: list[str], mean: np.ndarray, boot: np.ndarray, comparisons: int, n_held_out: int,
           test_fraction: float, reduces: dict | None = None) -> dict:
    """The label from held-out mean log-likelihoods per step (`mean` [C + B], candidates then BASELINES) and
    their paired bootstrap samples `boot` [R, C + B] (module docstring); `reduces`: candidate -> the nested
    candidate it reduces to at its fit (`NESTED`), left out of the ranking."""
    C = len(names)
    reduces = reduces or {}
    order = [int(j) for j in np.argsort(-mean[:C], kind="stable") if names[j] not in reduces]
    b = int(order[0])
    same = [int(j) for j in order[1:] if np.array_equal(boot[:, j], boot[:, b])]  # identical choices
    rest = [int(j) for j in order[1:] if j not in same]
    checks, plain = {}, {}

    def check(key, j):
        diff = boot[:, b] - boot[:, j]
        adj = adjusted(diff, comparisons)
        checks[key] = {"against": ([*names, *BASELINES])[j], "difference": float(mean[b] - mean[j]),
                       "ci": interval(diff), "ci_adjusted": adj, "passes": bool(adj is not None and adj[0] > 0)}

    if rest:
        check("runner_up", rest[0])
    for i, name in enumerate(BASELINES):
        check(name, C + i)
    fits = all(checks[k]["ci"] is not None and checks[k]["ci"][0] > 0 for k in BASELINES)
    failing = [k for k, v in checks.items() if not v["passes"]]
    clear = bool(fits and rest and not failing)
    pairs = []
    for x, y in PAIRS:
        if x in names and y in names:
            i, j = names.index(x), names.index(y)
            ci = interval(boot[:, i] - boot[:, j])
            pairs.append({"candidates": [x, y], "difference": float(mean[i] - mean[j]), "ci": ci,
                          "indistinguishable": bool(ci is None or ci[0] <= 0 <= ci[1])})
    best = names[b]
    out = {"best": best if fits else None, "closest": best, "label": best if fits else "none fits",
           "best_loglik": float(mean[b]), "equivalent": [names[j] for j in same] + [x for x, y in reduces.items()
                                                                                  if y == best],
           "reduces_to": dict(reduces),
           "runner_up": names[rest[0]] if rest else None,
           "margin": checks["runner_up"]["difference"] if rest else None,
           "margin_ci": checks["runner_up"]["ci"] if rest else None,
           "margin_ci_adjusted": checks["runner_up"]["ci_adjusted"] if rest else None,
           "comparisons": int(comparisons), "checks": checks, "fits": bool(fits), "clear": clear, "pairs": pairs,
           "more_histories": None}
    if not fits:
        beaten = [k for k in BASELINES if not (checks[k]["ci"] and checks[k]["ci"][0] > 0)]
        out["text"] = (f"none fits: the closest candidate ({best}, {mean[b]:.4g} nats per step held out) does not "
                       f"beat {', '.join(beaten)} (95 % intervals include or lie below 0)")
        return out
    twin = [p for p in pairs if best in p["candidates"] and p["indistinguishable"]]
    text = best + "".join(f" (indistinguishable here from {[c for c in p['candidates'] if c != best][0]}: "
                          f"difference interval [{p['ci'][0]:.3g}, {p['ci'][1]:.3g}])" for p in twin if p["ci"])
    if same:  # e.g. every rule on a bandit: one observation, episodes of one step, nothing to bootstrap from
        text += (f" (identical action probabilities here to {', '.join(names[j] for j in same)}: these histories "
                 "cannot tell them apart, so the label names any one of them)")
    if clear:
        out["text"] = (f"{text}; margin over {out['runner_up']}: {out['margin']:.3g} nats per step, adjusted "
                       "interval above 0")
        return out
    out["text"] = f"{text}, not clear: it does not beat {', '.join(failing)} (adjusted intervals include 0)"
    more = more_tasks({k: checks[k] for k in failing}, n_held_out)
    if more is not None:
        out["more_histories"] = {"held_out_histories_now": more["held_out_tasks_now"],
                                 "held_out_histories_needed": more["held_out_tasks_needed"],
                                 "histories_to_collect": int(np.ceil(more["held_out_tasks_needed"] / test_fraction))}
        out["text"] += (f"; about {out['more_histories']['histories_to_collect']} histories "
                        f"({more['held_out_tasks_needed']} held out) would likely resolve it")
    return out
