"""Linear probes of a sequence model's activations over learning histories (docs/episodes.md, "Representation
and causation"): does a layer carry a candidate learner's TD error, Q-values or V-values at each step, beyond
what its input holds?

Inputs, all aligned to the history steps of an `Episodes` grid [H, T] (a recording's step-aligned
activations, `PositionMap.to_steps`):

* per layer an array-like [H, T, d] (numpy, or an h5py dataset: read `block` histories at a time, so memory
  stays flat in H), optionally the random-init model's activations at the same layers;
* targets {name: [H, T]} (NaN where a target is not defined), e.g. `replay_targets` of a candidate.

What the model has seen at the position where step t's action is read (every token format): the steps
before t with their actions and rewards, and o_t. So the TD error probed at step t is that of step t - 1,
delta_{t-1} = r_{t-1} + gamma V'(o_t) - Q(s_{t-1}, a_{t-1}), whose reward is in view (`DELTA_LAG`); Q and V
are the learner's before the update of step t.

Ridge probes with intercept are `td_probe.ProbeAccumulator`'s (a history is a task, a step one sample; the
penalty by K-fold CV over the training histories), split by HISTORY (`td_probe.task_folds` of the history
index): no history has steps on both sides, so a probe cannot learn a history's level from its other steps.
Baselines every probe must beat, on the same held-out samples:

* **input**: ridge on the step's own token features (`input_features`: one-hot observation, one-hot previous
  action, previous reward, new-episode flag: what one `ad-step` token holds);
* **random_init**: the same probe on the random-init model's activations (when given);
* **shuffled**: the same probe on the layer, to the targets of a *different history at the same step*
  (`partners`: a seeded derangement of the histories); what step-indexed structure alone (a clock, a
  positional embedding) predicts.

selectivity = R^2 - max(baselines), with a percentile bootstrap interval over held-out histories (one set of
resamples for every layer and target). The **selective part** of a target (`SELECTIVE`, default delta) is
its own target `<name>_selective`: the target minus its ridge prediction from the input features and the
immediate reward (the reward of the TD error's own step), fitted on the training histories; a model that only
carries the reward is not credited with delta. The predicted part is the target `<name>_input` (the
causal test's decoy direction, interventions/episode_causal.py).

numpy only (no torch): the lead's `analyze` on an episode recording and the causal test both call it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..core.errors import UserError
from ..models.episode_tokens import ad_step_tokens, format_for
from ..tasks import learners
from . import td_probe

SCHEMA = "icrl_interp.episode_probes/1"
DELTA_LAG = 1
"""The TD error probed at step t is that of step t - DELTA_LAG (its reward is the last one the model has seen)."""
SELECTIVE = ("delta",)
"""Targets whose selective part (input- and reward-explained part removed) is probed as its own target."""
FOLDS = 5
"""Training folds for the ridge penalty's CV; one more fold is the held-out set."""
TEST_FRACTION = 0.3
BLOCK_BYTES = 64 * 2**20
"""Activations read per block of histories (float32 bytes, at most; one history at least)."""
BASELINES = ("input", "random_init", "shuffled")
SUM_COLUMNS = ("sse", "sse_input", "sse_random_init", "n", "sum_y", "sum_y2", "sse_shuffled", "sum_y_partner",
               "sum_y2_partner")
"""Per held-out history and target (`EpisodeProbes.sums`): sums from which every R^2 of a probe and its
baselines follows (`selectivity_of_sums`), on any subset or resample of the held-out histories."""


