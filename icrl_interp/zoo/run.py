"""Run the zoo: build every entry, judge it with the verdict and the causal test, score the answers against
the known truth, and write DIR/zoo.json (docs/zoo.md).

Per entry (`judge`): `verdicts.causal_evidence.verdict(model=..., task=...)` on the entry's task and seeds,
and, where the entry names a layer, `interventions.causal.causal_test` there. The decision thresholds are
the verdict's and the causal test's own documented defaults (`THRESHOLDS`, read from their signatures and
frozen in the JSON before anything is scored); nothing here tunes them. Each finished entry is written to
DIR/rows/NAME.json at once, so an interrupted run resumes where it stopped (a row is reused only when its
entry, settings and code version are those of the run); DIR/zoo.json is written last, atomically. Where the
set's settings ask for it (`full`), the intervals' calibration by simulation (zoo/calibration.py) runs after the
rows, is stored in DIR/calibration.json (resumed the same way) and decides the interval-coverage target.

The JSON keys of the verdict and the causal section are read with `.get`, so rows from older and newer
versions of either read the same: the verdict's label (`verdict.label`; before it existed: the best
candidate where one fits, else "none fits"), its fitted parameters (`verdict.params`: {name: {value, ci}}),
the causal `conclusion` ("yes" / "no" / "inconclusive"; before it existed: the first word of the random-init
comparison's `exceeds_random_init`).
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import time
from pathlib import Path

import numpy as np

from .._version import __version__
from ..core.errors import UserError
from ..core.files import write_json
from . import registry as R
from .common import one_thread, params_inside

SCHEMA = "icrl_interp.zoo/1"
SETTINGS = {
    "default": {"tasks": 160, "bootstrap": 200, "causal_tasks": 96, "random_draws": 8, "max_step": 8,
                "calibration_replicates": 0, "causal_refits": 2},
    "full": {"tasks": 256, "bootstrap": 300, "causal_tasks": 512, "random_draws": 16, "max_step": 8,
             "calibration_replicates": 100, "causal_refits": 8},
}
"""Sizes per set: tasks recorded for the verdict, bootstrap resamples, tasks and random directions of the causal
test (the full set's 512: at 256 a layer-targeted mimic whose "beats the input", the rule before the input share,
was about 0.009 stayed inconclusive; docs/causal.md, "The zoo's task count"), the verdict's largest step k (8: the
deepest teacher runs 2 layers x 4 steps), the replicates per (teacher, noise) of the interval calibration run with
the zoo (`calibration_block`; 0: none, so the default set stays fast; 100 x 4 cells cost about 300 CPU s), and the
causal test's refits of its directions (`causal_test`'s `refits`: its intervals hold how the fitted directions
vary; the full set the command's default 8, the default set 2, so it stays fast). An optional `calibration_tasks` sets the tasks per replicate
(tests; else `calibration.SETTINGS`)."""
CALIBRATION_FILE = "calibration.json"
CALIBRATION_KEYS = ("schema", "seed", "settings", "noises", "target", "interval", "cells", "summary", "seconds",
                    "cpu_seconds", "fingerprint")
"""What zoo.json's `calibration` block keeps of DIR/calibration.json (all but the versions, which zoo.json has)."""


def thresholds() -> dict:
    """The frozen decision thresholds: the verdict's and the causal test's defaults, as documented."""
    from ..interventions import causal
    from ..verdicts import causal_evidence

    v = inspect.signature(causal_evidence.verdict).parameters
    c = inspect.signature(causal.causal_test).parameters
    out = {"verdict.min_r2": v["min_r2"].default, "verdict.test_fraction": v["test_fraction"].default,
           "causal.method": c["method"].default, "causal.test_fraction": c["test_fraction"].default,
           "interval": "95% percentile bootstrap over held-out tasks"}
    for name in ("clear_alpha", "alpha_level", "level"):  # whatever further threshold the verdict documents
        if name in v:
            out[f"verdict.{name}"] = v[name].default
    frozen = getattr(causal, "THRESHOLDS", None)  # the causal conclusion's own frozen table, where it has one
    if isinstance(frozen, dict):
        out["causal.conclusion"] = dict(frozen)
    return out


# ------------------------------------------------------------------ reading the answers
def label_of(verdict: dict) -> str:
    """The verdict's answer: its `label`, else the best candidate where one fits, else 'none fits'."""
    v = verdict.get("verdict") or {}
    label = v.get("label")
    if isinstance(label, str) and label:
        return label
    return v["best"] if v.get("fits") and v.get("best") else R.NONE_FITS


