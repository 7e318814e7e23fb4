"""The probe and causal targets of a model over learning histories: a candidate learner replayed on the histories
with one setting of its parameters (`analyzers.episode_probes.replay_targets`), either given (`--candidate NAME`
and its parameters) or, by default, the behavioural fit's best rule with its fitted parameters
(`behaviour_fit.fit_behaviour`), fitted to the MODEL's action probabilities on these histories. Used by
`analyze REC.h5` and `causal MODEL --episodes EPS.h5` (docs/episodes.md, "Representation and causation").
"""
from __future__ import annotations

import numpy as np

from ..analyzers.analyze import AnalyzeOptions
from ..analyzers.episode_probes import probe_episodes, replay_targets
from ..analyzers.episode_recording import open_episode_recording
from ..core.errors import UserError
from ..tasks import learners
from .behaviour_fit import fit_behaviour

PARAMS = ("alpha", "gamma", "beta", "lam")


def rule_name(candidate: str) -> str:
    """A learning rule's name as `tasks.learners` spells it (`q-learning`, as `collect --agent`, is `q_learning`)."""
    name = candidate.replace("-", "_")
    learners.rule_class(name)  # one line naming the known rules
    return name


def choose(episodes, *, action_probs=None, candidate: str | None = None, params: dict | None = None,
           split_seed: int = 0, test_fraction: float = 0.3) -> tuple[dict[str, np.ndarray], dict]:
    """(targets {name: [H, T]}, what they are: JSON). `candidate` with `params` ({alpha, gamma, beta, lam}: those the
    rule has, all of them): that rule replayed as given. Else the rule `fit_behaviour` ranks first on held-out
    log-likelihood (split `split_seed`, `test_fraction`), with its fitted parameters, fitted to `action_probs`
    [H, T, A] (the model's) or, when None, to the episodes' own actions. The fit's label is reported beside it:
    when it is "none fits" the targets are still the best rule's, and the page says so."""
    params = {k: v for k, v in (params or {}).items() if v is not None}
    if candidate is None:
        if params:
            flags = ", ".join(sorted(params))
            raise UserError(f"the parameters {flags} are a candidate's: give --candidate NAME with them (without it, the "
                            "behavioural fit chooses the candidate and its parameters)")
        fit = fit_behaviour(episodes, action_probs=action_probs, split_seed=split_seed, test_fraction=test_fraction,
                            fit_resamples=0)
        best = fit["verdict"]["closest"]  # the best rule, also when none fits
        chosen = {k: float(v["value"]) for k, v in fit["candidates"][best]["params"].items()}
        info = {"candidate": best, "params": chosen, "source": "behavioural fit",
                "fitted_to": fit["fitted_to"], "label": fit["verdict"]["label"], "clear": fit["verdict"]["clear"],
                "held_out_loglik": {n: c["held_out_loglik"] for n, c in fit["candidates"].items()},
                "baselines": {n: b["held_out_loglik"] for n, b in fit["baselines"].items()},
                "histories": {k: fit["histories"][k] for k in ("train", "held_out", "split_seed", "test_fraction")}}
    else:
        best = rule_name(candidate)
        learners.check_params(best, **params)  # every parameter the rule has, none it lacks, each in range
        chosen = {k: float(v) for k, v in params.items()}
        info = {"candidate": best, "params": chosen, "source": "given"}
    return replay_targets(episodes, best, **chosen), info


def probe_recording(path, *, candidate: str | None = None, params: dict | None = None, split_seed: int = 0,
                    test_fraction: float = AnalyzeOptions.test_fraction, folds: int = AnalyzeOptions.folds) -> dict:
    """`analyze REC.h5` of an episode recording (`record --episodes`; also `icrl_interp.analyze(path)`): the probes of
    every recorded layer (with the recorded random-init baseline) to the targets `choose` picks, fitted to the
    model's action probabilities; the JSON (`icrl_interp.episode_probes/1`) with `source` and `candidate`. The
    defaults are `analyze`'s (AnalyzeOptions), so the CLI and Python give the same JSON."""
    with open_episode_recording(path) as r:
        t, info = choose(r.episodes, action_probs=r.action_probs(), candidate=candidate, params=params,
                         split_seed=split_seed, test_fraction=test_fraction)
        probes = probe_episodes(r.episodes, r.layers, t, random_layers=r.random_layers, seed=split_seed,
                                test_fraction=test_fraction, folds=folds)
    return {**probes.json, "source": str(path), "candidate": info}