def replay_targets(episodes, name: str, *, alpha=None, gamma=None, beta=None, lam=None) -> dict[str, np.ndarray]:
    """The candidate `name` (tasks.learners) replayed with scalar parameters on the episodes: {'delta':
    delta_{t - DELTA_LAG}, 'q': Q(s_t, a_t), 'v': V(s_t), 'q_action_k': Q(s_t, k) per action k}, each [H, T]
    float64, NaN where undefined (outside a history, the first DELTA_LAG steps, a TD error not yet made)."""
    rep = learners.replay(name, episodes, alpha=alpha, gamma=gamma, beta=beta, lam=lam)
    if rep.delta.ndim != 2:
        raise UserError(f"probe targets need one setting of {name}'s parameters (scalars), got batch shape "
                        f"{rep.delta.shape[:-2]}")
    delta = np.full_like(rep.delta, np.nan)
    delta[:, DELTA_LAG:] = rep.delta[:, :-DELTA_LAG]
    a = np.where(episodes.valid, episodes.actions, 0)
    out = {"delta": delta, "q": np.take_along_axis(rep.q, a[..., None], -1)[..., 0], "v": rep.v}
    out.update({f"q_action_{k}": rep.q[..., k] for k in range(rep.q.shape[-1])})
    return out


def input_features(episodes, rows=slice(None)) -> np.ndarray:
    """[h, T, F] float64 of the histories `rows`: what one `ad-step` token of step t holds (one-hot o_t or
    the Box observation, one-hot a_{t-1}, r_{t-1}, new-episode flag; `episode_tokens.ad_step_tokens`)."""
    obs = np.asarray(episodes.observations[rows])
    valid = np.asarray(episodes.valid[rows], bool)
    acts, rew = np.asarray(episodes.actions[rows]), np.asarray(episodes.rewards[rows], np.float64)
    fmt = format_for(episodes, "ad-step", context=1)
    if episodes.n_observations is not None:
        o = np.zeros((*obs.shape, fmt.obs_width))
        np.put_along_axis(o, np.where(valid, obs, 0)[..., None], 1.0, -1)
    else:
        o = obs.astype(np.float64)
    prev_a = np.full(acts.shape, -1, np.int64)
    prev_a[:, 1:] = acts[:, :-1]
    prev_r = np.zeros(rew.shape)
    prev_r[:, 1:] = rew[:, :-1]
    new_ep = (np.asarray(episodes.episode_step[rows]) == 0) & valid
    tok = ad_step_tokens(fmt, o, prev_a, prev_r, new_ep).astype(np.float64)
    tok[..., fmt.columns["prev_reward"].start] = prev_r  # float64, not the token's float32 copy
    return np.where(valid[..., None], tok, 0.0)


def immediate_reward(episodes) -> np.ndarray:
    """[H, T] the reward of the TD error's own step, r_{t - DELTA_LAG} (0 before the first step)."""
    r = np.zeros(np.shape(episodes.rewards))
    r[:, DELTA_LAG:] = np.asarray(episodes.rewards, np.float64)[:, :-DELTA_LAG]
    return r


def partners(n_histories: int, seed: int) -> np.ndarray:
    """[H] a different history for each (a seeded derangement: one cycle through a random order), whose targets
    at the same step the shuffled baseline predicts."""
    if n_histories < 2:
        raise UserError("the shuffled baseline needs at least 2 histories")
    order = np.random.default_rng([int(seed), 0x5A1F]).permutation(n_histories)
    out = np.empty(n_histories, np.int64)
    out[order] = np.roll(order, -1)
    return out


@dataclass
class Split:
    """The split by history: `fold` [H] (0..k-1 training folds, k held out), `partner` [H] (shuffled baseline)."""

    fold: np.ndarray
    partner: np.ndarray
    k: int
    seed: int
    test_fraction: float

    @property
    def test(self) -> np.ndarray:
        return np.flatnonzero(self.fold == self.k)

    @property
    def train(self) -> np.ndarray:
        return np.flatnonzero(self.fold < self.k)

    def to_json(self) -> dict:
        return {"by": "history", "seed": self.seed, "test_fraction": self.test_fraction, "folds": self.k,
                "train_histories": int(self.train.size), "test_histories": int(self.test.size),
                "shuffled": "each history's targets replaced by those of another history (a seeded derangement) "
                            "at the same step"}