def conclusion_of(section: dict | None) -> tuple[str | None, str | None]:
    """(conclusion, reason) of a causal section: `conclusion`/`reason`, else the random-init comparison's verdict."""
    if not section:
        return None, None
    c = section.get("conclusion")
    if isinstance(c, dict):  # {"answer"/"conclusion": ..., "reason": ...}
        return c.get("answer") or c.get("conclusion"), c.get("reason")
    if isinstance(c, str):
        return c, section.get("conclusion_reason", section.get("reason"))
    text = (((section.get("baseline") or {}).get("comparison") or {}).get("exceeds_random_init"))
    if isinstance(text, str):
        return text.split(":", 1)[0].strip(), "pre-conclusion API: the random-init comparison: " + text
    return None, "no conclusion in the causal section"


def probe_of(verdict: dict, layer, algorithm: str) -> dict | None:
    """The representation evidence at `layer` (default: the last): the selectivity of the true algorithm's
    most selective quantity, and of the top candidate."""
    layers = verdict.get("layers") or []
    row = next((r for r in layers if r.get("layer") == layer), layers[-1] if layers else None)
    rep = (row or {}).get("representation") or {}
    if not rep.get("available"):
        return None
    cands = rep.get("candidates") or {}
    own = cands.get(algorithm) or {}
    top = max(cands, key=lambda c: -math.inf if cands[c].get("best_selectivity") is None
              else cands[c]["best_selectivity"], default=None)
    return {"layer": row.get("layer"), "truth_selectivity": own.get("best_selectivity"),
            "truth_selectivity_ci": own.get("best_selectivity_ci"), "top": top,
            "top_selectivity": cands[top].get("best_selectivity") if top else None}


def score(truth: R.Truth, label: str, clear: bool, inside: dict, conclusion: str | None, kind: str = "trained") -> dict:
    """Whether the answers are right. The causal conclusion is scored for decoys (never "yes") and trained models
    (their layer-targeted computation: "yes"); for an exact teacher it is reported, not scored: its every layer
    re-reads the whole prompt column, so a random direction can matter as much as its error row."""
    right = label in truth.right()
    params_ok = all(v["inside"] for v in inside.values())
    out = {"named_right": right, "params_checked": len(inside),
           "params_inside": sum(v["inside"] for v in inside.values()),
           "right": bool(right and (truth.decoy or params_ok)), "clear_wrong": bool(clear and not right)}
    if conclusion is not None and (truth.decoy or kind == "trained"):
        out["causal_right"] = conclusion == "yes" if not truth.decoy else conclusion != "yes"
    return out


# ------------------------------------------------------------------ one entry
def judge(entry: R.Entry, settings: dict, progress: bool = False) -> dict:
    """The row of one entry: its truth, the verdict, the causal conclusion at its layer, the score."""
    with one_thread():
        return _judge(entry, settings, progress)


def _judge(entry: R.Entry, settings: dict, progress: bool) -> dict:
    from ..interventions import causal
    from ..verdicts.causal_evidence import verdict

    start, cpu = time.perf_counter(), time.process_time()
    model = entry.model()
    config = entry.config()
    v = verdict(model=model, task=config, probe=entry.probe_roles, tasks=settings["tasks"], prompt_seed=entry.seed,
                seed=entry.seed, bootstrap=settings["bootstrap"], steps=settings["max_step"], progress=progress,
                label=entry.name)
    section = None
    if entry.truth.target_layer is not None:
        section = causal.causal_test(model, config, entry.truth.target_layer, roles=entry.probe_roles,
                                     tasks=settings["causal_tasks"], seed=entry.seed,
                                     random_draws=settings["random_draws"], bootstrap=settings["bootstrap"],
                                     refits=settings.get("causal_refits", causal.DEFAULT_REFITS),
                                     # the conclusion reads the selective test only: the random-init baseline and
                                     # the steering curve would cost half the test's CPU and change no answer
                                     baseline="none", steer=())
    fin = v.get("verdict") or {}
    label = label_of(v)
    inside = params_inside(entry.truth.params, fin.get("params"))
    conclusion, reason = conclusion_of(section)
    return {
        "name": entry.name, "kind": entry.kind, "family": entry.family, "task_options": entry.task_options,
        "seed": entry.seed, "description": entry.description,
        "truth": {"algorithm": entry.truth.algorithm, "params": entry.truth.params, "decoy": entry.truth.decoy,
                  "target_layer": entry.truth.target_layer, "accepted": list(entry.truth.right())},
        "verdict": {"label": label, "best": fin.get("best"), "fits": fin.get("fits"), "clear": bool(fin.get("clear")),
                    "margin": fin.get("margin"), "margin_ci": fin.get("margin_ci"), "params": fin.get("params"),
                    "text": fin.get("text"), "runner_up": fin.get("runner_up"),
                    "steps": {c: g.get("steps") for c, g in (v.get("step_growth") or {}).items()
                              if c == entry.truth.algorithm or c == fin.get("best")}},
        "params_vs_truth": inside,
        "causal": None if section is None else {"layer": entry.truth.target_layer, "conclusion": conclusion,
                                                "reason": reason},
        "probe": probe_of(v, entry.truth.target_layer, entry.truth.algorithm),
        "score": score(entry.truth, label, bool(fin.get("clear")), inside, conclusion, entry.kind),
        "seconds": round(time.perf_counter() - start, 2),
        "cpu_seconds": round(time.process_time() - cpu, 2),  # this process's CPU (all its threads): load-independent
    }


