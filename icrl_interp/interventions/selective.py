"""The selective part of the TD error and the directions the causal test compares (docs/causal.md, "The
selective test").

A layer whose activations carry delta may carry it only because they carry the prompt: at an early layer
the TD error is mostly the reward, and erasing "the TD direction" then moves any model that reads the
reward (a reward-trained decoy included). A model of the immediate reward runs TD with discount 0 (reward
regression), whose error r_k - w.phi_k shares most of delta_k = r_k + gamma w.phi'_k - w.phi_k. So the
target is split on the training tasks by what already explains it (`explained_by`): the prompt's own context
column k (its input features, the reward included) and the same reference run without bootstrapping
(discount 0) at the same step:

* **input-explained part**: the ridge prediction of delta_k from those, fitted on training tasks, evaluated
  on every task;
* **residual (selective) part**: delta_k minus that prediction, the part only bootstrapping explains.

A ridge probe is fitted from the layer's features to each part (`fit`); the residual's probe is the
*selective direction*, the input-explained part's probe the *input-explained direction*. The probe's
selectivity is its held-out R^2 on the residual minus the input's own held-out R^2 on it (clipped at 0
from below), with a bootstrap interval over held-out tasks from per-task sums (`selectivity`).
Plain numpy; the ridge probe itself is `experiment`'s (passed in, so this module imports nothing above it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .statistics import interval, num, spread

TARGET = ("the TD error minus its ridge prediction from the prompt's own context column (its input features, "
          "the reward included) and the no-bootstrapping error (the reference at discount 0, same step), fitted on "
          "the training tasks, subtracted on every task")
"""What the selective probe reads (the JSON's `selective.target`)."""


def explained_by(config, z: np.ndarray, step: int, n: int) -> np.ndarray:
    """[N, n, D + 1]: what explains delta_k without the model: the prompt's context column k and the error of the
    task's reference run at discount 0 (no bootstrapping: reward regression) at reference step `step` (clipped
    to its last step)."""
    from dataclasses import replace

    no_boot = config.task_family_entry.reference(z, replace(config.model, gamma=0.0), config.constants)["td_errors"]
    eps = np.asarray(no_boot, dtype=np.float64)[:, min(step, no_boot.shape[1] - 1), :n]
    return np.concatenate([np.asarray(z, dtype=np.float64)[:, :n], eps[..., None]], -1)


@dataclass(frozen=True)
class Direction:
    """A probe direction at the site, fitted on the training tasks: what an erasure or a steering along it needs."""

    u: np.ndarray
    """Unit probe direction (the ridge coefficients, normalised)."""
    mean: float
    """Mean of u.x over the training columns (mean-ablation sets u.x to it)."""
    std: float
    """Std of u.x over the training columns."""
    cov_xz: np.ndarray
    """Cov(x, target) over the training columns (LEACE erases this concept)."""


def direction(coef: np.ndarray, X: np.ndarray, y: np.ndarray) -> Direction | None:
    """The Direction of probe coefficients `coef` on training features X [m, F] with targets y [m]; None when every
    coefficient is 0 (the probe found nothing to read)."""
    coef = np.asarray(coef, dtype=np.float64)
    norm = float(np.linalg.norm(coef))
    if not (np.isfinite(norm) and norm > 0.0):
        return None
    u = coef / norm
    proj = X @ u
    Xc = X - X.mean(0)
    return Direction(u=u, mean=float(proj.mean()), std=float(proj.std()), cov_xz=Xc.T @ (y - y.mean()) / X.shape[0])


@dataclass
class Selective:
    """The split of the target and its two probes (`fit`)."""

    selective: Direction | None
    """Probe of the residual part (None: all its coefficients are 0)."""
    input: Direction | None
    """Probe of the input-explained part."""
    probe: dict
    """JSON: the explaining inputs' R^2 on delta, the selective probe's R^2 (train, held out, shuffled control), the
    input-explained probe's held-out R^2 (the selectivity and its interval: `selectivity`)."""
    sums: np.ndarray
    """Per held-out task [N_test, 5]: the selective probe's and the input's sum of squared residuals on the residual
    target, its sample count, sum and sum of squares."""


def fit(probe, X: np.ndarray, Z: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray) -> Selective:
    """Split y [N, n] (delta_k per task and context column) by the input Z [N, n, D] (the prompts' context columns)
    and probe both parts from the features X [N, n, F]. `probe(X, y, train, test, shuffled=...)` is the ridge
    probe of `experiment` (penalty by CV over the training tasks), returning coef / intercept / R^2s."""
    by_input = probe(Z, y, train, test, shuffled=False)
    y_in = Z @ by_input["coef"] + by_input["intercept"]
    y_res = y - y_in
    sel = probe(X, y_res, train, test)
    inp = probe(X, y_in, train, test, shuffled=False)
    base = probe(Z, y_res, train, test, shuffled=False)  # the input's own reading of the residual (about 0)
    F = X.shape[-1]
    Xt = X[train].reshape(-1, F)
    out = {"target": TARGET, "input_r2_of_delta": by_input["r2_test"],
           "r2_train": sel["r2_train"], "r2_test": sel["r2_test"], "r2_shuffled": sel["r2_shuffled"],
           "input_r2_test": base["r2_test"], "alpha": sel["alpha"],
           "input_explained_r2_test": inp["r2_test"]}
    yt, n = y_res[test], y.shape[1]
    sse = lambda fitted, feats: ((yt - (feats[test] @ fitted["coef"] + fitted["intercept"])) ** 2).sum(1)  # noqa: E731
    sums = np.stack([sse(sel, X), sse(base, Z), np.full(test.size, float(n)), yt.sum(1), (yt ** 2).sum(1)], 1)
    return Selective(selective=direction(sel["coef"], Xt, y_res[train].ravel()),
                     input=direction(inp["coef"], Xt, y_in[train].ravel()), probe=out, sums=sums)


def selectivity_of(sums: np.ndarray):
    """Selectivity from summed per-task sums [..., 5]: the probe's R^2 on the residual minus max(0, the input's)."""
    from ..analyzers.td_probe import r2_of_sums

    s = np.moveaxis(np.asarray(sums, dtype=np.float64), -1, 0)
    model, inp = r2_of_sums(s[0], s[2], s[3], s[4]), r2_of_sums(s[1], s[2], s[3], s[4])
    return model - np.maximum(inp, 0.0)


def selectivity(sums: np.ndarray, idx: np.ndarray, fits: np.ndarray | None = None) -> dict:
    """{'mean', 'ci'}: the selectivity on all held-out tasks and its 95% bootstrap interval, from their per-task
    sums [N_test, 5] (`Selective.sums`; several folds' concatenated when cross-fitted) and the resamples idx
    [B, N_test] of the held-out tasks, shared with the effects so the criteria are read on the same resamples.
    With the probes refitted (`experiment.refit`): sums [1 + R, N_test, 5], fit 0 on all training tasks (the value),
    and `fits` [B] the fit resample b reads (1..R; None: fit 0), so the interval holds the refits' variation too;
    then also `se`, `refit_mean` and `refit_sd` (`statistics.spread`)."""
    sums = np.asarray(sums, dtype=np.float64)
    sums = sums[None] if sums.ndim == 2 else sums
    fits = np.zeros(len(idx), dtype=np.int64) if fits is None else np.asarray(fits)
    samples = selectivity_of(sums[fits[:, None], idx].sum(1))
    out = {"mean": num(selectivity_of(sums[0].sum(0))), "ci": interval(samples)}
    return {**out, **spread(samples, selectivity_of(sums[1:].sum(1)))} if sums.shape[0] > 1 else out
