"""Interchange interventions (docs/causal.md, "Interchange interventions"): does the model's activation at
(layer, positions) carry what a candidate algorithm says it should?

For each task a counterfactual prompt differs from the base prompt in one place (`counterfactual`): one
reward changed (by one standard deviation of the context's rewards), or one transition's successor replaced by
another column's. The model runs on the counterfactual, its activation at the site is captured, and patched
into the base run at the chosen positions (the context columns, the last column or all). The observed output
change (patched minus base) is compared with each candidate's predicted change for the same counterfactual: a
candidate is an array [N, k] or a callable (z_base, z_counterfactual) -> [N, k] supplied by the caller (the
interventions layer knows no candidate algorithms; `verdicts.causal_evidence` wires them in; the task's own
reference algorithm is always one, `reference`).

Agreement per candidate: R^2 of the observed change by the predicted one (no refit: 1 - SSE / SST) and their
Pearson correlation, each with a 95% bootstrap interval over tasks (one prompt per task). A model that runs the
candidate and carries its state at the site transfers the whole predicted change (R^2 near 1); patching only
part of the state (e.g. the context columns after an early layer, while the last column already moved) transfers
part of it, which the correlation still sees.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import UserError
from .sites import Runner, check_int, site_of
from .statistics import interval, num

CHANGES = ("reward", "transition")
"""What the counterfactual prompt changes: one reward, or one transition's successor."""
POSITIONS = ("context", "query", "all")
"""Where the counterfactual activation is patched into the base run."""


