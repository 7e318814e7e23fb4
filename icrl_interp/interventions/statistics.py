"""The causal test's statistics on held-out tasks: an edit's effect along the TD direction against the
same edit along random directions (`compare`, per task: `excess`), with 95% percentile bootstrap
intervals over tasks (`interval`).
"""
from __future__ import annotations

import math

import numpy as np


def interval(samples: np.ndarray):
    """[2.5, 97.5] percentiles of bootstrap samples; None when fewer than 95% of them are finite."""
    s = np.asarray(samples, dtype=np.float64)
    ok = s[np.isfinite(s)]
    if ok.size < 0.95 * s.size or ok.size == 0:
        return None
    return [float(np.percentile(ok, 2.5)), float(np.percentile(ok, 97.5))]


def paired_d(diff: np.ndarray) -> np.ndarray:
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
        "td": {"mean": float(td.mean()), "ci": interval(td_b)},
        "random": {"mean": float(rbar.mean()), "ci": interval(r_b), "sd_draws": sd_draws,
                   "draws": [float(v) for v in draws]},
        "difference": {"mean": float(diff.mean()), "ci": interval(diff_b.mean(1))},
        "cohen_d": {"value": num(paired_d(diff)), "ci": interval(paired_d(diff_b))},
        "z_draws": (float((td.mean() - draws.mean()) / sd_draws) if sd_draws > 0 else None),
        "p_random": float((1 + np.sum(draws >= td.mean() - 1e-12 * max(1.0, abs(td.mean())))) / (1 + K)),
    }
    if ratio:
        with np.errstate(divide="ignore", invalid="ignore"):
            rb = np.where(r_b > 0, td_b / r_b, np.nan)
        out["ratio"] = {"value": float(td.mean() / rbar.mean()) if rbar.mean() > 0 else None, "ci": interval(rb)}
    return out


def spread(samples: np.ndarray, refitted: np.ndarray) -> dict:
    """How wide a refitted bootstrap is and what the refits alone vary (`experiment.measure_selective`): `se`, the SD
    of the bootstrap samples; `refit_mean` and `refit_sd`, the mean and SD (ddof 1; None with one refit) of the
    statistic on all held-out tasks per refit. Non-finite values are left out."""
    s, r = (np.asarray(a, dtype=np.float64) for a in (samples, refitted))
    s, r = s[np.isfinite(s)], r[np.isfinite(r)]
    return {"se": num(s.std(ddof=1)) if s.size > 1 else None, "refit_mean": num(r.mean()) if r.size else None,
            "refit_sd": num(r.std(ddof=1)) if r.size > 1 else None}


def num(x) -> float | None:
    """x as a float, None when it is NaN or infinite (JSON has neither)."""
    x = float(x)
    return x if math.isfinite(x) else None
