"""Calibration of the episode verdict's parameter intervals by simulation (docs/episodes.md, "Calibration").

The behavioural fit (`verdicts.behaviour_fit`) gives each fitted parameter (alpha, gamma, beta) a 95 % interval
from refits on bootstrap resamples of the training histories, each refit one Newton step from the fit. Here an
exact episode teacher (`zoo.episode_teachers`, written independently of `tasks.learners`) with known parameters acts
on fresh seeds; each replicate fits the true rule only (`candidates=[rule]`: this measures the intervals, not the
ranking) exactly as the verdict does and counts whether each interval holds the truth, and whether it holds a
wrong value (`calibration.WRONG`, beta: twice the truth), the check that the intervals are not vacuous. Coverage
per (teacher, parameter) comes with a Wilson 95 % interval over replicates (`calibration.cell`).

A parameter the teacher's histories cannot identify is not counted (`UNIDENTIFIED`): on the bandit every step ends
its episode, so gamma never enters the likelihood.
"""
from __future__ import annotations

import time

import numpy as np

from .._version import __version__
from ..core.errors import UserError
from .calibration import WRONG as FAMILY_WRONG
from .calibration import cell, wilson
from .common import params_inside

SCHEMA = "icrl_interp.episode_calibration/1"
ENTRIES = ("q_learning_a0.5", "sarsa_bandit_a0.3")
"""The teachers (`zoo.episode_zoo.ENTRIES`): Q-learning on the Ledge, SARSA on 5-armed bandits."""
UNIDENTIFIED = {"sarsa_bandit_a0.3": ("gamma",)}
"""Parameters that leave the likelihood unchanged on an entry's histories (every bandit step ends its episode)."""
WRONG = {**FAMILY_WRONG, "beta": lambda b: 2.0 * b}
SETTINGS = {"replicates": 40, "histories": 80, "steps": 200, "fit_resamples": 100, "test_fraction": 0.3}


def replicate(name: str, seed: int, histories: int, steps: int, fit_resamples: int, test_fraction: float) -> dict:
    """One replicate: the entry's teacher on fresh histories (seed), its own rule fitted as the verdict does;
    {"params", "inside", "wrong_inside"} as `calibration.cell` reads them."""
    from ..verdicts.behaviour_fit import fit_behaviour
    from .episode_zoo import entry, generate

    e = entry(name)
    eps = generate(e, histories, steps, seed)
    fit = fit_behaviour(eps, candidates=[e.truth.rule], split_seed=seed, test_fraction=test_fraction,
                        fit_resamples=fit_resamples, bootstrap=100)  # held-out resamples: unused here
    reported = fit["candidates"][e.truth.rule]["params"]
    truth = {k: float(v) for k, v in e.truth.params.items() if k not in UNIDENTIFIED.get(name, ())}
    wrong = {k: WRONG[k](v) for k, v in truth.items()}
    return {"params": reported, "inside": {k: v["inside"] for k, v in params_inside(truth, reported).items()},
            "wrong_inside": {k: v["inside"] for k, v in params_inside(wrong, reported).items()}}


def calibrate(replicates: int | None = None, entries=ENTRIES, seed: int = 0, settings: dict | None = None) -> dict:
    """The calibration JSON (`SCHEMA`): per entry and parameter the coverage of the 95 % intervals over fresh
    replicates with Wilson intervals, and pooled per parameter."""
    s = {**SETTINGS, **(settings or {})}
    if replicates is not None:
        s["replicates"] = int(replicates)
    if s["replicates"] < 1 or s["histories"] < 4:
        raise UserError(f"calibration needs >= 1 replicate and >= 4 histories, got {s['replicates']} and "
                        f"{s['histories']}")
    started, cpu = time.perf_counter(), time.process_time()
    cells = []
    for i, name in enumerate(entries):
        rows = [replicate(name, int(np.random.SeedSequence([seed, i, r]).generate_state(1)[0]), s["histories"],
                          s["steps"], s["fit_resamples"], s["test_fraction"]) for r in range(s["replicates"])]
        params = cell(rows)
        for k, v in params.items():  # point intervals (< 1e-6 wide): a fit stopped at a bound, which its refits keep
            v["zero_width"] = int(sum(np.ptp(r["params"][k]["ci"]) < 1e-6 for r in rows if k in r["inside"]))
        cells.append({"entry": name, "parameters": params})
    pooled = {}
    for k in sorted({k for c in cells for k in c["parameters"]}):
        hits = sum(c["parameters"][k]["covered"] for c in cells if k in c["parameters"])
        n = sum(c["parameters"][k]["replicates"] for c in cells if k in c["parameters"])
        pooled[k] = {"covered": hits, "checked": n, "coverage": hits / n, "coverage_ci": wilson(hits, n)}
    return {"schema": SCHEMA, "versions": {"icrl_interp": __version__, "numpy": np.__version__}, "seed": int(seed),
            "settings": s, "cells": cells, "by_parameter": pooled,
            "interval": "95% percentile bootstrap over resampled training histories, one Newton step each",
            "seconds": round(time.perf_counter() - started, 1), "cpu_seconds": round(time.process_time() - cpu, 1)}