# ------------------------------------------------------------------ the whole zoo
def summarize(rows: list[dict], calibration: dict | None = None) -> dict:
    """The headline numbers over the rows (docs/zoo.md, "Reading zoo.json"). The interval-coverage target is read
    from `calibration` (the run's `calibration_block`: noisy teachers, coverage by simulation), None without one:
    the rows' own coverage (`interval_coverage_noise_free`) is mostly of noise-free exact teachers whose refits all
    agree (100 % whether or not the intervals are calibrated), so it decides nothing."""
    non = [r for r in rows if not r["truth"]["decoy"]]
    dec = [r for r in rows if r["truth"]["decoy"]]
    pairs = [p for r in rows for p in r["params_vs_truth"].values()]
    targeted = [r for r in non if r["causal"] and r["causal"]["conclusion"] is not None]
    dec_causal = [r for r in dec if r["causal"] and r["causal"]["conclusion"] is not None]

    def rate(hits, of):
        return None if not of else hits / of

    out = {
        "models": len(rows), "decoys": len(dec), "non_decoys": len(non),
        "kinds": {k: sum(r["kind"] == k for r in rows) for k in R.KINDS},
        "non_decoys_right": sum(r["score"]["right"] for r in non),
        "accuracy_non_decoys": rate(sum(r["score"]["right"] for r in non), len(non)),
        "named_right_non_decoys": rate(sum(r["score"]["named_right"] for r in non), len(non)),
        "decoys_refused": sum(r["score"]["named_right"] for r in dec),
        "decoys_reward_regression": sum(r["verdict"]["label"] == R.REWARD_REGRESSION for r in dec),
        "clear_wrong": sum(r["score"]["clear_wrong"] for r in rows),
        "causal_yes_rate_exact_targets": rate(
            sum(r["causal"]["conclusion"] == "yes" for r in targeted if r["kind"] == "exact"),
            sum(r["kind"] == "exact" for r in targeted)),
        "causal_yes_rate_trained_targets": rate(
            sum(r["causal"]["conclusion"] == "yes" for r in targeted if r["kind"] == "trained"),
            sum(r["kind"] == "trained" for r in targeted)),
        "causal_decoys_yes": sum(r["causal"]["conclusion"] == "yes" for r in dec_causal),
        "causal_decoys_tested": len(dec_causal),
        "params_checked": len(pairs),
        "interval_coverage_noise_free": rate(sum(p["inside"] for p in pairs), len(pairs)),
        "failures": [r["name"] for r in rows if not r["score"]["right"] or r["score"]["clear_wrong"]],
    }
    pooled = ((calibration or {}).get("summary") or {}).get("overall") or {}
    out.update({"calibration_coverage": pooled.get("coverage"), "calibration_coverage_ci": pooled.get("coverage_ci"),
                "calibration_covered": pooled.get("covered"), "calibration_checked": pooled.get("checked")})
    acc, cov, yes = out["accuracy_non_decoys"], out["calibration_coverage"], out["causal_yes_rate_trained_targets"]
    out["targets"] = {
        "non_decoys_right_ge_0.9": None if acc is None else acc >= 0.9,
        "every_decoy_refused": out["decoys_refused"] == len(dec),
        "no_clear_wrong": out["clear_wrong"] == 0,
        "no_decoy_causal_yes": out["causal_decoys_yes"] == 0,
        "causal_yes_trained_targets_ge_0.9": None if yes is None else yes >= 0.9,
        "coverage_in_0.90_0.99": None if cov is None else 0.90 <= cov <= 0.99,
    }
    return out


def confusion(rows: list[dict]) -> dict:
    """Counts of (true algorithm, verdict label): decoys as 'decoy: <what it computes>'."""
    truth = [("decoy: " if r["truth"]["decoy"] else "") + r["truth"]["algorithm"] for r in rows]
    said = [r["verdict"]["label"] for r in rows]
    ys = sorted(set(truth), key=lambda t: (t.startswith("decoy"), t))
    xs = sorted(set(said), key=lambda s: (s in (R.NONE_FITS, R.REWARD_REGRESSION), s))
    counts = [[sum(1 for t, s in zip(truth, said) if t == y and s == x) for x in xs] for y in ys]
    return {"rows": ys, "columns": xs, "counts": counts}


