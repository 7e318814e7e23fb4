"""Out-of-distribution checks of a verdict (docs/verdict.md, "Out-of-distribution checks"): does the model keep
matching its fitted candidate when the prompts change in ways the candidate has an answer for?

On the held-out prompts, shifted: the rewards scaled by REWARD_SCALE; the context columns in a random order;
another discount (half the task's) where the prompts carry it (the gamma phi' block; the candidate's fitted
gamma' moves with it, gamma'_2 = gamma' gamma_2 / gamma, as it must for a model that reads the block), else
the rewards scaled by SMALL_SCALE instead; and fresh tasks with LONGER times the context (needs the task's
config: a recording of a task, or a model recorded here). Each shift: the held-out R^2 of the model's update
by the candidate's at its fitted step sizes, gamma' and step, against the frozen thresholds: at least OOD_MIN_R2
and at most OOD_MAX_DROP below the candidate's in-distribution R^2. A model that runs the algorithm keeps
matching it; a heuristic that happens to track it on the training distribution does not.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..core.errors import UserError
from . import behaviour as V
from . import candidates as C

OOD_MIN_R2 = 0.5
"""Held-out R^2 a shifted check needs (frozen before any zoo was scored)."""
OOD_MAX_DROP = 0.2
"""Largest fall of R^2 from the in-distribution one that still passes."""
REWARD_SCALE = 3.0
SMALL_SCALE = 0.25
LONGER = 2
MAX_PROMPTS = 256
"""Held-out prompts (or fresh tasks, for longer contexts) each check runs."""


def _scaled_rewards(z: np.ndarray, lay, k: float) -> np.ndarray:
    out = z.copy()
    out[..., lay.slice("reward")] *= k
    return out


def _shuffled(z: np.ndarray, rng) -> np.ndarray:
    out = z.copy()
    n = z.shape[1] - 1
    perm = np.argsort(rng.random((z.shape[0], n)), 1)
    out[:, :-1] = np.take_along_axis(z[:, :-1], perm[..., None], 1)
    return out


def shifts(data: V.VerdictData, idx: np.ndarray, seed: int) -> dict:
    """name -> (description, shifted VerdictData, the factor of the discount) or (description, why it does not
    apply, None)."""
    rng = np.random.default_rng([seed, 0x00D])
    lay, z = data.layout, data.z[idx]
    sub = replace(data, z=z, task_id=data.task_id[idx], readouts={}, output=data.output[idx], acts={},
                  baseline_acts={}, resid_last={}, notes=[],
                  states=None if data.states is None else data.states[idx],
                  policy=None if data.policy is None else data.policy[idx])
    out = {"reward_scale": (f"rewards x {REWARD_SCALE:g}", replace(sub, z=_scaled_rewards(z, lay, REWARD_SCALE)), 1.0),
           "shuffled_order": ("context columns in a random order", replace(sub, z=_shuffled(z, rng)), 1.0)}
    if "gamma_phi_next" in lay.names:
        g2 = data.gamma / 2
        zg = z.copy()
        zg[..., lay.slice("gamma_phi_next")] *= g2 / data.gamma
        out["gamma"] = (f"discount {g2:g} (half the task's)", replace(sub, z=zg, gamma=g2), g2 / data.gamma)
    else:
        out["reward_scale_small"] = (f"rewards x {SMALL_SCALE:g} (the prompts do not carry the discount)",
                                     replace(sub, z=_scaled_rewards(z, lay, SMALL_SCALE)), 1.0)
    n2 = LONGER * (z.shape[1] - 1)
    if data.config is None:
        out["longer_context"] = (f"{n2} context columns", "no task config to sample longer prompts from (a "
                                 "recording of a task, or a model recorded by the verdict, brings one)", None)
    else:
        cfg = replace(data.config, task=replace(data.config.task, n=n2))
        try:
            pb = cfg.sample(min(MAX_PROMPTS, idx.size), rng)
        except (UserError, ValueError) as e:
            out["longer_context"] = (f"{n2} context columns", f"cannot sample them: {e}", None)
        else:
            t = pb.tasks
            out["longer_context"] = (f"{n2} context columns", replace(
                sub, z=pb.prompt.z, layout=pb.prompt.layout, task_id=np.arange(pb.prompt.z.shape[0]),
                output=np.zeros((pb.prompt.z.shape[0], data.output.shape[1])), states=pb.prompt.states,
                policy=t.get("policy") if isinstance(t, dict) else None), 1.0)
    return out


def r2_update(y: np.ndarray, pred: np.ndarray, y0: np.ndarray) -> float | None:
    """1 - sum (y - pred)^2 / sum (y - y0 - mean)^2: the R^2 of the model's update by the candidate's."""
    u = y - y0
    sst = float(((u - u.mean(0)) ** 2).sum())
    if not np.isfinite(sst) or sst <= 0:
        return None
    r = 1.0 - float(((y - pred) ** 2).sum()) / sst
    return r if np.isfinite(r) else None


def passes(r2: float | None, r2_in: float | None) -> bool:
    """A shifted R^2 passes when it is at least OOD_MIN_R2 and at most OOD_MAX_DROP below the in-distribution one."""
    return bool(r2 is not None and r2_in is not None and r2 >= OOD_MIN_R2 and r2 >= r2_in - OOD_MAX_DROP)


def check(v: dict, data: V.VerdictData, forward, test: np.ndarray, seed: int) -> dict:
    """The OOD checks of verdict `v` (from `behaviour.run` on `data`): `forward(z)` -> the model's output [B, k].
    Returns the JSON of `verdict.ood`: thresholds, per shift {description, r2, passes} or {available: false,
    reason}, and `passes` (every available check passes; null when none is)."""
    name = v["verdict"].get("candidate")
    base = {"min_r2": OOD_MIN_R2, "max_drop": OOD_MAX_DROP}
    if name is None:
        return {**base, "available": False, "reason": "no candidate fits: nothing to check", "checks": {},
                "passes": None}
    c = C.CANDIDATES[name]
    b = v["output"]["behaviour"][name]
    hyper, step = dict(b["hyperparameters"]), b["step"]
    r2_in = b["r2"]
    idx = np.nonzero(test)[0][:MAX_PROMPTS]
    checks = {}
    for key, (desc, shifted, factor) in shifts(data, idx, seed).items():
        if isinstance(shifted, str):
            checks[key] = {"description": desc, "available": False, "reason": shifted}
            continue
        try:
            y = forward(shifted.z)
        except (UserError, RuntimeError, ValueError, IndexError) as e:
            checks[key] = {"description": desc, "available": False, "reason": f"the model does not run on them: {e}"}
            continue
        tr = V.transitions(shifted)
        h = {**hyper, "gamma": hyper["gamma"] * factor} if "gamma" in hyper else hyper
        y0 = C.td_lambda(tr, 0.0, 0).outputs[:, 0]
        with np.errstate(all="ignore"):
            pred = C.run(c, tr, h, step or 0).outputs[:, -1 if step is not None else 0]
        r2 = r2_update(y, pred, y0)
        checks[key] = {"description": desc, "available": True, "r2": r2, "passes": passes(r2, r2_in)}
    done = [k for k, c_ in checks.items() if c_["available"]]
    return {**base, "available": bool(done), "candidate": name, "r2_in_distribution": r2_in, "checks": checks,
            "passes": None if not done else all(checks[k]["passes"] for k in done)}


def apply(v: dict, ood: dict) -> None:
    """Put the OOD checks into verdict `v`: a clear verdict whose checks fail is not clear any more."""
    top = v["verdict"]
    top["ood"] = ood
    failed = [k for k, c in ood.get("checks", {}).items() if c.get("available") and not c["passes"]]
    if top["clear"] and failed:
        top["clear"] = False
        top["text"] += f"; not clear: the model stops matching it out of distribution ({', '.join(failed)})"
