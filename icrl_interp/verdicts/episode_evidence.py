"""The verdict on an episode recording (`icrl-interp verdict REC.h5`, docs/episodes.md "The verdict on a
recording"): the behavioural fit (`behaviour_fit.fit_behaviour`) to the model's own action probabilities, and
beside it the representation evidence.

Representation evidence: every candidate, replayed with ITS OWN fitted parameters
(`analyzers.episode_probes.replay_targets`), gives targets delta, Q(s, a) and V(s); one call of
`analyzers.episode_probes.probe_episodes` probes every recorded layer for all of them (and delta's selective
part), with the input, random-init and shuffled baselines. Each probe's held-out R^2 gets a 95 % percentile
interval over bootstrap resamples of the held-out histories; every (layer, target) is scored on the same
resamples (`td_probe.resampled_sums` of all their per-history sums at once), so any two are paired.

One split: the probes' split by history (`episode_probes.split_histories(H, split_seed, test_fraction)`) fixes
the behavioural fit's held-out histories too, so no held-out history was seen by the fitted parameters or by
a probe. A step is probed where every candidate's targets are defined (the same steps for every candidate).

Agreement with the behavioural winner (the fit's best rule, `verdict.closest`) and its runner-up: at the
comparison layer, the recorded layer where the two candidates' delta probes have the largest mean held-out R^2
(symmetric: the choice favours neither), the difference winner - runner-up of their delta-probe R^2 with a
PAIRED interval (both on the same resamples):

* ``not carried``: the winner's delta is selective at no layer (its selective part beats the input, random-init
  and shuffled baselines nowhere: `episode_probes`' selectivity interval above 0 at no layer);
* ``alike``: else, the interval lies inside +-`NEGLIGIBLE_R2` (the two rules' TD errors are carried equally well:
  the representation does not tell them apart, however narrow the interval);
* ``disagrees``: else, the interval lies below 0 (the runner-up's delta is the better carried);
* ``agrees``: else, the interval lies above 0;
* ``inconclusive``: otherwise (the interval covers 0).
Without a runner-up (one candidate, or every other one identical on these histories) only selectivity counts.

The behavioural fit alone sets the label and `clear` (as `verdict --episodes`); the representation evidence is
reported beside them, and the verdict's text says so when it does not agree.
"""
from __future__ import annotations

import numpy as np

from ..analyzers import td_probe
from ..analyzers.episode_probes import probe_episodes, replay_targets, split_histories
from ..core.errors import UserError
from ..interventions.statistics import interval
from .behaviour_fit import fit_behaviour

PROBED = ("delta", "q", "v")
"""The targets of every candidate probed (delta's selective part is added by the probes)."""
REPORTED = ("delta", "delta_selective", "q", "v")
AGREEMENT = ("agrees", "alike", "disagrees", "not carried", "inconclusive")
NEGLIGIBLE_R2 = 0.01
"""A paired R^2 difference inside +-0.01 is no difference (frozen before the AD model was judged): two rules
whose TD errors correlate (Q-learning and SARSA under a near-greedy policy) are decoded within a few thousandths
of each other, and with hundreds of held-out histories such a gap is 'significant' without meaning anything."""


def key(candidate: str, target: str) -> str:
    """The probe target's name: candidate/target."""
    return f"{candidate}/{target}"


def r2_samples(sums: np.ndarray, seed: int, n_boot: int) -> np.ndarray:
    """[n_boot, K] held-out R^2 of K probes over bootstrap resamples of the held-out histories, from their
    per-history sums `sums` [N_test, K, len(episode_probes.SUM_COLUMNS)] (`EpisodeProbes.sums`); every probe is
    scored on the same resamples (one weight matrix per block), so columns are paired."""
    N, K, c = sums.shape
    out = []
    for b in td_probe.resampled_sums(sums.reshape(N, K * c), seed, n_boot):
        s = b.reshape(-1, K, c)
        out.append(td_probe.r2_of_sums(s[..., 0], s[..., 3], s[..., 4], s[..., 5]))
    return np.concatenate(out, 0)


def representation(episodes, layers, random_layers, fit: dict, *, seed: int, test_fraction: float,
                   n_boot: int = td_probe.BOOTSTRAP) -> dict:
    """The representation evidence (module docstring) of the behavioural fit `fit` (`fit_behaviour`'s JSON, made
    with the probes' held-out histories) on `layers` {layer: [H, T, d]} (and the random-init model's)."""
    names = list(fit["candidates"])
    params = {n: {k: float(p["value"]) for k, p in fit["candidates"][n]["params"].items()} for n in names}
    targets = {}
    for n in names:
        t = replay_targets(episodes, n, **params[n])
        targets.update({key(n, k): t[k] for k in PROBED})
    probes = probe_episodes(episodes, layers, targets, random_layers=random_layers,
                            selective=tuple(key(n, "delta") for n in names), seed=seed, test_fraction=test_fraction,
                            n_boot=n_boot)
    keys = [(layer, key(n, k)) for layer in layers for n in names for k in REPORTED]
    samples = r2_samples(np.stack([probes.sums[k] for k in keys], 1), seed, n_boot)
    col = {k: j for j, k in enumerate(keys)}
    cands = {}
    for n in names:
        per_layer = {}
        for layer in layers:
            per_layer[str(layer)] = {k: {**probes.json["layers"][str(layer)][key(n, k)],
                                         "r2_ci": interval(samples[:, col[(layer, key(n, k))]])} for k in REPORTED}
        cands[n] = {"params": params[n], "layers": per_layer,
                    "delta_explained_by_input": probes.json["explained"][key(n, "delta")]["r2_test"]}
    out = {"split": probes.json["split"], "held_out_indices": probes.split.test.tolist(),
           "steps_probed": int(probes.mask.sum()), "bootstrap": int(n_boot), "delta_lag": probes.json["delta_lag"],
           "candidates": cands}
    out["agreement"] = agreement(fit["verdict"], cands, samples, col, list(layers))
    return out