def fingerprint(entry: R.Entry, settings: dict) -> str:
    """What a stored row must match to be reused on resume: the entry, the settings, the frozen decision thresholds
    (a row judged under other thresholds holds other answers) and the code version. The calibration's settings are
    left out: they do not change a row (and rows stored before they existed stay valid)."""
    own = {k: v for k, v in settings.items() if not k.startswith("calibration")}
    return _digest({"entry": [entry.name, entry.kind, entry.family, entry.task_options, entry.seed,
                              entry.truth.algorithm, entry.truth.params, entry.truth.target_layer],
                    "settings": own, "thresholds": thresholds(), "version": __version__})


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def calibration_block(out: Path, settings: dict, zoo_seed: int, progress: bool = False) -> dict | None:
    """The interval calibration by simulation (`zoo.calibration.calibrate`, docs/zoo.md "Calibration") at the
    settings' `calibration_replicates` per (teacher, noise), seeded with the zoo seed (a fresh zoo gets fresh
    replicates); None when the settings ask for none. Stored in `out`/calibration.json with a fingerprint (the
    calibration's settings, teachers and noise levels, the seed, the code version) and reused on resume when the
    fingerprint matches; a stale or unreadable one is recomputed."""
    from . import calibration as K

    replicates = int(settings.get("calibration_replicates") or 0)
    if replicates < 1:
        return None
    tasks = settings.get("calibration_tasks")
    effective = {**K.SETTINGS, "replicates": replicates, **({} if tasks is None else {"tasks": int(tasks)})}
    key = _digest({"settings": effective, "teachers": K.TEACHERS, "noises": K.NOISES, "seed": int(zoo_seed),
                   "version": __version__})
    path = out / CALIBRATION_FILE
    cal = stored_row(path, key)
    if cal is None or not isinstance(cal.get("summary"), dict) or not isinstance(cal.get("cells"), list):
        cal = {**K.calibrate(replicates, seed=zoo_seed, tasks=tasks, progress=progress), "fingerprint": key}
        write_json(path, cal)
    return {k: cal[k] for k in CALIBRATION_KEYS if k in cal}


def run(out, set_name: str = "default", zoo_seed: int = 0, progress: bool = True, only=None,
        settings: dict | None = None) -> dict:
    """Judge every entry of the set (or those named in `only`) into `out`/rows/, then write `out`/zoo.json;
    returns the zoo JSON. `settings` replaces the set's `SETTINGS` (tests run tiny ones)."""
    from tqdm import tqdm

    entries = R.entries(set_name, zoo_seed)
    if only is not None:
        unknown = sorted(set(only) - {e.name for e in entries})
        if unknown:
            raise UserError(f"no zoo entries named {', '.join(unknown)} in set {set_name!r}")
        entries = [e for e in entries if e.name in set(only)]
    settings = dict(SETTINGS[set_name] if settings is None else settings)
    frozen = thresholds()  # read before anything is scored
    out = Path(out)
    (out / "rows").mkdir(parents=True, exist_ok=True)
    rows, started = [], time.perf_counter()
    bar = tqdm(entries, desc=f"zoo {set_name} (seed {zoo_seed})", unit="model", disable=not progress)
    for entry in bar:
        bar.set_postfix_str(entry.name)
        path = out / "rows" / f"{entry.name}.json"
        key = fingerprint(entry, settings)
        row = stored_row(path, key)
        if row is None:
            row = {**judge(entry, settings), "fingerprint": key}
            write_json(path, row)
        rows.append(row)
    calibration = calibration_block(out, settings, zoo_seed, progress)  # its own resume: DIR/calibration.json
    result = {
        "schema": SCHEMA, "versions": {"icrl_interp": __version__, "numpy": np.__version__},
        "set": set_name, "zoo_seed": int(zoo_seed), "settings": settings, "thresholds": frozen,
        "providers": [m for m in R.PROVIDERS], "rows": rows, "summary": summarize(rows, calibration),
        "confusion": confusion(rows), "calibration": calibration,
        "seconds": round(time.perf_counter() - started, 1),
        "row_seconds": round(sum(r["seconds"] for r in rows), 1),  # wall time of the judging, resumed rows included
        "row_cpu_seconds": round(sum(r.get("cpu_seconds", math.nan) for r in rows), 1),  # NaN: an older row lacks it
    }
    write_json(out / "zoo.json", result)
    return result


def stored_row(path: Path, key: str) -> dict | None:
    """The row (or calibration) stored at `path` when its fingerprint is `key` (a resumed run reuses it), else
    None: also when the file is missing or unreadable."""
    try:
        row = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return row if isinstance(row, dict) and row.get("fingerprint") == key else None