def counterfactual(z: np.ndarray, layout, change: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(z_cf, column [N]): z [N, pos, D] with, at one random context column j per prompt, the reward raised by the
    standard deviation of that prompt's context rewards (1 where they are all equal), or the successor features
    (block gamma_phi_next) replaced by those of another column k != j."""
    if change not in CHANGES:
        raise UserError(f"--interchange {change!r}: expected one of none, {', '.join(CHANGES)}")
    need = "reward" if change == "reward" else "gamma_phi_next"
    if need not in layout.names:
        raise UserError(f"--interchange {change}: the prompt layout has no {need} block ({', '.join(layout.names)})")
    N, pos = z.shape[:2]
    n = pos - 1
    if n < 2:
        raise UserError("--interchange needs at least 2 context columns")
    out = np.array(z, dtype=np.float64, copy=True)
    j = rng.integers(0, n, size=N)
    rows = np.arange(N)
    block = layout.slice(need)
    if change == "reward":
        r = out[:, :n, block][..., 0]
        sd = r.std(1)
        out[rows, j, block.start] += np.where(sd > 0, sd, 1.0)
    else:
        k = (j + rng.integers(1, n, size=N)) % n  # another column, uniformly
        out[rows, j, block] = z[rows, k, block]
    return out, j


def _mask(positions: str, pos: int) -> np.ndarray:
    if positions not in POSITIONS:
        raise UserError(f"interchange positions {positions!r}: expected one of {', '.join(POSITIONS)}")
    m = np.zeros(pos, dtype=bool)
    m[{"context": slice(0, pos - 1), "query": slice(pos - 1, pos), "all": slice(0, pos)}[positions]] = True
    return m


def patched_outputs(runner: Runner, z: np.ndarray, z_cf: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(base output [N, k], base output with the site's activation at positions `mask` [pos] taken from the run on
    z_cf), in batches of the runner. The hooks are removed and the model's mode restored (capture / intervene,
    eval_mode)."""
    import torch

    from ..models import user
    from ..models.modes import eval_mode
    from ..recording.capture import capture, intervene

    model, site = runner.model, runner.site
    if site.kind != "columns":
        raise UserError(f"interchange interventions patch one vector per position; {site.canonical} is not one")
    forward = (lambda x: model(x)) if runner.own else (lambda x: user.forward(model, x))
    keep = torch.from_numpy(mask)
    base, patched = [], []
    for lo in range(0, z.shape[0], runner.batch_size):
        x = torch.from_numpy(np.ascontiguousarray(z[lo: lo + runner.batch_size])).to(runner.device, runner.dtype)
        x_cf = torch.from_numpy(np.ascontiguousarray(z_cf[lo: lo + runner.batch_size])).to(runner.device, runner.dtype)
        seen: list = []
        with torch.no_grad(), eval_mode(model):
            with capture(model, {site.canonical: site.point}, lambda _n, t: seen.append(t.detach().clone())):
                forward(x_cf)
            if len(seen) != 1:
                raise UserError(f"{site.canonical} ({site.point}) fired {len(seen)} times in one forward pass")
            cf_act = seen[0]

            def patch(t, cf=cf_act):
                if t.shape != cf.shape:
                    raise UserError(f"{site.canonical} has shape {tuple(t.shape)} on the base prompts and "
                                    f"{tuple(cf.shape)} on the counterfactual ones")
                m = keep.to(t.device).reshape(1, -1, *([1] * (t.ndim - 2)))
                return torch.where(m, cf, t)

            y0 = forward(x)
            with intervene(model, site.point, patch):
                y1 = forward(x)
        base.append(runner.output(y0, x.shape[0]))
        patched.append(runner.output(y1, x.shape[0]))
    return np.concatenate(base, 0), np.concatenate(patched, 0)


def agreement(observed: np.ndarray, predicted: np.ndarray, idx: np.ndarray) -> dict:
    """R^2 of observed [N, k] by predicted [N, k] (1 - SSE / SST, SST about the observed mean; no refit), their
    Pearson correlation over all entries, and the relative error SSE / sum(predicted^2) (0: the whole predicted
    change transferred; 1: none of it, e.g. an observed change of 0, where R^2 and the correlation are undefined),
    with 95% intervals over the resampled rows idx [B, N]; `both_unchanged` when neither changes at all (they agree,
    and every statistic is undefined)."""
    o, p = np.asarray(observed, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    if o.shape != p.shape:
        raise UserError(f"a candidate's predicted change has shape {p.shape}, the observed change {o.shape}")

    def stats(oo, pp):  # [..., N, k] -> (r2, corr, relative error) over the last two axes
        oo, pp = oo.reshape(*oo.shape[:-2], -1), pp.reshape(*pp.shape[:-2], -1)
        oc, pc = oo - oo.mean(-1, keepdims=True), pp - pp.mean(-1, keepdims=True)
        sst, spp, sse, p2 = (oc ** 2).sum(-1), (pc ** 2).sum(-1), ((oo - pp) ** 2).sum(-1), (pp ** 2).sum(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            r2 = np.where(sst > 0, 1.0 - sse / sst, np.nan)
            corr = np.where((sst > 0) & (spp > 0), (oc * pc).sum(-1) / np.sqrt(sst * spp), np.nan)
            rel = np.where(p2 > 0, sse / p2, np.nan)
        return r2, corr, rel

    full, boot = stats(o, p), stats(o[idx], p[idx])
    names = ("r2", "correlation", "relative_error")
    out = {k: {"mean": num(v), "ci": interval(b)} for k, v, b in zip(names, full, boot)}
    out["predicted_change"] = float(np.abs(p).mean())
    out["both_unchanged"] = bool(not np.any(o) and not np.any(p))  # agreement where every statistic is undefined
    return out


def interchange(model, config, layer: int, predicted: dict | None = None, *, change: str = "reward",
                positions: str = "context", hook: str | None = None, roles: dict | None = None, probe=None,
                tasks: int = 128, seed: int = 0, bootstrap: int = 1000, batch_size: int = 256) -> dict:
    """The interchange section (docs/causal.md#interchange-interventions): `tasks` tasks of `config` (one prompt
    each, drawn with `seed`), each with a counterfactual prompt (`change`), patched at (`layer`, `hook`,
    `positions`; `roles` or a `probe` spec for a model of your own, as `causal_test`); the observed output change
    against each candidate's predicted change. `predicted`: {name:
    array [N, k] or callable(z_base, z_cf) -> [N, k]}; the task's reference algorithm is added as `reference`."""
    from ..models.construct import task_of

    config = task_of(config)
    if probe is not None and roles is None:
        from ..recording.probe_spec import spec_for

        roles = dict(spec_for(model, probe).roles) or None
    tasks = check_int("--tasks", tasks, 8)
    n_boot = check_int("--bootstrap", bootstrap, 10)
    site = site_of(model, layer, hook, roles)
    batch = config.sample(tasks, np.random.default_rng([check_int("--prompt-seed", seed), 0x7A5C]))
    z = np.asarray(batch.prompt.z, dtype=np.float64)
    z_cf, column = counterfactual(z, config.model.layout, change, np.random.default_rng([seed, 0x1C4A]))
    width = int(np.prod(np.asarray(batch.reference["output"]).shape[1:]))
    runner = Runner(model, site, z.shape[1], width, check_int("--batch-size", batch_size, 1))
    base, patched = patched_outputs(runner, z, z_cf, _mask(positions, z.shape[1]))
    observed = patched - base
    ref = lambda zz: np.asarray(config.reference(zz)["output"], dtype=np.float64).reshape(zz.shape[0], -1)  # noqa: E731
    cands = {"reference": ref(z_cf) - ref(z), **(predicted or {})}
    idx = np.random.default_rng([seed, 0x1C4B]).integers(0, tasks, size=(n_boot, tasks))
    out = {"change": change, "positions": positions, "layer": site.layer, "hook": site.canonical,
           "module": site.point, "tasks": tasks, "prompt_seed": int(seed), "bootstrap": n_boot,
           "changed_column": {"min": int(column.min()), "max": int(column.max())},
           "observed_change": float(np.abs(observed).mean()), "candidates": {}}
    for name, pred in cands.items():
        p = pred(z, z_cf) if callable(pred) else pred
        out["candidates"][name] = agreement(observed, np.asarray(p, dtype=np.float64).reshape(observed.shape)
                                            if np.size(p) == observed.size else np.asarray(p), idx)
    if not np.any(observed):
        out["note"] = (f"patching {positions} positions of {site.canonical} changed no output: nothing after the site "
                       "reads them (the last layer's context columns), so the agreement is undefined")
    return out