def split_histories(n_histories: int, seed: int = 0, test_fraction: float = TEST_FRACTION, k: int = FOLDS) -> Split:
    """Folds by history index (`td_probe.task_folds`: a pure function of (history, seed)) and the partners."""
    fold = td_probe.task_folds(np.arange(n_histories), seed, test_fraction, k)
    if not np.any(fold == k) or np.sum(fold < k) < 2:
        raise UserError(f"{n_histories} histories leave no held-out or too few training histories at test fraction "
                        f"{test_fraction}: record more histories")
    return Split(fold=fold, partner=partners(n_histories, seed), k=k, seed=int(seed),
                 test_fraction=float(test_fraction))


def step_folds(split: Split, n_steps: int) -> np.ndarray:
    """[H, T] the fold of every sample: its history's (every step of a history on one side of the split)."""
    return np.broadcast_to(split.fold[:, None], (split.fold.size, n_steps))


@dataclass
class EpisodeProbes:
    """The probes' JSON (`json`), their coefficients {(layer, target): (coef [d], intercept)}, the per-held-out-history
    sums {(layer, target): [N_test, len(SUM_COLUMNS)]} and the split."""

    json: dict
    coef: dict = field(default_factory=dict)
    sums: dict = field(default_factory=dict)
    split: Split | None = None
    targets: dict = field(default_factory=dict)
    """{name: [H, T]} every target probed (the selective and input-explained parts included)."""
    mask: np.ndarray | None = None
    """[H, T] the steps every probe used (valid, every target defined there and at the partner history)."""


def selectivity_of_sums(S: np.ndarray) -> np.ndarray:
    """R^2 - max(baselines) from summed `SUM_COLUMNS` [..., 9] (a missing baseline's sse is NaN: ignored)."""
    s = np.moveaxis(np.asarray(S, np.float64), -1, 0)
    r2 = lambda sse, sy, syy: td_probe.r2_of_sums(sse, s[3], sy, syy)  # noqa: E731
    base = np.stack([r2(s[1], s[4], s[5]), r2(s[2], s[4], s[5]), r2(s[6], s[7], s[8])], -1)[..., None]
    return np.asarray(r2(s[0], s[4], s[5]) - td_probe.max_baseline(base)[..., 0])


