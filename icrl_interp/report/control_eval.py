"""In-context control inside the report: a small closed-loop evaluation (`icrl_interp.train.control`)
of every checkpoint of a family with a control rule (sarsa, actor-critic, ...), stored under the analysis' `control` key.

It runs in the same worker job as the input's analysis and is cached with it; the settings are
part of the cache entry, so changing them re-runs it. The seed is fixed, so a re-run reproduces
the numbers. A failure (bad config, NaN outputs, a crash) never fails the analysis: its reason
goes to `control.error`.
This module imports neither torch nor transformer_lens (the evaluation does, in the worker).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..core.errors import one_line
from ..families import registry

SCHEMA = "icrl_interp.report-control/1"
MAX_CURVE_POINTS = 100
CURVE_KEY = "control.curves"
"""Flattened prefix of the curves: kept in the analysis (cache, figure), left out of summary rows."""
SETTING_KEYS = ("mdps", "iterations", "n", "epsilon", "seed", "rewards", "n_states", "n_actions", "gamma", "alpha", "beta")


@dataclass(frozen=True)
class ControlSettings:
    """What the report's control evaluation runs (everything else: ControlConfig's defaults)."""

    mdps: int = 20
    """Held-out random MDPs; 0 disables the evaluation."""
    iterations: int = 200
    """Closed-loop updates per MDP."""
    seed: int = 0
    """Seed of the MDPs and the sampling stream (fixed, so re-runs are identical)."""

    @property
    def enabled(self) -> bool:
        return self.mdps > 0

    def key(self) -> dict:
        """What the cache entry must match (with the schema, so a format change re-runs)."""
        return {"schema": SCHEMA, **asdict(self)}


def wants_control(kind: str, family) -> bool:
    """Checkpoints of a control family; recordings hold no weights to run in closed loop."""
    found = registry.find(family)
    return kind == "checkpoint" and found is not None and found.control is not None


def subsample(n_points: int, max_points: int = MAX_CURVE_POINTS) -> np.ndarray:
    """At most max_points increasing indices into range(n_points), first and last always kept."""
    if n_points <= max_points:
        return np.arange(n_points)
    return np.unique(np.round(np.linspace(0, n_points - 1, max_points)).astype(int))


def compact(result: dict) -> dict:
    """The report's view of an icrl_interp.control/1 result: final returns, tracking, short curves."""
    curves = result["curves"]
    idx = subsample(len(curves["iteration"]))
    pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
    tracking = result["tracking"]
    div = result["divergence"]
    error = None
    if div["mdps"]:
        first = min(u for u in div["updates"] if u >= 0)
        error = (f"transformer output NaN/Inf in {div['mdps']} of {result['settings']['mdps']} MDPs (first at update "
                 f"{first}); their parameters stayed frozen at the last finite value")
    return {
        "error": error,
        "settings": {k: result["settings"][k] for k in SETTING_KEYS},
        "returns": result["returns"],
        "transformer_minus_teacher": result["transformer_minus_teacher"],
        "tracking": {
            "greedy_agreement": tracking["greedy_agreement"]["mean"],
            "greedy_agreement_min": tracking["greedy_agreement_min"],
            "rel_param_distance": tracking["rel_param_distance"]["mean"],
            "rel_param_distance_max": tracking["rel_param_distance_max"],
        },
        "diverged_mdps": div["mdps"],
        "curves": {
            "iteration": pick(curves["iteration"]),
            "random": curves["random"]["mean"],
            "teacher": {"mean": pick(curves["teacher"]["mean"]), "std": pick(curves["teacher"]["std"])},
            "transformer": {"mean": pick(curves["transformer"]["mean"]), "std": pick(curves["transformer"]["std"])},
            "oracle": curves["oracle"]["mean"],
        },
    }


def evaluate(path: str, settings: ControlSettings) -> dict:
    """The `control` section for one checkpoint; never raises (the reason goes to `error`)."""
    from ..train import control

    try:
        cfg = control.ControlConfig(mdps=settings.mdps, iterations=settings.iterations, seed=settings.seed)
        # one torch thread: tiny batches, and the report may run one worker per core; a diverging
        # model's inf/NaN arithmetic is reported through `error`, not as warnings on stderr
        with np.errstate(all="ignore"):
            return compact(control.run_checkpoint(path, cfg, progress=False, threads=1))
    except Exception as e:  # noqa: BLE001 - a failed control run is a field of the analysis, not a failed input
        prefix = f"{path}: "
        msg = one_line(e)
        return {"error": msg[len(prefix):] if msg.startswith(prefix) else msg,
                "settings": {"mdps": settings.mdps, "iterations": settings.iterations, "seed": settings.seed}}
