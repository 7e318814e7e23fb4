"""The episode zoo: agents with known answers acting in Gymnasium environments, judged by the episode verdict's
behavioural fit (`verdicts.behaviour_fit.fit_behaviour`), and the scores (docs/zoo.md, "Episode zoo").

`ENTRIES` is its table: per entry the truth (the candidate rule with alpha, gamma, beta, or a decoy), the
environment and the agent (`zoo/episode_teachers.py`: exact teachers written independently of
`tasks/learners.py`, and decoys outside every candidate family). `run_episode_zoo(out_dir, ...)` generates
each entry's learning histories, fits them, scores the answer and writes OUT/rows/NAME.json at once (a run
that is stopped resumes where it stopped: a row is reused only when its entry, settings and code version are
the run's) and OUT/episode_zoo.json last, atomically.

Scoring. A teacher is *named right* when the label is its rule, or a rule the verdict reports `equivalent` to
it (identical choices on these histories: on a bandit every step ends its episode, and the one-step rules and
Monte-Carlo control make the same updates); SARSA and expected SARSA count each other
right only where the data cannot tell them apart: the verdict reports the pair indistinguishable *and* the
two rules, replayed with the teacher's own parameters on its histories, give its choices log-likelihoods
whose mean difference per step has a 95 % interval (bootstrap over histories) that covers 0 (`twin`). Its
alpha is *recovered* when the fitted alpha of the named rule lies within `ALPHA_TOLERANCE` (20 %) of the
truth. A decoy is right when the label is "none fits". A `clear` verdict that is not right is a *clear
wrong* one (the target: none).
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._version import __version__
from ..core.errors import UserError
from ..core.files import write_json
from ..interventions.statistics import interval
from ..tasks import learners
from . import episode_teachers as T
from .registry import NONE_FITS
from .run import confusion, stored_row

SCHEMA = "icrl_interp.episode_zoo/1"
LEDGE = "icrl_interp/Ledge-v0"
BANDIT = "icrl_interp/Bandit-v0"
LEDGE_KWARGS = {"rows": 3, "cols": 4}
"""A 3 x 4 Ledge (a ledge of 2 cells; the edge path 5 steps, the safe one 7): on the default 4 x 6 one a teacher
finds the goal too rarely within a history for its rule to show in its choices (measured: every candidate
fitted gamma 0 and tied)."""
ALPHA_TOLERANCE = 0.2
"""A fitted alpha is right within this fraction of the true one (the issue's 20 %)."""
STEPS = 400
"""Steps per learning history (the Ledge's episodes last up to 50 steps: about 20-40 episodes a history)."""
TWIN = (learners.sarsa.__name__, learners.expected_sarsa.__name__)
"""SARSA and expected SARSA: told apart only where the environment makes their choices differ."""
BOOTSTRAP = 1000


@dataclass(frozen=True)
class Truth:
    """What an entry's agent does: `rule` (the verdict's candidate name) with `params`, or a decoy that does
    `rule` (a description)."""

    rule: str
    params: dict = field(default_factory=dict)
    decoy: bool = False


@dataclass(frozen=True)
class EpisodeEntry:
    name: str
    truth: Truth
    agent: Callable[[], T.Agent]
    """A fresh agent (one per history: `start` resets it)."""
    env: str = LEDGE
    env_kwargs: dict = field(default_factory=lambda: dict(LEDGE_KWARGS))
    description: str = ""


def _teacher(rule: str, target: str, alpha: float, gamma: float, beta: float) -> EpisodeEntry:
    params = {"alpha": alpha, "gamma": gamma, "beta": beta}
    return EpisodeEntry(f"{rule}_a{alpha:g}", Truth(rule, params), lambda: T.Teacher(target, alpha, gamma, beta),
                        description=f"exact teacher: {rule}, softmax(beta Q)")


GAMMA, BETA = 0.9, 3.0
"""The teachers' discount and inverse temperature (beta 1 leaves the choices near uniform within 400 steps)."""
ENTRIES: tuple[EpisodeEntry, ...] = (
    _teacher(learners.q_learning.__name__, "max", 0.5, GAMMA, BETA),
    _teacher(learners.sarsa.__name__, "sample", 0.3, GAMMA, BETA),
    _teacher(learners.expected_sarsa.__name__, "expected", 0.3, GAMMA, BETA),
    _teacher(learners.mc_control.__name__, "return", 0.2, GAMMA, BETA),
    EpisodeEntry(f"{learners.sarsa.__name__}_bandit_a0.3", Truth(learners.sarsa.__name__,
                                                                  {"alpha": 0.3, "gamma": GAMMA, "beta": BETA}),
                 lambda: T.Teacher("sample", 0.3, GAMMA, BETA), env=BANDIT, env_kwargs={"arms": 5},
                 description="exact teacher: SARSA on 5-armed Bernoulli bandits (arm probabilities drawn per history), "
                             "where every step ends its episode: Q-learning, SARSA, expected SARSA and Monte-Carlo "
                             "control make the same updates, and the verdict can only call them equivalent"),
    EpisodeEntry("decoy_fixed_policy", Truth("fixed_policy", decoy=True), lambda: T.FixedPolicy(0),
                 description="decoy: a fixed stochastic policy, one Dirichlet(1) draw per observation, the same "
                             "for every history"),
    EpisodeEntry("decoy_perseverating", Truth("perseverating", decoy=True), T.Perseverating,
                 description="decoy: repeats its first (uniform) action whatever the reward"),
    EpisodeEntry("decoy_cycling", Truth("cycling", decoy=True), T.Cycling,
                 description="decoy: actions 0, 1, 2, ... cyclically from a per-history random offset"),
    EpisodeEntry("decoy_final_policy", Truth("final_policy", decoy=True), lambda: T.FinalPolicy(GAMMA, BETA),
                 description=f"decoy: softmax(beta Q*) of the task (value iteration), beta {BETA}, gamma {GAMMA}: "
                             "acts well from its first step, learns nothing"),
)


def entry(name: str) -> EpisodeEntry:
    for e in ENTRIES:
        if e.name == name:
            return e
    raise UserError(f"no episode-zoo entry named {name!r} (known: {', '.join(e.name for e in ENTRIES)})")


# ------------------------------------------------------------------ generating histories
def generate(e: EpisodeEntry, histories: int, steps: int, seed: int, trace: bool = False):
    """The entry's learning histories as `Episodes` (history h seeded [seed, h]); with `trace`, also the
    teacher's own Q rows [H, T, A] and log-probabilities [H, T] it acted with (None for decoys)."""
    from ..tasks.environments import env_from_spec
    from ..tasks.episodes import ARRAYS, Episodes

    hs = [T.run_history(env_from_spec(e.env, **e.env_kwargs), e.agent(), steps, seed, h) for h in range(histories)]
    env = env_from_spec(e.env, **e.env_kwargs)

    def stack(k):
        return np.stack([h[k] for h in hs])

    meta = {"env": e.env, "env_kwargs": e.env_kwargs, "agent": e.name, "truth": _truth_json(e.truth),
            "seed": int(seed), "tasks": [h["task"] for h in hs], "zoo": SCHEMA}
    eps = Episodes(**{k: stack(k) for k in ARRAYS if k != "valid"}, valid=np.ones((histories, steps), bool),
                   n_actions=int(env.action_space.n), n_observations=int(env.observation_space.n), meta=meta)
    if not trace:
        return eps
    has = hs[0]["q"] is not None
    return eps, (stack("q") if has else None), (stack("log_prob") if has else None)


def _truth_json(t: Truth) -> dict:
    return {"algorithm": t.rule, "params": t.params, "decoy": t.decoy}


# ------------------------------------------------------------------ scoring
def twin_gap(episodes, truth: Truth, seed: int, bootstrap: int = BOOTSTRAP) -> dict | None:
    """For a SARSA or expected-SARSA teacher: how much better its own rule explains its choices than the twin's,
    both replayed with the teacher's parameters: the mean per step of log pi_own(a_t) - log pi_twin(a_t), its 95 %
    interval over histories, and the mean total variation between the two policies per step."""
    if truth.decoy or truth.rule not in TWIN:
        return None
    other = TWIN[1 - TWIN.index(truth.rule)]
    own, twin = (learners.replay(r, episodes, **truth.params) for r in (truth.rule, other))
    gap = np.nansum(own.log_prob - twin.log_prob, 1)  # per history
    n = episodes.valid.sum(1)
    draws = np.random.default_rng([seed, 0x7E1]).integers(0, len(n), (bootstrap, len(n)))
    beta = truth.params["beta"]
    tv = 0.5 * np.abs(learners.policy(own.q, beta) - learners.policy(twin.q, beta)).sum(-1)
    ci = interval(gap[draws].sum(1) / n[draws].sum(1))
    return {"twin": other, "loglik_gap_per_step": float(gap.sum() / n.sum()), "ci": ci,
            "differ": bool(ci is not None and ci[0] > 0), "mean_tv": float(np.nanmean(tv))}


def score(truth: Truth, fit: dict, twin: dict | None) -> dict:
    """Named right, alpha recovered (teachers), clear wrong (module docstring)."""
    v = fit["verdict"]
    label, clear = v["label"], bool(v["clear"])
    if truth.decoy:
        right = label == NONE_FITS
        return {"named_right": right, "alpha_checked": False, "alpha_right": None, "right": right,
                "clear_wrong": bool(clear and not right)}
    pair = next((p for p in v.get("pairs") or [] if set(p["candidates"]) == set(TWIN)), None)
    twin_ok = bool(twin is not None and label == twin["twin"] and not twin["differ"]
                   and pair is not None and pair["indistinguishable"])
    same = truth.rule in (v.get("equivalent") or [])  # the rules chose identically on these histories
    right = label == truth.rule or twin_ok or same
    out = {"named_right": right, "alpha_checked": False, "alpha_right": None}
    fitted = ((fit["candidates"].get(label) or {}).get("params") or {}).get("alpha") if right else None
    if "alpha" in truth.params and fitted is not None:
        a, f = truth.params["alpha"], fitted["value"]
        out.update(alpha_checked=True, alpha_fitted=f, alpha_ci=fitted.get("ci"),
                   alpha_right=bool(abs(f - a) <= ALPHA_TOLERANCE * a))
    out["right"] = bool(right and out["alpha_right"] is not False)
    out["clear_wrong"] = bool(clear and not right)
    return out


def judge(e: EpisodeEntry, settings: dict) -> dict:
    """One entry's row: its truth, the verdict's answer and fitted parameters, the score."""
    from ..verdicts.behaviour_fit import fit_behaviour

    start = time.perf_counter()
    eps = generate(e, settings["histories"], settings["steps"], settings["seed"])
    made = time.perf_counter()
    fit = fit_behaviour(eps, split_seed=settings["seed"], bootstrap=settings["bootstrap"],
                        fit_resamples=settings["fit_resamples"], source=f"episode zoo: {e.name}")
    twin = twin_gap(eps, e.truth, settings["seed"])
    v = fit["verdict"]
    return {
        "name": e.name, "env": e.env, "env_kwargs": e.env_kwargs, "description": e.description,
        "truth": _truth_json(e.truth),
        "verdict": {"label": v["label"], "closest": v.get("closest"), "clear": bool(v["clear"]),
                    "margin": v.get("margin"), "margin_ci": v.get("margin_ci"), "runner_up": v.get("runner_up"),
                    "pairs": v.get("pairs"), "text": v.get("text"),
                    "params": (fit["candidates"].get(v.get("closest")) or {}).get("params")},
        "held_out_loglik": {**{c: r["held_out_loglik"] for c, r in fit["candidates"].items()},
                            **{b: r["held_out_loglik"] for b, r in fit["baselines"].items()}},
        "twin": twin, "score": score(e.truth, fit, twin), "fit": fit,
        "mean_return_per_step": float(eps.rewards.mean()),
        "seconds": {"generate": round(made - start, 2), "fit": round(time.perf_counter() - made, 2)},
    }


def summarize(rows: list[dict]) -> dict:
    teachers = [r for r in rows if not r["truth"]["decoy"]]
    decoys = [r for r in rows if r["truth"]["decoy"]]
    checked = [r for r in teachers if r["score"]["alpha_checked"]]
    out = {"entries": len(rows), "teachers": len(teachers), "decoys": len(decoys),
           "teachers_named_right": sum(r["score"]["named_right"] for r in teachers),
           "alpha_checked": len(checked), "alpha_within_20pct": sum(bool(r["score"]["alpha_right"]) for r in checked),
           "decoys_none_fits": sum(r["score"]["named_right"] for r in decoys),
           "clear_wrong": sum(r["score"]["clear_wrong"] for r in rows),
           "failures": [r["name"] for r in rows if not r["score"]["right"] or r["score"]["clear_wrong"]]}
    out["targets"] = {"every_teacher_named": out["teachers_named_right"] == len(teachers),
                      "every_alpha_within_20pct": out["alpha_within_20pct"] == len(teachers),
                      "every_decoy_none_fits": out["decoys_none_fits"] == len(decoys),
                      "no_clear_wrong": out["clear_wrong"] == 0}
    return out


def fingerprint(e: EpisodeEntry, settings: dict) -> str:
    """What a stored row must match to be reused: the entry, the settings and the code version."""
    key = {"entry": [e.name, e.env, e.env_kwargs, _truth_json(e.truth)], "settings": settings, "version": __version__}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_episode_zoo(out_dir, histories: int = 200, steps: int = STEPS, seed: int = 0, only=None,
                    bootstrap: int = BOOTSTRAP, fit_resamples: int = 100, progress: bool = False) -> dict:
    """Judge every entry (or those named in `only`) into OUT/rows/, then write OUT/episode_zoo.json; returns it."""
    from tqdm import tqdm

    if histories < 4 or steps < 1:
        raise UserError(f"the episode zoo needs at least 4 histories of at least 1 step, got {histories} x {steps}")
    entries = [entry(n) for n in only] if only is not None else list(ENTRIES)
    settings = {"histories": int(histories), "steps": int(steps), "seed": int(seed), "bootstrap": int(bootstrap),
                "fit_resamples": int(fit_resamples)}
    out = Path(out_dir)
    (out / "rows").mkdir(parents=True, exist_ok=True)
    rows, started = [], time.perf_counter()
    for e in tqdm(entries, desc="episode zoo", unit="agent", disable=not progress):
        path, key = out / "rows" / f"{e.name}.json", fingerprint(e, settings)
        row = stored_row(path, key)
        if row is None:
            row = {**judge(e, settings), "fingerprint": key}
            write_json(path, row)
        rows.append({**row, "score": score(e.truth, row["fit"], row["twin"])})  # today's scoring of a stored row
    result = {"schema": SCHEMA, "versions": {"icrl_interp": __version__, "numpy": np.__version__},
              "settings": settings, "alpha_tolerance": ALPHA_TOLERANCE, "rows": rows, "summary": summarize(rows),
              "confusion": confusion(rows), "seconds": round(time.perf_counter() - started, 1)}
    write_json(out / "episode_zoo.json", result)
    return result
