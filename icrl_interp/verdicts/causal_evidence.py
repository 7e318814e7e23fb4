"""The algorithm verdict with a model in hand: record it when needed, then add the causal evidence
(docs/verdict.md, "Causation").

`analyzers.verdict` judges a recording by behaviour and representation. With the model, each
candidate's probe direction at layer l (the ridge probe of its most selective internal quantity,
fitted on training tasks) is erased from the residual stream at the context columns of held-out
prompts (mean-ablation: `causal.projection_edit`), and the change of the model's output is compared
with the same erasure along random directions (`causal.random_directions`) and along the other
candidates' directions: per held-out task, the excess output change (candidate minus the mean of the
random directions, `causal.excess`), with a bootstrap interval over tasks.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..core.errors import UserError
from ..interventions import causal
from . import behaviour as V


def causation(model, *, roles: dict | None = None, draws: int = 16, max_tasks: int = 64, seed: int = 0,
              resamples: int = 1000, batch_size: int = 256, direction_seed: int | None = None,
              interchange: bool = False):
    """The `causation` callable of `verdicts.behaviour.run` for `model` (its resid_post per layer; [roles]
    for a model without TransformerLens hook names). `seed` draws the bootstrap resamples of the held-out
    tasks, `direction_seed` (default: `seed`) the random directions. With `interchange`, each layer's entry also
    holds `interchange` (docs/causal.md#interchange-interventions): per counterfactual kind the layout allows
    (one reward, one transition's successor), the held-out prompts' activation at the layer's context columns
    patched from the counterfactual, and each candidate's predicted output change for it (the candidate fitted
    to the model's output on the training prompts) scored by R^2, correlation and relative error over tasks."""
    from dataclasses import replace

    from ..interventions import interchange as ic
    from . import candidates as C

    direction_seed = seed if direction_seed is None else direction_seed
    fitted: dict = {}  # the candidates fitted once to the model's output on the training prompts (every layer's)

    def predictions(data: V.VerdictData, test: np.ndarray):
        """{name: (candidate, hyper, step)} fitted on the training prompts, or a reason string."""
        if "fits" not in fitted:
            try:
                tr = V.transitions(data)
                cands, _ = C.applicable(tr, None)
                train = np.nonzero(~test)[0]
                K = V.default_steps(len(data.readouts) or 1)
                fitted["fits"] = {c.name: (c, C.fit(c, tr.take(train), data.output[train][None], K)[0])
                                  for c in cands}
            except UserError as e:
                fitted["fits"] = str(e)
        return fitted["fits"]

    def interchanges(data: V.VerdictData, layer: int, runner, rows: np.ndarray, test: np.ndarray) -> dict:
        """The layer's interchange entry on the held-out prompts `rows` (one per task)."""
        fits = predictions(data, test)
        if isinstance(fits, str):
            return {"available": False, "reason": fits}
        out = {"available": True, "positions": "context", "n_tasks": int(rows.size)}
        z = data.z[rows]
        idx = np.random.default_rng([seed, layer, 0x1C4B]).integers(0, rows.size, size=(resamples, rows.size))
        sub = lambda zz: replace(data, z=zz, states=None if data.states is None else data.states[rows],  # noqa: E731
                                 policy=None if data.policy is None else data.policy[rows])
        for change in ic.CHANGES:
            if ("reward" if change == "reward" else "gamma_phi_next") not in data.layout.names:
                continue
            z_cf, _ = ic.counterfactual(z, data.layout, change, np.random.default_rng([seed, layer, 0x1C4A]))
            base, patched = ic.patched_outputs(runner, z, z_cf, np.arange(z.shape[1]) < z.shape[1] - 1)
            observed = patched - base
            tr0, tr1 = V.transitions(sub(z)), V.transitions(sub(z_cf))
            entry = {"observed_change": float(np.abs(observed).mean()), "candidates": {}}
            for name, (c, f) in fits.items():
                step = 0 if f.step is None else f.step
                pred = C.run(c, tr1, f.hyper, step).outputs[:, -1] - C.run(c, tr0, f.hyper, step).outputs[:, -1]
                entry["candidates"][name] = ic.agreement(observed, pred.reshape(observed.shape), idx)
            # the best R^2 among the candidates whose interval lies above 0 (an R^2 at or below 0 explains nothing)
            scores = {k: v["r2"]["mean"] for k, v in entry["candidates"].items()
                      if v["r2"]["mean"] is not None and v["r2"]["ci"] and v["r2"]["ci"][0] > 0}
            entry["top"] = max(scores, key=scores.get) if scores else None
            out[change] = entry
        return out

    def measure(data: V.VerdictData, layer: int, directions: dict, test: np.ndarray) -> dict:
        try:
            site = causal.site_of(model, layer, "resid_post", roles)
        except UserError as e:
            return {"available": False, "reason": str(e)}
        pos = data.z.shape[1]
        runner = causal.Runner(model, site, pos, data.output.shape[1], batch_size)
        idx = np.nonzero(test)[0]
        keep_tasks = np.unique(data.task_id[idx])[:max_tasks]
        idx = idx[np.isin(data.task_id[idx], keep_tasks)]
        train = ~test
        X = data.acts[layer][train].reshape(-1, data.acts[layer].shape[-1])
        z = data.z[idx]
        base, feats = runner.run(z, features=True)
        if feats.shape[-1] != X.shape[-1]:
            return {"available": False, "reason": f"the model's {site.canonical} has {feats.shape[-1]} features, "
                    f"the recording's {X.shape[-1]}"}

        def change(u: np.ndarray) -> np.ndarray:
            u = u / np.linalg.norm(u)
            out = runner.run(z, causal.projection_edit(u, float((X @ u).mean())))[0]
            return np.linalg.norm(causal.unchanged_within_rounding(out, base, runner.dtype) - base, axis=-1)

        names = sorted(directions)
        cand = np.stack([change(directions[c]) for c in names], 1)  # [prompts, C]
        G = causal.random_directions(X.shape[-1], draws, direction_seed, layer)
        rand = np.stack([change(g) for g in G], 1)  # [prompts, draws]
        uniq, inv = np.unique(data.task_id[idx], return_inverse=True)
        per_task = lambda a: np.stack([a[inv == t].mean(0) for t in range(uniq.size)])  # noqa: E731
        cand_t, rand_t = per_task(cand), per_task(rand)
        exc = np.stack([causal.excess(cand_t[:, i], rand_t) for i in range(len(names))], 1)  # [tasks, C]
        rng = np.random.default_rng([seed, layer, 0xC0A5])
        draw = rng.integers(0, uniq.size, size=(resamples, uniq.size))
        boot = exc[draw].mean(1)  # [resamples, C]
        mean = exc.mean(0)
        order = np.argsort(-mean, kind="stable")
        out = {"available": True, "site": site.canonical, "module": site.point, "method": "mean",
               "random_draws": int(draws), "n_tasks": int(uniq.size), "n_prompts": int(idx.size),
               "random_output_change": float(rand_t.mean()), "candidates": {}}
        for i, c in enumerate(names):
            ci = V.interval(boot[:, i])
            out["candidates"][c] = {"output_change": float(cand_t[:, i].mean()), "excess": float(mean[i]),
                                    "excess_ci": ci, "exceeds_random": bool(ci is not None and ci[0] > 0)}
        if not np.any(cand) and not np.any(rand):
            out["note"] = (f"no erasure at {site.canonical} changes the output: no later layer reads the edited "
                           "context columns (the last layer, or a site the output does not depend on)")
        top = names[order[0]]
        out["top"] = top if out["candidates"][top]["exceeds_random"] else None
        if len(names) > 1:
            out["top_margin"] = float(mean[order[0]] - mean[order[1]])
            out["top_margin_ci"] = V.interval(boot[:, order[0]] - boot[:, order[1]])
        if interchange:
            first = np.unique(data.task_id[idx], return_index=True)[1]  # one prompt per task: rows are tasks
            out["interchange"] = interchanges(data, layer, runner, idx[first], test)
        return out

    return measure


def verdict(source=None, *, model=None, task=None, task_options: dict | None = None, probe=None, tasks: int = 512,
            prompt_seed: int = 0, candidates=None, steps: int | None = None, test_fraction: float = 0.3,
            seed: int = 0, bootstrap: int = 1000, min_r2: float = 0.5, max_prompts: int = 1024,
            causal_draws: int = 16, causal_tasks: int = 64, causal: bool = True, label: str | None = None,
            baseline: str = "random-init", batch_size: int = 128, progress: bool = True,
            split_seed: int | None = None, direction_seed: int | None = None, ood: bool = True,
            fit_bootstrap: int = V.FIT_RESAMPLES) -> dict:
    """The verdict JSON (`icrl_interp.verdict/2`, docs/formats.md "Verdict JSON").

    `source`: a recording (.h5). With `model` (a torch module: one of the package's models or your own)
    the causal evidence is added (unless `causal` is False); without `source` the model is first recorded on
    `task` (a family name with `task_options`, or a checkpoint) like `icrl_interp.record`, with the probe spec
    `probe`, `baseline` (the random-init copy the probes compare with) and `batch_size`. `label` names the
    source in the JSON (default: the recording's path, or the model's class and task). Seeds: `prompt_seed`
    samples the tasks a model is recorded on, `split_seed` splits the recorded tasks and draws the bootstrap
    resamples, `direction_seed` draws the causal evidence's random directions; the last two default to `seed`.
    With `model`, the out-of-distribution checks (`verdicts.ood`; `ood=False` skips them) run the model on
    shifted held-out prompts, and a clear verdict whose checks fail is not clear. `fit_bootstrap`: refits on
    resampled training tasks for the fitted parameters' intervals. The other options are those of
    `verdicts.behaviour.run` and `causation`."""
    split_seed, direction_seed = (seed if s is None else s for s in (split_seed, direction_seed))
    if source is None and model is None:
        raise UserError("give a recording, or a model with its task")
    opts = dict(candidates=candidates, steps=steps, test_fraction=test_fraction, seed=split_seed, resamples=bootstrap,
                min_r2=min_r2, fit_resamples=fit_bootstrap)
    roles = None
    if model is not None and probe is not None:
        from ..recording.probe_spec import spec_for

        roles = dict(spec_for(model, probe).roles) or None
    if source is None:
        from ..recording.recorder import record_model

        if task is None:
            raise UserError("a model without a recording needs its task (a family name or a checkpoint)")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "verdict.h5"
            record_model(model, task, path, task_options=task_options, probe=probe, tasks=tasks,
                         batch_size=batch_size, seed=prompt_seed, baseline=baseline, progress=progress)
            data = V.load(path, max_prompts)
        data.source = label or f"{type(model).__name__} on {data.task_family or 'its task'}"
    else:
        data = V.load(source, max_prompts)
        data.source = label or data.source
    if model is not None and roles is None and data.roles:
        from ..recording.probe_spec import spec_for

        roles = dict(spec_for(model, data.roles).roles)  # the modules the recording's own spec mapped
    cause = None
    if model is not None and causal:
        _check_editable(model, data, roles)
        cause = causation(model, roles=roles, draws=causal_draws, max_tasks=causal_tasks, seed=split_seed,
                          resamples=bootstrap, batch_size=batch_size, direction_seed=direction_seed)
    out = V.run(data, causation=cause, progress=progress, **opts)
    out["settings"]["direction_seed"] = None if cause is None else int(direction_seed)
    if model is not None and ood:
        from ..analyzers import td_probe
        from . import ood as O

        test = td_probe.task_folds(data.task_id, split_seed, test_fraction, V.FOLDS) == V.FOLDS
        O.apply(out, O.check(out, data, _forward(model, roles, data.output.shape[1], batch_size), test, split_seed))
    return out


def _forward(model, roles: dict | None, width: int, batch_size: int):
    """z -> the model's output [B, k] on prompts z (any context length), read as the causal evidence reads it."""
    def forward(z: np.ndarray) -> np.ndarray:
        site = causal.site_of(model, 0, "resid_post", roles)
        return causal.Runner(model, site, z.shape[1], width, batch_size).run(z)[0]
    return forward


def _check_editable(model, data: V.VerdictData, roles: dict | None) -> None:
    """A model given for the causal evidence must be editable at the recorded layers: a model that is not
    (no TransformerLens hooks and no [roles]) is a one-line error, not a verdict silently without causation."""
    if not data.acts:
        return  # no layer has context activations: no probe direction to erase, nothing to edit
    try:
        causal.site_of(model, min(data.acts), "resid_post", roles)
    except UserError as e:
        raise UserError(f"cannot edit the model for the causal evidence: {e} (or skip the causal evidence: "
                        f"causal=False, --no-causal)") from None