def _block(width: int, T: int, block: int | None) -> int:
    return max(1, int(block) if block else BLOCK_BYTES // max(4 * width * T, 1))


def _samples(X: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[m, 1, F] the kept samples of a block [h, T, F] (a step is a one-column prompt for the accumulator)."""
    return np.asarray(X, np.float64 if X.dtype != np.float32 else np.float32)[mask][:, None, :]


def _accumulate(read, mask: np.ndarray, fold_of: np.ndarray, Y: np.ndarray, split: Split, block: int):
    """Fit a ridge probe per target column of Y [H, T, c] from features `read(lo, hi)` -> [h, T, F]."""
    acc = None
    H = mask.shape[0]
    for lo in range(0, H, block):
        hi = min(H, lo + block)
        m = mask[lo:hi]
        if not m.any():
            continue
        X = _samples(read(lo, hi), m)
        if acc is None:
            acc = td_probe.ProbeAccumulator(X.shape[-1], Y.shape[-1], k=split.k)
        grouping = td_probe.fold_grouping(fold_of[lo:hi][m], np.ones(int(m.sum()), bool), split.k)
        acc.update(X, [Y[lo:hi][m][:, None, :]], grouping)
    if acc is None:
        raise UserError("no step has every target defined: nothing to probe")
    return acc.result()


def _sse_per_history(read, mask, Y, fit, rows: np.ndarray, block: int) -> np.ndarray:
    """[len(rows), c] sum over each history's kept steps of (Y - X coef - intercept)^2."""
    out = np.zeros((rows.size, Y.shape[-1]))
    for lo in range(0, rows.size, block):
        r = rows[lo:lo + block]
        X = np.asarray(read(r), np.float64)
        res = Y[r] - (X @ fit["coef"] + fit["intercept"])
        out[lo:lo + r.size] = np.where(mask[r][..., None], res * res, 0.0).sum(1)
    return out


def _inputs(episodes, extra: np.ndarray | None = None):
    """A reader (`_reader`'s calls) of `input_features`, with `extra` [H, T] as one more column."""
    def read(lo, hi=None):
        rows = slice(lo, hi) if hi is not None else lo
        X = input_features(episodes, rows)
        return X if extra is None else np.concatenate([X, extra[rows][..., None]], -1)
    return read


def _reader(arr):
    """read(lo, hi) -> arr[lo:hi], or read(rows) -> arr[rows] for sorted history indices (as h5py needs)."""
    return lambda lo, hi=None: np.asarray(arr[lo:hi] if hi is not None else arr[lo])


def probe_episodes(episodes, layers: Mapping, targets: Mapping[str, np.ndarray], *,
                   random_layers: Mapping | None = None,
                   selective: tuple[str, ...] = SELECTIVE, seed: int = 0, test_fraction: float = TEST_FRACTION,
                   folds: int = FOLDS, n_boot: int = td_probe.BOOTSTRAP, block: int | None = None) -> EpisodeProbes:
    """Ridge probes of every layer's activations [H, T, d] to every target [H, T] (and the selective and
    input-explained parts of the targets in `selective`), with the input, random-init (when `random_layers` holds
    the layer) and shuffled baselines, split by history (`split_histories(H, seed, ...)`). A step is used where it
    is valid and every target is defined, for it and its partner history."""
    H, T = episodes.n_histories, episodes.n_steps
    targets = {k: np.asarray(v, np.float64) for k, v in targets.items()}
    for k, v in targets.items():
        if v.shape != (H, T):
            raise UserError(f"probe target {k!r} has shape {v.shape}, the episodes [H, T] = [{H}, {T}]")
    for s in selective:
        if s not in targets:
            raise UserError(f"selective target {s!r} is not among the targets ({', '.join(targets)})")
    for key, arr in layers.items():
        if tuple(np.shape(arr)[:2]) != (H, T) or len(np.shape(arr)) != 3:
            raise UserError(f"activations of layer {key} have shape {tuple(np.shape(arr))}, expected [{H}, {T}, d]")
    split = split_histories(H, seed, test_fraction, folds)
    ok = np.asarray(episodes.valid, bool).copy()
    for v in targets.values():
        ok &= np.isfinite(v)
    mask = ok & ok[split.partner]  # the same samples for the probe, every baseline and the shuffled control
    fold_of = step_folds(split, T)
    E_read = _inputs(episodes)  # computed per block of histories: [H, T, F] itself may not fit in memory
    Z_read = _inputs(episodes, immediate_reward(episodes))
    blk = _block(int(E_read(0, 1).shape[-1]), T, block)
    explained = {}
    if selective:  # the input- and reward-explained part of each selective target, fitted on training histories
        Ys = np.stack([np.where(mask, targets[s], 0.0) for s in selective], -1)
        fit = _accumulate(Z_read, mask, fold_of, Ys, split, blk)
        pred = np.concatenate([Z_read(lo, lo + blk) @ fit["coef"] for lo in range(0, H, blk)]) + fit["intercept"]
        for i, s in enumerate(selective):
            targets[f"{s}_selective"] = np.where(ok, targets[s] - pred[..., i], np.nan)
            targets[f"{s}_input"] = np.where(ok, pred[..., i], np.nan)
            explained[s] = {"r2_test": _num(fit["r2"][i]), "explained_by": "input features and the immediate reward"}
    names = list(targets)
    Y = np.stack([np.where(ok, targets[n], 0.0) for n in names], -1)
    Yp = Y[split.partner]  # defined wherever mask is: mask implies ok at the partner
    YY = np.concatenate([Y, Yp], -1)  # the layer's probes: the real targets, then the shuffled ones
    test = split.test
    m_t = mask[test][..., None]
    Yt, Ypt = np.where(m_t, Y[test], 0.0), np.where(m_t, Yp[test], 0.0)
    n_t = np.broadcast_to(m_t.sum(1).astype(np.float64), (test.size, len(names)))
    common = np.stack([n_t, Yt.sum(1), (Yt ** 2).sum(1), Ypt.sum(1), (Ypt ** 2).sum(1)], -1)  # n, sums of y and partner
    fit_in = _accumulate(E_read, mask, fold_of, Y, split, blk)
    sse_in = _sse_per_history(E_read, mask, Y, fit_in, test, blk)
    out = EpisodeProbes(json={}, split=split, targets=targets, mask=mask)
    layers_json = {}
    for key, arr in layers.items():
        read = _reader(arr)
        b = _block(int(np.shape(arr)[-1]), T, block)
        fit = _accumulate(read, mask, fold_of, YY, split, b)
        sse_both = _sse_per_history(read, mask, YY, fit, test, b)
        sse_rand = np.full_like(sse_in, np.nan)
        r2_rand = np.full(len(names), np.nan)
        if random_layers is not None and key in random_layers:
            rread = _reader(random_layers[key])
            fr = _accumulate(rread, mask, fold_of, Y, split, b)
            sse_rand, r2_rand = _sse_per_history(rread, mask, Y, fr, test, b), fr["r2"]
        per = {}
        for i, name in enumerate(names):
            S = np.column_stack([sse_both[:, i], sse_in[:, i], sse_rand[:, i], common[:, i, 0], common[:, i, 1],
                                 common[:, i, 2], sse_both[:, len(names) + i], common[:, i, 3], common[:, i, 4]])
            out.sums[(key, name)] = S
            out.coef[(key, name)] = (fit["coef"][:, i].copy(), float(fit["intercept"][i]))
            base = {"input": _num(fit_in["r2"][i]), "random_init": _num(r2_rand[i]),
                    "shuffled": _num(fit["r2"][len(names) + i])}
            known = [v for v in base.values() if v is not None]
            per[name] = {"r2": _num(fit["r2"][i]), "alpha": float(fit["alpha"][i]), "baselines": base,
                         "max_baseline": max(known) if known else None, "selectivity": None,
                         "n_train": fit["n_train"], "n_test": fit["n_test"]}
        layers_json[str(key)] = per
    ci = _intervals(out, names, layers, n_boot, seed)
    for key in layers:
        for name in names:
            S = out.sums[(key, name)].sum(0)
            lo_hi = ci.get((key, name))
            per = layers_json[str(key)][name]
            per["selectivity"] = {"mean": _num(selectivity_of_sums(S)), "ci": lo_hi}
            per["selective"] = bool(lo_hi is not None and lo_hi[0] > 0)
    out.json = {"schema": SCHEMA, "split": split.to_json(), "delta_lag": DELTA_LAG, "baselines": list(BASELINES),
                "targets": names, "explained": explained, "layers": layers_json}
    return out


def _intervals(out: EpisodeProbes, names, layers, n_boot: int, seed: int) -> dict:
    """95% percentile intervals of every selectivity, over the same bootstrap resamples of the held-out histories
    (None below td_probe.MIN_CI_TASKS held-out histories)."""
    keys = [(k, n) for k in layers for n in names]
    if not keys or out.split.test.size < td_probe.MIN_CI_TASKS:
        return {}
    M = np.concatenate([out.sums[k] for k in keys], 1)  # [N_test, len(keys) * 9]
    c = len(SUM_COLUMNS)
    samples = np.concatenate([selectivity_of_sums(b.reshape(b.shape[0], len(keys), c))
                              for b in td_probe.resampled_sums(M, seed, n_boot)], 0)
    iv = td_probe.percentile_interval(samples, td_probe.LEVEL)
    return {k: ([float(iv[0, j]), float(iv[1, j])] if np.all(np.isfinite(iv[:, j])) else None)
            for j, k in enumerate(keys)}


def _num(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None