def agreement(verdict: dict, cands: dict, samples: np.ndarray, col: dict, layers: list) -> dict:
    """Whether the representation evidence agrees with the behavioural winner (module docstring)."""
    win, run = verdict["closest"], verdict.get("runner_up")
    selective = [str(layer) for layer in layers if cands[win]["layers"][str(layer)]["delta_selective"]["selective"]]
    out = {"winner": win, "runner_up": run, "winner_selective_layers": selective, "layer": None,
           "winner_r2": None, "runner_up_r2": None, "difference": None, "ci": None, "paired": True}
    if run is not None:
        def r2(c, layer):  # a probe whose held-out target has no variance has no R^2: never the layer chosen
            x = cands[c]["layers"][str(layer)]["delta"]["r2"]
            return -np.inf if x is None else x

        layer = max(layers, key=lambda x: r2(win, x) + r2(run, x))
        a, b = (samples[:, col[(layer, key(c, "delta"))]] for c in (win, run))
        rw, rr = cands[win]["layers"][str(layer)]["delta"]["r2"], cands[run]["layers"][str(layer)]["delta"]["r2"]
        out.update(layer=str(layer), winner_r2=rw, runner_up_r2=rr,
                   difference=None if rw is None or rr is None else rw - rr, ci=interval(a - b))
    ci = out["ci"]
    where = f"layer {out['layer']}"
    diff = "" if ci is None or out["difference"] is None else (
        f"delta-probe R² {out['winner_r2']:.3f} vs {run}'s {out['runner_up_r2']:.3f} at {where}, paired difference "
        f"{out['difference']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]")
    if not selective:
        label, text = "not carried", (f"{win}'s TD error is carried at no layer beyond the input, random-init and "
                                      "shuffled baselines (its selective part's interval is above 0 nowhere)"
                                      + (f"; {diff}" if diff else ""))
    elif ci is not None and -NEGLIGIBLE_R2 < ci[0] and ci[1] < NEGLIGIBLE_R2:
        label, text = "alike", (f"{win}'s and {run}'s TD errors are carried alike (within ±{NEGLIGIBLE_R2} R²): "
                                f"{diff}")
    elif ci is not None and ci[1] < 0:
        label, text = "disagrees", f"{run}'s TD error is carried better than {win}'s: {diff}"
    elif run is None or (ci is not None and ci[0] > 0):
        label = "agrees"
        text = f"{win}'s TD error is carried selectively (layers {', '.join(selective)})"
        text += f"; {diff}" if diff else ""
    else:
        label = "inconclusive"
        text = (f"{win}'s TD error is carried selectively (layers {', '.join(selective)}), but not told apart from "
                f"{run}'s: " + (diff or "no interval"))
    out.update(label=label, text=f"representation {label}: {text}")
    return out


def verdict_on_recording(rec, *, split_seed: int = 0, test_fraction: float = 0.3, bootstrap: int = 1000,
                         fit_resamples: int = 100, candidates=None, source: str | None = None) -> dict:
    """The episode verdict (schema `behaviour_fit.SCHEMA`) of an open episode recording
    (`analyzers.episode_recording.EpisodeRecording`): the behavioural fit to its action probabilities on the
    probes' held-out histories, with `representation` beside it (module docstring)."""
    if bootstrap < 10:
        raise UserError(f"bootstrap must be at least 10, got {bootstrap}")
    ep = rec.episodes
    held = split_histories(ep.n_histories, split_seed, test_fraction).test
    fit = fit_behaviour(ep, action_probs=rec.action_probs(), split_seed=split_seed, test_fraction=test_fraction,
                        bootstrap=bootstrap, fit_resamples=fit_resamples, candidates=candidates, source=source,
                        held_out=held)
    rep = representation(ep, rec.layers, rec.random_layers, fit, seed=split_seed, test_fraction=test_fraction,
                         n_boot=bootstrap)
    fit["representation"] = rep
    a = rep["agreement"]
    v = fit["verdict"]
    v["representation"] = a["label"]
    v["text"] += f"; {a['text']}"
    if a["label"] != "agrees":
        v["text"] += " (the label is the behavioural fit's; the representation evidence does not back it)"
    return fit
